#pragma once
// The harness of the NSA decode-step tests (decode_step_test.cpp, decode_step_rejects_test.cpp):
// a DCase, the Step problem (raw paged K / V, compressed paged K / V, gates, every output, the
// reference's batches), the gated sum called directly and a Tiny one-batch step.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/nsa/compress.hpp>
#include <attnref/nsa/decode_step.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "reference/nsa_select.hpp"
#include "support/cast.hpp"
#include "support/nsa_paged.hpp"

namespace decode_step_support {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::NsaDecodeInputs;
using attnref::NsaDecodeOutputs;
using attnref::NsaDecodeParams;
using attnref::StridedView;
using support::dbl;
using support::rnd;
using support::z;
using i32 = std::int32_t;
using i64 = std::int64_t;
using Shape = std::vector<Index>;

// ---------------------------------------------------------------------------------------------
// The harness: raw paged K / V, compressed paged K / V, gates, all outputs.
// ---------------------------------------------------------------------------------------------

struct DCase {
  std::string layout = "TND";  // TND or BSND
  int N = 4, KVN = 2, Dqk = 32, Dv = 32;
  long l = 32, d = 16, ls = 64, k = 2, w = 8;
  int pbs = 64, cpbs = 16;
  double scale = 0.2;
  bool strict = false;
  int S = 0;  // BSND q_S (0: the longest q_len)
  std::vector<int> qlen;
  std::vector<long> sel;
  unsigned seed = 3, perm_seed = 13;
  bool from_compress = false;  // compressed K / V = nsa_compress of the raw K / V
  bool poison_window = false;  // NaN in the raw rows below every token's window
};

template <class T>
struct Step {
  DCase c;
  int B = 0, S = 0, rows = 0, total = 0, mb = 1, nb = 0, cmb = 1, cnb = 0;
  std::vector<int> cu;
  std::vector<long> cmp;
  std::vector<std::vector<double>> rq, rk, rv, ck, cv;  // per batch, rounded to T
  std::vector<T> q, k, v, kc, vc;
  std::vector<i32> bt, cbt;
  std::vector<float> gates;
  std::vector<T> out, cmp_out, sel_out, win_out;
  std::vector<i32> topk;

  explicit Step(const DCase& cs) : c(cs) {
    B = static_cast<int>(c.sel.size());
    std::mt19937 rng(c.seed);
    std::normal_distribution<double> nd;
    std::uniform_real_distribution<double> u;
    cu = {0};
    for (int b = 0; b < B; ++b) {
      const int ql = c.qlen[z(b)];
      const long s = c.sel[z(b)];
      cu.push_back(cu.back() + ql);
      cmp.push_back(attnref::nsa_compressed_count(s, c.l, c.d));
      std::vector<double> x;
      for (long e = 0; e < ql * c.N * c.Dqk; ++e) x.push_back(rnd<T>(nd(rng)));
      rq.push_back(x), x.clear();
      for (long e = 0; e < s * c.KVN * c.Dqk; ++e) x.push_back(rnd<T>(nd(rng)));
      rk.push_back(x), x.clear();
      for (long e = 0; e < s * c.KVN * c.Dv; ++e) x.push_back(rnd<T>(nd(rng)));
      rv.push_back(x), x.clear();
      for (long e = 0; e < cmp.back() * c.KVN * c.Dqk; ++e) x.push_back(rnd<T>(nd(rng)));
      ck.push_back(x), x.clear();
      for (long e = 0; e < cmp.back() * c.KVN * c.Dv; ++e) x.push_back(rnd<T>(nd(rng)));
      cv.push_back(x);
    }
    total = cu.back();
    S = c.S;
    if (S == 0)
      for (int ql : c.qlen) S = std::max(S, ql);
    rows = c.layout == "TND" ? total : B * S;
    if (c.from_compress) compress_raw(rng);
    q.assign(z(rows * c.N * c.Dqk), T(NAN));
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < c.qlen[z(b)]; ++i)
        for (int e = 0; e < c.N * c.Dqk; ++e)
          q[z(row(b, i) * c.N * c.Dqk + e)] =
              T(static_cast<float>(rq[z(b)][z(i * c.N * c.Dqk + e)]));
    // Raw cache (NaN past each length, in spare blocks and, if asked, below the windows).
    std::vector<long> lo(z(B), 0);
    if (c.poison_window)
      for (int b = 0; b < B; ++b) lo[z(b)] = std::max(0L, c.sel[z(b)] - c.qlen[z(b)] - c.w + 1);
    auto rows_of = [](const std::vector<std::vector<double>>& x) {
      return [&x](size_t b) -> const std::vector<double>& { return x[b]; };
    };
    auto raw = support::page_tokens<T>(c.sel, c.pbs, c.KVN * c.Dqk, c.KVN * c.Dv, rows_of(rk),
                                       rows_of(rv), 3, c.perm_seed, lo);
    k = std::move(raw.k), v = std::move(raw.v), bt = std::move(raw.table);
    mb = raw.max_blocks, nb = raw.blocks;
    auto paged = support::page_tokens<T>(cmp, c.cpbs, c.KVN * c.Dqk, c.KVN * c.Dv, rows_of(ck),
                                         rows_of(cv), 2, c.perm_seed + 1);
    kc = std::move(paged.k), vc = std::move(paged.v), cbt = std::move(paged.table);
    cmb = paged.max_blocks, cnb = paged.blocks;
    gates.resize(z(rows * c.N * 3));
    for (float& g : gates) g = static_cast<float>(u(rng));
    out.assign(z(rows * c.N * c.Dv), T(-777.0f));
    cmp_out = sel_out = win_out = std::vector<T>(out.size(), T(-555.0f));
    topk.assign(z(rows * c.KVN * c.k), 12345);
  }

