#pragma once
// The DeepSeek sparse attention tests' data: per-batch query rows and keys (doubles rounded to
// T), laid out as BSND / TND queries and BSND / TND / PA_BSND keys (a shuffled block pool, NaN
// in every row no query may read, -1 past each batch's blocks in the table), and the index lists
// of sparse_flash_attention. The reference (tests/reference/dsa.hpp) reads the per-batch arrays.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "reference/dsa.hpp"
#include "support/cast.hpp"

namespace dsa_support {

using i32 = std::int32_t;
using support::rnd;
using support::z;

struct Case {
  std::string lq = "BSND", lkv = "BSND";
  int N1 = 4, N2 = 1, D = 512, Dr = 64;
  std::vector<int> qlen;
  std::vector<long> kvlen;
  int S1 = 0;    // BSND query rows (0: the longest qlen)
  long S2 = 0;   // BSND key rows (0: the longest kvlen)
  long bs = 16;  // PA_BSND block size
  long sbs = 1;  // sparse_block_size
  long K = 8;    // index slots (SFA) / sparse_count (indexer)
  bool causal = true, strict = true, pass_qlen = true, pass_kvlen = true;
  double scale = 0.0417;  // ~1 / sqrt(576)
  unsigned seed = 1;
  int ints = 0;  // > 0: integer data in [-ints, ints] (exact fp32 arithmetic)
};

template <class T>
struct Data {
  Case c;
  int B = 0, rows = 0;
  long nb = 0, maxb = 1;
  ref::dsa::Shape sh;
  std::vector<ref::dsa::Batch> bat;
  std::vector<int> row0;   // first query row of each batch
  std::vector<long> tok0;  // BSND / TND: first key row of each batch
  std::vector<T> q, qr, w, k, kr;
  std::vector<i32> bt, idx;
  std::vector<std::int64_t> aq, akv;

  explicit Data(const Case& cs) : c(cs) {
    B = static_cast<int>(c.qlen.size());
    sh.N1 = c.N1, sh.N2 = c.N2, sh.D = c.D, sh.Dr = c.Dr, sh.causal = c.causal;
    std::mt19937 rng(c.seed);
    std::normal_distribution<double> nd;
    std::uniform_int_distribution<int> ui(-std::max(1, c.ints), std::max(1, c.ints));
    auto draw = [&] { return c.ints > 0 ? static_cast<double>(ui(rng)) : rnd<T>(nd(rng)); };
    bat.resize(z(B));
    for (int b = 0; b < B; ++b) {
      auto& x = bat[z(b)];
      x.q_len = c.qlen[z(b)], x.kv_len = c.kvlen[z(b)];
      for (long e = 0; e < long{x.q_len} * c.N1 * c.D; ++e) x.q.push_back(draw());
      for (long e = 0; e < long{x.q_len} * c.N1 * c.Dr; ++e) x.qr.push_back(draw());
      for (long e = 0; e < long{x.q_len} * c.N1; ++e)
        x.w.push_back(c.ints > 0 ? static_cast<double>(ui(rng)) : rnd<T>(nd(rng)));
      for (long e = 0; e < x.kv_len * c.N2 * c.D; ++e) x.k.push_back(draw());
      for (long e = 0; e < x.kv_len * c.N2 * c.Dr; ++e) x.kr.push_back(draw());
      x.v = x.k;  // V is the key (MLA's latent)
    }
    if (c.S1 == 0)
      for (auto& x : bat) c.S1 = std::max(c.S1, x.q_len);
    if (c.S2 == 0)
      for (auto& x : bat) c.S2 = std::max(c.S2, x.kv_len);
    const bool qt = c.lq == "TND";
    for (int b = 0; b < B; ++b) {
      row0.push_back(qt ? (b ? row0.back() + c.qlen[z(b - 1)] : 0) : b * c.S1);
      aq.push_back(qt ? row0.back() + c.qlen[z(b)] : c.qlen[z(b)]);
    }
    rows = qt ? static_cast<int>(aq.back()) : B * c.S1;
    q = rows_of(c.N1 * c.D, [&](const ref::dsa::Batch& x) { return &x.q; });
    qr = rows_of(c.N1 * c.Dr, [&](const ref::dsa::Batch& x) { return &x.qr; });
    w = rows_of(c.N1, [&](const ref::dsa::Batch& x) { return &x.w; });
    lay_keys();
  }

  // Query-side rows [rows][width] (padded BSND rows NaN).
  template <class F>
  std::vector<T> rows_of(int width, F&& field) const {
    std::vector<T> out(z(long{rows} * width), T(NAN));
    for (int b = 0; b < B; ++b)
      for (long e = 0; e < long{bat[z(b)].q_len} * width; ++e)
        out[z(long{row0[z(b)]} * width + e)] = T(static_cast<float>((*field(bat[z(b)]))[z(e)]));
    return out;
  }

  long place(int b, long t) const {  // key row of token t of batch b
    if (c.lkv != "PA_BSND") return tok0[z(b)] + t;
    return long{bt[z(b * maxb + t / c.bs)]} * c.bs + t % c.bs;
  }