  // Compressed K / V made from the raw ones by nsa_compress (TND over all batches).
  void compress_raw(std::mt19937& rng) {
    std::normal_distribution<double> nd;
    std::vector<i64> cum;
    long t = 0;
    for (long s : c.sel) cum.push_back(t += s);
    long tc = 0;
    for (long x : cmp) tc += x;
    attnref::NsaCompressParams p;
    p.compress_block_size = c.l, p.compress_stride = c.d, p.strict = false;
    for (int pass = 0; pass < 2; ++pass) {
      const int D = pass == 0 ? c.Dqk : c.Dv;
      const auto& raw = pass == 0 ? rk : rv;
      auto& dst = pass == 0 ? ck : cv;
      std::vector<T> x, w(z(c.l * c.KVN)), o(z(std::max(1L, tc) * c.KVN * D));
      for (const auto& r : raw)
        for (double e : r) x.push_back(T(static_cast<float>(e)));
      for (T& e : w) e = T(static_cast<float>(0.2 * nd(rng)));
      if (x.empty()) x.push_back(T(0.0f));
      attnref::nsa_compress<T>(p, StridedView<const T>(x.data(), {t, c.KVN, D}),
                               StridedView<const T>(w.data(), {c.l, c.KVN}), cum,
                               StridedView<T>(o.data(), {tc, c.KVN, D}));
      long at = 0;
      for (int b = 0; b < B; ++b) {
        dst[z(b)].clear();
        for (long e = 0; e < cmp[z(b)] * c.KVN * D; ++e) dst[z(b)].push_back(dbl(o[z(at + e)]));
        at += cmp[z(b)] * c.KVN * D;
      }
    }
  }