  void lay_keys() {
    long total = 0;
    for (int b = 0; b < B; ++b) {
      tok0.push_back(c.lkv == "TND" ? total : b * c.S2);
      total += bat[z(b)].kv_len;
      akv.push_back(c.lkv == "TND" ? total : bat[z(b)].kv_len);
    }
    long tokens = c.lkv == "TND" ? total : B * c.S2;
    if (c.lkv == "PA_BSND") {
      std::vector<long> need;
      for (auto& x : bat) need.push_back((x.kv_len + c.bs - 1) / c.bs);
      maxb = 1 + *std::max_element(need.begin(), need.end());
      for (long n : need) nb += n;
      nb += 2;  // spare blocks, never used
      std::vector<i32> pool(z(nb));
      std::iota(pool.begin(), pool.end(), 0);
      std::shuffle(pool.begin(), pool.end(), std::mt19937(c.seed + 7));
      bt.assign(z(B * maxb), -1);
      size_t next = 0;
      for (int b = 0; b < B; ++b)
        for (long j = 0; j < need[z(b)]; ++j) bt[z(b * maxb + j)] = pool[next++];
      tokens = nb * c.bs;
    }
    k.assign(z(tokens * c.N2 * c.D), T(NAN));
    kr.assign(z(tokens * c.N2 * c.Dr), T(NAN));
    for (int b = 0; b < B; ++b)
      for (long t = 0; t < bat[z(b)].kv_len; ++t) {
        const long r = place(b, t);
        for (long e = 0; e < long{c.N2} * c.D; ++e)
          k[z(r * c.N2 * c.D + e)] = T(static_cast<float>(bat[z(b)].k[z(t * c.N2 * c.D + e)]));
        for (long e = 0; e < long{c.N2} * c.Dr; ++e)
          kr[z(r * c.N2 * c.Dr + e)] = T(static_cast<float>(bat[z(b)].kr[z(t * c.N2 * c.Dr + e)]));
      }
  }

  // The key / key_rope shape of the layout with head size d.
  std::vector<long> kshape(int d) const {
    if (c.lkv == "TND") return {static_cast<long>(k.size() / z(long{c.N2} * c.D)), c.N2, d};
    if (c.lkv == "PA_BSND") return {nb, c.bs, c.N2, d};
    return {B, c.S2, c.N2, d};
  }
  std::vector<long> qshape(int d) const {
    if (c.lq == "TND") return {rows, c.N1, d};
    return {B, c.S1, c.N1, d};
  }

  // SFA index lists: per live row and key head a random choice of blocks (some past the row's
  // limit), shuffled, -1 after; `poison` blocks (one per batch with >= 3 blocks) never chosen
  // and NaN in the key tensors. Padded BSND rows hold garbage.
  void sfa_lists(double dup = 0.0) {
    std::mt19937 rng(c.seed + 13);
    std::uniform_real_distribution<double> u;
    idx.assign(z(long{rows} * c.N2 * c.K), 999999);
    for (int b = 0; b < B; ++b) {
      auto& x = bat[z(b)];
      const long nbk = (x.kv_len + c.sbs - 1) / c.sbs;
      const long poison = nbk >= 3 ? nbk / 2 : -1;
      if (poison >= 0)
        for (long t = poison * c.sbs; t < std::min(x.kv_len, (poison + 1) * c.sbs); ++t) {
          const long r = place(b, t);
          for (long e = 0; e < long{c.N2} * c.D; ++e) k[z(r * c.N2 * c.D + e)] = T(NAN);
          for (long e = 0; e < long{c.N2} * c.Dr; ++e) kr[z(r * c.N2 * c.Dr + e)] = T(NAN);
        }
      x.idx.assign(z(long{x.q_len} * c.N2 * c.K), -1);
      for (int i = 0; i < x.q_len; ++i)
        for (int g = 0; g < c.N2; ++g) {
          std::vector<i32> all;
          for (long j = 0; j < nbk; ++j)
            if (j != poison) all.push_back(static_cast<i32>(j));
          std::shuffle(all.begin(), all.end(), rng);
          const long m = std::min<long>(static_cast<long>(all.size()),
                                        static_cast<long>(u(rng) * static_cast<double>(c.K + 1)));
          std::vector<i32> pick(all.begin(), all.begin() + m);
          for (size_t e = 1; e < pick.size(); ++e)
            if (u(rng) < dup) pick[e] = pick[e - 1];
          pick.resize(z(c.K), -1);
          std::copy(pick.begin(), pick.end(), x.idx.begin() + (long{i} * c.N2 + g) * c.K);
          std::copy(pick.begin(), pick.end(),
                    idx.begin() + (long{row0[z(b)] + i} * c.N2 + g) * c.K);
        }
    }
  }

  // The reference SFA output [rows][N1][D] (padded rows 0).
  std::vector<double> sfa_expected() const {
    std::vector<double> out(z(long{rows} * c.N1 * c.D), 0.0);
    for (int b = 0; b < B; ++b) {
      const auto o = ref::dsa::sparse_attention(sh, bat[z(b)], c.K, c.sbs, c.scale);
      std::copy(o.begin(), o.end(), out.begin() + long{row0[z(b)]} * c.N1 * c.D);
    }
    return out;
  }
};

}  // namespace dsa_support