  int row(int b, int i) const { return c.layout == "TND" ? cu[z(b)] + i : b * S + i; }
  Shape lay(Index heads, Index last) const {
    return c.layout == "TND" ? Shape{total, heads, last} : Shape{B, S, heads, last};
  }
  NsaDecodeParams params() const {
    NsaDecodeParams p;
    p.num_heads = c.N, p.num_key_value_heads = c.KVN;
    p.compress_block_size = c.l, p.compress_block_stride = c.d;
    p.select_block_size = c.ls, p.select_block_count = c.k, p.window_size = c.w;
    p.page_block_size = c.pbs, p.cmp_page_block_size = c.cpbs;
    p.scale_value = c.scale, p.layout = c.layout, p.strict = c.strict;
    return p;
  }
  NsaDecodeInputs<T> inputs() const {
    NsaDecodeInputs<T> in;
    in.query = StridedView<const T>(q.data(), lay(c.N, c.Dqk));
    in.key = StridedView<const T>(k.data(), {nb, c.pbs, c.KVN * c.Dqk});
    in.value = StridedView<const T>(v.data(), {nb, c.pbs, c.KVN * c.Dv});
    in.block_table = StridedView<const i32>(bt.data(), {B, mb});
    in.cmp_key = StridedView<const T>(kc.data(), {cnb, c.cpbs, c.KVN * c.Dqk});
    in.cmp_value = StridedView<const T>(vc.data(), {cnb, c.cpbs, c.KVN * c.Dv});
    in.cmp_block_table = StridedView<const i32>(cbt.data(), {B, cmb});
    in.gates = StridedView<const float>(gates.data(), {rows, c.N, 3});
    for (int b = 0; b < B; ++b) {
      in.actual_q_seq_len.push_back(c.qlen[z(b)]);
      in.actual_sel_kv_seq_len.push_back(c.sel[z(b)]);
    }
    return in;
  }
  NsaDecodeOutputs<T> outputs(bool all = true) {
    NsaDecodeOutputs<T> o;
    o.output = StridedView<T>(out.data(), lay(c.N, c.Dv));
    if (all) {
      o.topk = StridedView<i32>(topk.data(), lay(c.KVN, c.k));
      o.cmp_out = StridedView<T>(cmp_out.data(), lay(c.N, c.Dv));
      o.sel_out = StridedView<T>(sel_out.data(), lay(c.N, c.Dv));
      o.win_out = StridedView<T>(win_out.data(), lay(c.N, c.Dv));
    }
    return o;
  }
  void run(int threads = 0, bool all = true) {
    attnref::nsa_decode_step(params(), inputs(), outputs(all), {threads});
  }
  void run_window(int threads = 0) {
    attnref::nsa_sliding_window_attention(
        params(), inputs(), {StridedView<T>(win_out.data(), lay(c.N, c.Dv))}, {threads});
  }
  // Live rows of a [rows, N, Dv] buffer, batch / token order.
  std::vector<double> live(const std::vector<T>& x) const {
    std::vector<double> r;
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < c.qlen[z(b)]; ++i)
        for (int e = 0; e < c.N * c.Dv; ++e) r.push_back(dbl(x[z(row(b, i) * c.N * c.Dv + e)]));
    return r;
  }
  // Padded BSND rows of a [rows, N, Dv] buffer are exactly 0.
  ::testing::AssertionResult padded_zero(const std::vector<T>& x) const {
    if (c.layout == "TND") return ::testing::AssertionSuccess();
    for (int b = 0; b < B; ++b)
      for (int i = c.qlen[z(b)]; i < S; ++i)
        for (int e = 0; e < c.N * c.Dv; ++e)
          if (dbl(x[z(row(b, i) * c.N * c.Dv + e)]) != 0.0)
            return ::testing::AssertionFailure() << "padded row b " << b << " i " << i;
    return ::testing::AssertionSuccess();
  }
  ref::nsa_select::Problem sel_problem() const {
    ref::nsa_select::Problem p;
    p.N = c.N, p.KVN = c.KVN, p.Dqk = c.Dqk, p.Dv = c.Dv, p.scale = c.scale;
    p.ls = c.ls, p.k = c.k;
    return p;
  }
  // The reference batch of the raw cache (top-k from `tk`, laid out like topk).
  ref::nsa_select::Batch sel_batch(int b, const std::vector<i32>& tk) const {
    ref::nsa_select::Batch x;
    x.q_len = c.qlen[z(b)], x.sel = c.sel[z(b)], x.q = rq[z(b)], x.k = rk[z(b)], x.v = rv[z(b)];
    for (int i = 0; i < x.q_len; ++i)
      for (long e = 0; e < c.KVN * c.k; ++e) x.topk.push_back(tk[z(row(b, i) * c.KVN * c.k + e)]);
    return x;
  }
  std::vector<double> ref_window() const {
    std::vector<double> r;
    for (int b = 0; b < B; ++b) {
      const auto o = ref::nsa_select::window(sel_problem(), sel_batch(b, topk), c.w);
      r.insert(r.end(), o.begin(), o.end());
    }
    return r;
  }
};

template <class T>
void gated(const std::vector<float>& g, const std::vector<T>& a, const std::vector<T>& b,
           const std::vector<T>& c, std::vector<T>& o, const Shape& s, const Shape& gs) {
  attnref::nsa_gated_sum<T>(StridedView<const float>(g.data(), gs),
                            StridedView<const T>(a.data(), s), StridedView<const T>(b.data(), s),
                            StridedView<const T>(c.data(), s), StridedView<T>(o.data(), s));
}

using DP = NsaDecodeParams;
using DIn = NsaDecodeInputs<half>;
using DOut = NsaDecodeOutputs<half>;

// A tiny step for the overlap and padding rules: one batch, TND, N = KV_N = 1, D 16, sel 64.
struct Tiny {
  static constexpr Index D = 16;
  std::vector<half> q = std::vector<half>(2 * D, half(0.5f)),
                    k = std::vector<half>(64 * D, half(0.1f)),
                    v = std::vector<half>(64 * D, half(1.0f)),
                    kc = std::vector<half>(16 * D, half(0.1f)),
                    vc = std::vector<half>(16 * D, half(2.0f));
  std::vector<i32> bt{0}, cbt{0};
  std::vector<float> gates{0.25f, 0.25f, 0.5f, NAN, NAN, NAN};
  DP p;
  DIn in;
  Tiny() {
    p.compress_block_size = 32, p.compress_block_stride = 16, p.select_block_size = 64;
    p.select_block_count = 1, p.window_size = 4, p.page_block_size = 64;
    p.cmp_page_block_size = 16, p.strict = false;
    in.query = StridedView<const half>(q.data(), {1, 1, D});
    in.key = StridedView<const half>(k.data(), {1, 64, D});
    in.value = StridedView<const half>(v.data(), {1, 64, D});
    in.block_table = StridedView<const i32>(bt.data(), {1, 1});
    in.cmp_key = StridedView<const half>(kc.data(), {1, 16, D});
    in.cmp_value = StridedView<const half>(vc.data(), {1, 16, D});
    in.cmp_block_table = StridedView<const i32>(cbt.data(), {1, 1});
    in.gates = StridedView<const float>(gates.data(), {1, 1, 3});
    in.actual_sel_kv_seq_len = {64};
  }
};

}  // namespace decode_step_support
