// FusedInferAttentionScore's rope inputs (query_rope / key_rope): the score
// scale · (q·k + q_rope·k_rope). MLA (head size 512 + 64 over a paged latent cache) in every
// layout, with one query row (sparse_mode 0) and several (MTP, sparse_mode 3, rightDownCausal)
// against the independent reference on the concatenated heads (tests/reference/
// naive_attention.hpp); metamorphic: MLA with Q_S 1 == ATB's mla_decode on the concatenated
// cache bit for bit, head size 128 + 64 (TND) == FIA on concatenated 192-wide heads bit for bit
// (output and softmax_lse), and thread counts give the same bits. The contract's rejections
// leave the output untouched.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <attnref/cann/fused_infer_attention_score.hpp>
#include <attnref/mla/mla_attention.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/naive_attention.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"

namespace fia_rope_test {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::StridedView;
using Shape = std::vector<Index>;

constexpr int kD = 512, kR = 64;

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// One MLA call: query rows (B x Q_S, or TND per-batch lengths), a paged latent cache with a
// shuffled block table (-1 past each sequence's blocks), kv lengths.
struct MlaCase {
  std::string layout = "BSND";
  std::vector<int> ql{1, 1, 1}, kvl{70, 0, 129};  // TND: per-batch query lengths
  int N = 8, bs = 16;
  bool rank4 = false;  // the cache as [blockNum, 1, blockSize, D] (BNSD / TND query)
  unsigned seed = 1;
  double scale = 0.0625;
  int pre = 0;  // > 0: sparse_mode 4 (the sliding window) with pre_tokens `pre`
  int S = 0;    // > 0 (sliding window): Q_S, the batches' rows ql (actual_seq_lengths) below it
  bool contiguous = false;  // (sliding window) the cache as [B, S2, 1, D] tensors, no table
  int B() const { return static_cast<int>(ql.size()); }
  int qs() const { return S > 0 ? S : ql[0]; }  // non-TND: Q_S
  bool tnd() const { return layout == "TND"; }
  int sparse() const { return pre > 0 ? 4 : tnd() ? 3 : (qs() > 1 ? 3 : 0); }
};

template <class T>
struct Mla {
  MlaCase c;
  int T_ = 0, maxb = 0, nb = 0;
  std::vector<int> qcu;
  std::vector<T> q, qr, kc, vc, krc;  // query / query_rope in the layout; caches
  std::vector<std::int32_t> table;
  std::vector<std::uint8_t> mask;
  std::vector<T> out;

  explicit Mla(const MlaCase& cs) : c(cs) {
    std::mt19937 rng(c.seed);
    qcu.push_back(0);
    for (int l : c.ql) qcu.push_back(qcu.back() + l);
    T_ = qcu.back();
    for (int l : c.kvl) maxb = std::max(maxb, (l + c.bs - 1) / c.bs);
    maxb += 1;  // a -1 column past the longest sequence
    for (int l : c.kvl) nb += (l + c.bs - 1) / c.bs;
    nb += 2;  // blocks nobody references
    std::vector<std::int32_t> ids(static_cast<size_t>(nb));
    for (int i = 0; i < nb; ++i) ids[static_cast<size_t>(i)] = i;
    std::shuffle(ids.begin(), ids.end(), rng);
    table.assign(static_cast<size_t>(c.B() * maxb), -1);
    size_t next = 0;
    for (int b = 0; b < c.B(); ++b)
      for (int j = 0; j < (c.kvl[static_cast<size_t>(b)] + c.bs - 1) / c.bs; ++j)
        table[static_cast<size_t>(b * maxb + j)] = ids[next++];
    const size_t rows = static_cast<size_t>(c.tnd() ? T_ : c.B() * c.qs()) * c.N;
    q = support::randn<T>(rows * kD, rng);
    qr = support::randn<T>(rows * kR, rng);
    kc = support::randn<T>(static_cast<size_t>(nb * c.bs) * kD, rng);
    vc = support::randn<T>(static_cast<size_t>(nb * c.bs) * kD, rng);
    krc = support::randn<T>(static_cast<size_t>(nb * c.bs) * kR, rng);
    if (c.sparse() >= 3) mask.assign(2048 * 2048, 0);  // (its content is not read)
    out.assign(rows * kD, T(-3.0f));
    if (c.contiguous) {  // the same rows in [B, S2, 1, D] tensors, NaN past each sequence
      for (int l : c.kvl) S2 = std::max(S2, l + 2);
      const size_t n = static_cast<size_t>(c.B() * S2);
      kcc.assign(n * kD, T(NAN)), vcc.assign(n * kD, T(NAN)), krcc.assign(n * kR, T(NAN));
      for (int b = 0; b < c.B(); ++b)
        for (int t = 0; t < c.kvl[static_cast<size_t>(b)]; ++t) {
          const size_t to = static_cast<size_t>(b * S2 + t);
          std::copy_n(kc.begin() + static_cast<long>(row(b, t) * kD), kD,
                      kcc.begin() + static_cast<long>(to * kD));
          std::copy_n(vc.begin() + static_cast<long>(row(b, t) * kD), kD,
                      vcc.begin() + static_cast<long>(to * kD));
          std::copy_n(krc.begin() + static_cast<long>(row(b, t) * kR), kR,
                      krcc.begin() + static_cast<long>(to * kR));
        }
    }
  }
  int S2 = 0;
  std::vector<T> kcc, vcc, krcc;  // the contiguous cache
  // Element offset of (b, i, h) of a [.., width] query-shaped tensor in the layout.
  size_t at(int b, int i, int h, int width) const {
    const int S = c.qs(), N = c.N;
    if (c.tnd()) return static_cast<size_t>(((qcu[static_cast<size_t>(b)] + i) * N + h) * width);
    if (c.layout == "BNSD") return static_cast<size_t>(((b * N + h) * S + i) * width);
    return static_cast<size_t>(((b * S + i) * N + h) * width);  // BSH, BSND
  }
  Shape qshape(int width) const {
    if (c.tnd()) return {T_, c.N, width};
    if (c.layout == "BSH") return {c.B(), c.qs(), c.N * width};
    if (c.layout == "BNSD") return {c.B(), c.N, c.qs(), width};
    return {c.B(), c.qs(), c.N, width};
  }
  Shape cshape(int width) const {
    return c.rank4 ? Shape{nb, 1, c.bs, width} : Shape{nb, c.bs, width};
  }
  attnref::FusedInferAttentionScoreParams params() const {
    attnref::FusedInferAttentionScoreParams p;
    p.num_heads = c.N;
    p.num_key_value_heads = 1;
    p.scale_value = c.scale;
    p.input_layout = c.layout;
    p.sparse_mode = c.sparse();
    p.block_size = c.bs;
    if (c.pre > 0) p.pre_tokens = c.pre, p.next_tokens = 0;
    return p;
  }
  attnref::FusedInferAttentionScoreInputs<T> inputs() const {
    attnref::FusedInferAttentionScoreInputs<T> in;
    in.query = StridedView<const T>(q.data(), qshape(kD));
    in.query_rope = StridedView<const T>(qr.data(), qshape(kR));
    in.key = {StridedView<const T>(kc.data(), cshape(kD))};
    in.value = {StridedView<const T>(vc.data(), cshape(kD))};
    in.key_rope = StridedView<const T>(krc.data(), cshape(kR));
    in.block_table = StridedView<const std::int32_t>(table.data(), {c.B(), maxb});
    in.actual_seq_lengths_kv.assign(c.kvl.begin(), c.kvl.end());
    if (c.tnd()) in.actual_seq_lengths.assign(qcu.begin() + 1, qcu.end());
    if (c.S > 0) in.actual_seq_lengths.assign(c.ql.begin(), c.ql.end());
    if (c.contiguous) {
      in.key = {StridedView<const T>(kcc.data(), {c.B(), S2, 1, kD})};
      in.value = {StridedView<const T>(vcc.data(), {c.B(), S2, 1, kD})};
      in.key_rope = StridedView<const T>(krcc.data(), {c.B(), S2, 1, kR});
      in.block_table = {};
    }
    if (!mask.empty()) in.atten_mask = StridedView<const std::uint8_t>(mask.data(), {2048, 2048});
    return in;
  }
  attnref::FusedInferAttentionScoreOutputs<T> outputs() {
    return {StridedView<T>(out.data(), qshape(kD))};
  }
  void run(const attnref::ExecConfig& ex = {}) {
    attnref::fused_infer_attention_score(params(), inputs(), outputs(), ex);
  }
  // Latent row t of sequence b (its cache row index).
  size_t row(int b, int t) const {
    return static_cast<size_t>(table[static_cast<size_t>(b * maxb + t / c.bs)] * c.bs + t % c.bs);
  }

  // The reference on concatenated 576-wide heads; max scaled error of the written output.
  double error() const {
    ref::Problem pr;
    pr.num_heads = c.N;
    pr.num_kv_heads = 1;
    pr.head_size = kD + kR;
    pr.v_head_size = kD;
    pr.scale = c.scale;
    pr.causal = c.sparse() >= 3 ? ref::Causal::kBottomRight : ref::Causal::kNone;
    pr.window = c.pre > 0 ? c.pre + 1 : 0;  // keys [i' - pre, i'], i' = i + kv - q
    ref::Seqs qs, ks, vs;
    for (int b = 0; b < c.B(); ++b) {
      const int ql = c.ql[static_cast<size_t>(b)], kl = c.kvl[static_cast<size_t>(b)];
      pr.q_len.push_back(ql);
      pr.kv_len.push_back(kl);
      std::vector<double> qb, kb, vb;
      for (int i = 0; i < ql; ++i)
        for (int h = 0; h < c.N; ++h) {
          for (int e = 0; e < kD; ++e) qb.push_back(double(float(q[at(b, i, h, kD) + z(e)])));
          for (int e = 0; e < kR; ++e) qb.push_back(double(float(qr[at(b, i, h, kR) + z(e)])));
        }
      for (int t = 0; t < kl; ++t) {
        for (int e = 0; e < kD; ++e) kb.push_back(double(float(kc[row(b, t) * kD + z(e)])));
        for (int e = 0; e < kR; ++e) kb.push_back(double(float(krc[row(b, t) * kR + z(e)])));
        for (int e = 0; e < kD; ++e) vb.push_back(double(float(vc[row(b, t) * kD + z(e)])));
      }
      qs.push_back(qb), ks.push_back(kb), vs.push_back(vb);
    }
    const ref::Result want = ref::attention(pr, qs, ks, vs);
    const double rel = std::is_same_v<T, bfloat16> ? 1.0 / 128 : 1.0 / 1024;
    double worst = 0;
    for (int b = 0; b < c.B(); ++b)
      for (int i = 0; i < c.ql[static_cast<size_t>(b)]; ++i)
        for (int h = 0; h < c.N; ++h)
          for (int e = 0; e < kD; ++e) {
            const double w = want.o[static_cast<size_t>(b)][z((i * c.N + h) * kD + e)];
            const double g = double(float(out[at(b, i, h, kD) + z(e)]));
            worst = std::max(worst, std::abs(g - w) / (1e-4 + rel * std::abs(w)));
          }
    return worst;  // <= 1: within tolerance
  }
  static size_t z(int e) { return static_cast<size_t>(e); }
};

std::vector<MlaCase> mla_cases() {
  std::vector<MlaCase> v;
  for (const char* lay : {"BSH", "BSND", "BNSD"}) {
    MlaCase d;  // decode: Q_S 1, sparse 0, an empty sequence
    d.layout = lay;
    v.push_back(d);
    MlaCase m;  // MTP: Q_S 3, rightDownCausal; a sequence shorter than Q_S (rows without keys)
    m.layout = lay;
    m.ql = {3, 3, 3};
    m.kvl = {2, 131, 40};
    m.bs = 128;
    m.N = 16;
    m.seed = 7;
    m.rank4 = std::string(lay) == "BNSD";
    v.push_back(m);
  }
  MlaCase t;  // TND, per-batch query lengths 0–16
  t.layout = "TND";
  t.ql = {1, 16, 0, 5};
  t.kvl = {33, 40, 7, 3};
  t.N = 4;
  t.seed = 9;
  v.push_back(t);
  MlaCase t4 = t;
  t4.rank4 = true;
  t4.bs = 128;
  v.push_back(t4);
  MlaCase g128;  // 128 query heads on the one latent head (DeepSeek without tensor parallelism)
  g128.N = 128;
  g128.ql = {1, 1};
  g128.kvl = {37, 16};
  v.push_back(g128);
  return v;
}

template <class T>
void mla_against_reference() {
  for (const MlaCase& c : mla_cases()) {
    Mla<T> m(c);
    m.run();
    EXPECT_LE(m.error(), 1.0) << c.layout << " Q_S " << c.qs() << " N " << c.N;
  }
}

TEST(FiaRope, MlaMatchesTheReferenceBf16) { mla_against_reference<bfloat16>(); }
TEST(FiaRope, MlaMatchesTheReferenceF16) { mla_against_reference<half>(); }

TEST(FiaRope, MlaDecodeEqualsAtbMlaDecodeOnTheConcatenatedCacheBitForBit) {
  MlaCase c;
  c.ql = {1, 1, 1, 1};
  c.kvl = {300, 1, 0, 129};
  c.N = 16;
  c.bs = 128;
  Mla<bfloat16> m(c);
  m.run();
  // The same problem as ATB's MLA decode reads it: q = [q | q_rope], cache rows [k | k_rope].
  std::vector<bfloat16> q, cache;
  for (size_t r = 0; r < m.q.size() / kD; ++r) {
    q.insert(q.end(), m.q.begin() + static_cast<long>(r * kD),
             m.q.begin() + static_cast<long>((r + 1) * kD));
    q.insert(q.end(), m.qr.begin() + static_cast<long>(r * kR),
             m.qr.begin() + static_cast<long>((r + 1) * kR));
  }
  for (size_t r = 0; r < m.kc.size() / kD; ++r) {  // (the value cache is the key cache there)
    cache.insert(cache.end(), m.kc.begin() + static_cast<long>(r * kD),
                 m.kc.begin() + static_cast<long>((r + 1) * kD));
    cache.insert(cache.end(), m.krc.begin() + static_cast<long>(r * kR),
                 m.krc.begin() + static_cast<long>((r + 1) * kR));
  }
  m.vc = m.kc;
  m.run();
  attnref::MlaDecodeParams p;
  p.scale = c.scale;
  attnref::MlaDecodeInputs<bfloat16> in;
  const Index B = c.B(), H = c.N;
  in.q = StridedView<const bfloat16>(q.data(), {B, H, kD + kR});
  in.kv_cache = StridedView<const bfloat16>(cache.data(), {m.nb, c.bs, 1, kD + kR});
  in.block_table = StridedView<const std::int32_t>(m.table.data(), {B, m.maxb});
  in.context_lens.assign(c.kvl.begin(), c.kvl.end());
  std::vector<bfloat16> o(static_cast<size_t>(B * H * kD));
  attnref::mla_decode(
      p, in, attnref::MlaDecodeOutputs<bfloat16>{StridedView<bfloat16>(o.data(), {B, H, kD})});
  EXPECT_TRUE(same_bits(o, m.out));
  EXPECT_LE(m.error(), 1.0);
}

// sparse_mode 4 (BSND, 128 heads): row i sees keys [i + kv - Q_S - pre, i + kv - Q_S].
TEST(FiaRope, MlaSlidingWindowMatchesTheReference) {
  unsigned seed = 60;
  // (Q_S, block size, pre_tokens): a window of two keys, one inside the blocks, one wider than
  // every sequence
  for (const auto& [qs, bs, pre] :
       {std::array<int, 3>{1, 64, 20}, std::array<int, 3>{3, 128, 1},
        std::array<int, 3>{3, 64, 2048}, std::array<int, 3>{1, 128, 1}}) {
    MlaCase c;
    c.N = 128;
    c.ql.assign(3, qs);
    c.kvl = {70, 3, 200};
    c.bs = bs;
    c.pre = pre;
    c.seed = seed++;
    Mla<bfloat16> m(c);
    m.run();
    EXPECT_LE(m.error(), 1.0) << "Q_S " << qs << " bs " << bs << " pre " << pre;
  }
}

// The sliding window with query lengths below Q_S (rows past them 0, the window anchored at each
// batch's own last row) and over contiguous BSND tensors (== the paged cache, bit for bit).
TEST(FiaRope, MlaSlidingWindowShortRowsAndContiguousCache) {
  MlaCase c;
  c.N = 128;
  c.S = 4;
  c.ql = {4, 1, 3};
  c.kvl = {70, 3, 200};
  c.bs = 64;
  c.pre = 5;
  c.seed = 66;
  Mla<bfloat16> paged(c);
  paged.run();
  EXPECT_LE(paged.error(), 1.0);
  bool zero = true;
  for (int b = 0; b < c.B(); ++b)
    for (int i = c.ql[static_cast<size_t>(b)]; i < c.S; ++i)
      for (int h = 0; h < c.N; ++h)
        for (int e = 0; e < kD; ++e)
          zero = zero && float(paged.out[paged.at(b, i, h, kD) + static_cast<size_t>(e)]) == 0;
  EXPECT_TRUE(zero) << "rows past the query lengths are not 0";
  c.contiguous = true;
  Mla<bfloat16> flat(c);
  flat.run();
  EXPECT_TRUE(same_bits(flat.out, paged.out));
  c.ql = {4, 4, 4};  // no lengths: every batch has Q_S rows
  c.kvl = {70, 4, 200};
  c.S = 0;
  Mla<bfloat16> full(c);
  full.run();
  EXPECT_LE(full.error(), 1.0);
}

TEST(FiaRope, MlaThreadCountsGiveTheSameBits) {
  MlaCase c = mla_cases()[3];  // MTP, BSND
  Mla<bfloat16> a(c), b(c);
  attnref::ExecConfig one, two;
  one.threads = 1;
  two.threads = 2;
  two.kv_split = 32;
  one.kv_split = 32;
  a.run(one);
  b.run(two);
  EXPECT_TRUE(same_bits(a.out, b.out));
}

// MLA's head-major output layouts (BSH_NBSD, BSND_NBSD, BNSD_NBSD, TND_NTD): the same bits as
// the query's layout, each row moved to [N, B, S, D] (TND: [N, T, D]).
TEST(FiaRope, MlaHeadMajorOutputsAreTheSameRowsMoved) {
  for (const MlaCase& c0 : {mla_cases()[1], mla_cases()[2], mla_cases()[5], mla_cases()[6]}) {
    Mla<bfloat16> m(c0);
    m.run();
    const std::string lay = c0.tnd() ? "TND_NTD" : c0.layout + "_NBSD";
    auto p = m.params();
    p.input_layout = lay;
    std::vector<bfloat16> o(m.out.size(), bfloat16(-3.0f));
    const Index N = c0.N, B = c0.B(), S = c0.qs();
    const Shape shape = c0.tnd() ? Shape{N, m.T_, kD} : Shape{N, B, S, kD};
    attnref::fused_infer_attention_score(
        p, m.inputs(),
        attnref::FusedInferAttentionScoreOutputs<bfloat16>{StridedView<bfloat16>(o.data(), shape)});
    bool same = true;
    for (int b = 0; b < c0.B(); ++b)
      for (int i = 0; i < c0.ql[static_cast<size_t>(b)]; ++i)
        for (int h = 0; h < c0.N; ++h) {
          const size_t row =
              c0.tnd() ? static_cast<size_t>((h * m.T_ + m.qcu[static_cast<size_t>(b)] + i) * kD)
                       : static_cast<size_t>(((h * B + b) * S + i) * kD);
          same =
              same && std::memcmp(&o[row], &m.out[m.at(b, i, h, kD)], kD * sizeof(bfloat16)) == 0;
        }
    EXPECT_TRUE(same) << lay;
  }
  // Head-major outputs are MLA's only.
  Mla<bfloat16> m(mla_cases()[2]);
  auto p = m.params();
  p.input_layout = "BSND_NBSD";
  auto in = m.inputs();
  in.query_rope = in.key_rope = {};
  support::expect_rejected([&] { attnref::fused_infer_attention_score(p, in, m.outputs()); },
                           "params.input_layout takes query_rope with head size 512 (MLA)");
}

// Head size 128 + 64 (TND, bf16): FIA with the rope views == FIA on 192-wide concatenated q / k
// heads (value 128), bit for bit, output and softmax_lse, with sparse mode 3; a learnable sink
// of -inf on every head changes no bit of the split call; NTD_TND (the inputs [N, T, D]) gives
// the same bits.
TEST(FiaRope, Rope128EqualsConcatenatedHeadsBitForBit) {
  const std::vector<std::int64_t> qcu{3, 20, 20, 29}, kcu{5, 22, 22, 40};
  const Index T1 = 29, T2 = 40, N = 4, KVN = 2, D = 128, W = D + kR;
  std::mt19937 rng(3);
  const auto q = support::randn<bfloat16>(static_cast<size_t>(T1 * N * W), rng);
  const auto k = support::randn<bfloat16>(static_cast<size_t>(T2 * KVN * W), rng);
  const auto v = support::randn<bfloat16>(static_cast<size_t>(T2 * KVN * D), rng);
  std::vector<bfloat16> qn, qr, kn, kr;
  for (Index r = 0; r < T1 * N; ++r)
    for (Index e = 0; e < W; ++e) (e < D ? qn : qr).push_back(q[static_cast<size_t>(r * W + e)]);
  for (Index r = 0; r < T2 * KVN; ++r)
    for (Index e = 0; e < W; ++e) (e < D ? kn : kr).push_back(k[static_cast<size_t>(r * W + e)]);
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<bfloat16> sink(static_cast<size_t>(N), bfloat16(ninf));
  std::vector<std::uint8_t> mask(2048 * 2048, 0);
  attnref::FusedInferAttentionScoreParams p;
  p.num_heads = N;
  p.num_key_value_heads = KVN;
  p.input_layout = "TND";
  p.scale_value = 0.07;
  p.sparse_mode = 3;
  p.softmax_lse_flag = true;
  const auto run = [&](bool split, bool with_sink, std::vector<bfloat16>& o,
                       std::vector<float>& lse) {
    attnref::FusedInferAttentionScoreInputs<bfloat16> in;
    if (split) {
      in.query = StridedView<const bfloat16>(qn.data(), {T1, N, D});
      in.key = {StridedView<const bfloat16>(kn.data(), {T2, KVN, D})};
      in.query_rope = StridedView<const bfloat16>(qr.data(), {T1, N, kR});
      in.key_rope = StridedView<const bfloat16>(kr.data(), {T2, KVN, kR});
    } else {
      in.query = StridedView<const bfloat16>(q.data(), {T1, N, W});
      in.key = {StridedView<const bfloat16>(k.data(), {T2, KVN, W})};
    }
    in.value = {StridedView<const bfloat16>(v.data(), {T2, KVN, D})};
    in.actual_seq_lengths = qcu;
    in.actual_seq_lengths_kv = kcu;
    in.atten_mask = StridedView<const std::uint8_t>(mask.data(), {2048, 2048});
    if (with_sink) in.learnable_sink = StridedView<const bfloat16>(sink.data(), {N});
    o.assign(static_cast<size_t>(T1 * N * D), bfloat16(-3.0f));
    lse.assign(static_cast<size_t>(T1 * N), -3.0f);
    attnref::fused_infer_attention_score(p, in,
                                         attnref::FusedInferAttentionScoreOutputs<bfloat16>{
                                             StridedView<bfloat16>(o.data(), {T1, N, D}),
                                             StridedView<float>(lse.data(), {T1, N, 1})});
  };
  std::vector<bfloat16> o_split, o_cat, o_sink, o_ntd;
  std::vector<float> l_split, l_cat, l_sink, l_ntd;
  run(true, false, o_split, l_split);
  run(false, false, o_cat, l_cat);
  run(true, true, o_sink, l_sink);
  EXPECT_TRUE(same_bits(o_split, o_cat));
  EXPECT_TRUE(same_bits(l_split, l_cat));
  EXPECT_TRUE(same_bits(o_split, o_sink));
  EXPECT_TRUE(same_bits(l_split, l_sink));
  // NTD_TND: the same inputs stored [N, T, D] (the outputs stay TND's), bit for bit.
  const auto ntd = [](const std::vector<bfloat16>& x, Index T, Index H, Index W) {
    std::vector<bfloat16> y(x.size());
    for (Index t = 0; t < T; ++t)
      for (Index h = 0; h < H; ++h)
        for (Index e = 0; e < W; ++e)
          y[static_cast<size_t>((h * T + t) * W + e)] = x[static_cast<size_t>((t * H + h) * W + e)];
    return y;
  };
  const auto qn2 = ntd(qn, T1, N, D), qr2 = ntd(qr, T1, N, kR), kn2 = ntd(kn, T2, KVN, D),
             kr2 = ntd(kr, T2, KVN, kR), v2 = ntd(v, T2, KVN, D);
  {
    attnref::FusedInferAttentionScoreInputs<bfloat16> in;
    in.query = StridedView<const bfloat16>(qn2.data(), {N, T1, D});
    in.key = {StridedView<const bfloat16>(kn2.data(), {KVN, T2, D})};
    in.value = {StridedView<const bfloat16>(v2.data(), {KVN, T2, D})};
    in.query_rope = StridedView<const bfloat16>(qr2.data(), {N, T1, kR});
    in.key_rope = StridedView<const bfloat16>(kr2.data(), {KVN, T2, kR});
    in.actual_seq_lengths = qcu;
    in.actual_seq_lengths_kv = kcu;
    in.atten_mask = StridedView<const std::uint8_t>(mask.data(), {2048, 2048});
    auto pn = p;
    pn.input_layout = "NTD_TND";
    o_ntd.assign(o_split.size(), bfloat16(-3.0f));
    l_ntd.assign(l_split.size(), -3.0f);
    attnref::fused_infer_attention_score(pn, in,
                                         attnref::FusedInferAttentionScoreOutputs<bfloat16>{
                                             StridedView<bfloat16>(o_ntd.data(), {T1, N, D}),
                                             StridedView<float>(l_ntd.data(), {T1, N, 1})});
  }
  EXPECT_TRUE(same_bits(o_split, o_ntd));
  EXPECT_TRUE(same_bits(l_split, l_ntd));
  // Batch 2 has no query rows, batch 0 three: every written row differs from the sentinel.
  EXPECT_EQ(std::count(l_split.begin(), l_split.end(), -3.0f), 0);
}

// ---------------------------------------------------------------------------------------------
// Rejections: each names its argument, and the output is never touched.

using Params = attnref::FusedInferAttentionScoreParams;
using Inputs = attnref::FusedInferAttentionScoreInputs<bfloat16>;

template <class F>
void expect_rejected(const MlaCase& c, F&& edit, const std::string& fragment,
                     bool out_of_range = false) {
  Mla<bfloat16> m(c);
  Params p = m.params();
  Inputs in = m.inputs();
  const auto out = m.outputs();
  edit(p, in, m);
  const auto call = [&] { attnref::fused_infer_attention_score(p, in, out); };
  const auto check = [&] { attnref::validate(p, in, out); };
  if (out_of_range)
    support::expect_rejected<std::out_of_range>(call, fragment);
  else
    support::expect_rejected(call, fragment);
  support::expect_validate_agrees(check, call);
  EXPECT_TRUE(std::all_of(m.out.begin(), m.out.end(), [](bfloat16 x) { return float(x) == -3.0f; }))
      << fragment;
}

TEST(FiaRope, MlaRejections) {
  const MlaCase dec;  // BSND, Q_S 1, sparse 0
  MlaCase mtp;
  mtp.ql = {3, 3, 3};
  MlaCase tnd = mla_cases()[6];
  std::vector<bfloat16> junk(1 << 16, bfloat16(0.0f));
  std::vector<std::uint8_t> mask(2048 * 2048, 0);
  expect_rejected(
      dec, [](Params&, Inputs& in, auto&) { in.key_rope = {}; },
      "key_rope missing (query_rope and key_rope come together)");
  expect_rejected(
      dec, [](Params&, Inputs& in, auto&) { in.query_rope = {}; }, "query_rope missing");
  expect_rejected(
      dec, [](Params& p, Inputs&, auto&) { p.num_key_value_heads = 2; },
      "params.num_key_value_heads MLA reads one latent kv head");
  MlaCase three = dec;
  three.N = 3;
  expect_rejected(
      three, [](Params&, Inputs&, auto&) {}, "params.num_heads not supported");
  MlaCase long_q = dec;
  long_q.ql = {17, 17, 17};
  expect_rejected(
      long_q,
      [](Params& p, Inputs& in, auto&) {
        p.sparse_mode = 3;
        (void)in;
      },
      "Q_S out of range");
  expect_rejected(
      dec, [](Params& p, Inputs&, auto&) { p.softmax_lse_flag = true; },
      "params.softmax_lse_flag not supported with query_rope and head size 512");
  expect_rejected(
      dec,
      [&](Params&, Inputs& in, auto&) {
        in.pse_shift = StridedView<const bfloat16>(junk.data(), {1, 8, 1, 256});
      },
      "pse_shift not supported");
  expect_rejected(
      dec,
      [&](Params&, Inputs& in, auto&) {
        in.learnable_sink = StridedView<const bfloat16>(junk.data(), {8});
      },
      "learnable_sink not supported");
  expect_rejected(
      dec, [](Params& p, Inputs&, auto&) { p.inner_precise = 2; },
      "params.inner_precise out of range");
  expect_rejected(
      dec, [](Params&, Inputs& in, auto&) { in.block_table = {}; }, "block_table missing");
  expect_rejected(
      dec, [](Params& p, Inputs&, auto&) { p.block_size = 32; },
      "params.block_size differs from the cache's block size");
  MlaCase bs32 = dec;
  bs32.bs = 32;
  expect_rejected(
      bs32, [](Params&, Inputs&, auto&) {}, "params.block_size not supported");
  expect_rejected(
      dec, [](Params& p, Inputs&, auto&) { p.sparse_mode = 3; },
      "params.sparse_mode not supported");
  expect_rejected(
      dec, [](Params& p, Inputs&, auto&) { p.sparse_mode = 4; },
      "sparse_mode 3 and 4 take the 2048 x 2048 compressed mask");
  MlaCase sw;  // a valid sliding-window call, then one rule broken at a time
  sw.N = 128;
  sw.ql = {2, 2};
  sw.kvl = {70, 3};
  sw.bs = 64;
  sw.pre = 20;
  expect_rejected(
      sw, [](Params& p, Inputs&, auto&) { p.pre_tokens = 2049; }, "params.pre_tokens out of range");
  expect_rejected(
      sw, [](Params& p, Inputs&, auto&) { p.pre_tokens = 0; }, "params.pre_tokens out of range");
  expect_rejected(
      sw, [](Params& p, Inputs&, auto&) { p.next_tokens = 1; }, "params.next_tokens not supported");
  expect_rejected(
      sw,
      [](Params&, Inputs& in, auto&) {
        in.actual_seq_lengths_kv = {70, 1};
      },
      "actual_seq_lengths_kv[1] out of range with MLA's sparse_mode 4");
  expect_rejected(
      sw,
      [](Params&, Inputs& in, auto&) {
        in.actual_seq_lengths = {2, 3};
      },
      "actual_seq_lengths[1] out of range");
  MlaCase swc = sw;  // the contiguous cache
  swc.contiguous = true;
  expect_rejected(
      swc,
      [](Params&, Inputs& in, auto& m) {
        in.key = {StridedView<const bfloat16>(m.kcc.data(), {1, 2 * m.S2, 1, kD})};
        in.value = {StridedView<const bfloat16>(m.vcc.data(), {1, 2 * m.S2, 1, kD})};
      },
      "key[0].shape not a contiguous MLA cache");
  expect_rejected(
      swc,
      [](Params&, Inputs& in, auto& m) {
        in.key_rope = StridedView<const bfloat16>(m.krcc.data(), {2, m.S2 - 1, 1, kR});
      },
      "key_rope.shape mismatch");
  MlaCase sw_bsh = sw;
  sw_bsh.layout = "BSH";
  expect_rejected(
      sw_bsh, [](Params&, Inputs&, auto&) {}, "params.input_layout not supported with MLA's");
  MlaCase sw16 = sw;
  sw16.bs = 16;
  expect_rejected(
      sw16, [](Params&, Inputs&, auto&) {}, "params.block_size not supported");
  MlaCase sw8 = sw;
  sw8.N = 8;
  expect_rejected(
      sw8, [](Params&, Inputs&, auto&) {}, "params.num_heads not supported with MLA's");
  expect_rejected(
      dec,
      [&](Params&, Inputs& in, auto&) {
        in.atten_mask = StridedView<const std::uint8_t>(mask.data(), {2048, 2048});
      },
      "atten_mask given with sparse_mode 0");
  expect_rejected(
      mtp, [](Params&, Inputs& in, auto&) { in.atten_mask = {}; },
      "sparse_mode 3 and 4 take the 2048 x 2048 compressed mask");
  expect_rejected(
      mtp,
      [&](Params&, Inputs& in, auto&) {
        in.atten_mask = StridedView<const std::uint8_t>(mask.data(), {1, 1, 2048, 2048});
      },
      "sparse_mode 3 and 4 take the 2048 x 2048 compressed mask");
  expect_rejected(
      mtp, [](Params& p, Inputs&, auto&) { p.input_layout = "BNSD_BSND"; },
      "params.input_layout not supported with query_rope");
  expect_rejected(
      dec,
      [](Params&, Inputs& in, auto& m) {
        in.query_rope = StridedView<const bfloat16>(m.qr.data(), {3, 1, 8, 32});
      },
      "query_rope.shape mismatch");
  expect_rejected(
      dec,
      [](Params&, Inputs& in, auto& m) {
        in.key_rope = StridedView<const bfloat16>(m.krc.data(), {m.nb, 16, 32});
      },
      "key_rope.shape not a paged MLA cache");
  expect_rejected(
      dec,
      [](Params&, Inputs& in, auto& m) {
        in.key_rope = StridedView<const bfloat16>(m.krc.data(), {m.nb - 1, 16, 64});
      },
      "key_rope.shape mismatch with key[0]");
  expect_rejected(
      dec,
      [](Params&, Inputs& in, auto& m) {
        in.value = {StridedView<const bfloat16>(m.vc.data(), {m.nb - 1, 16, 512})};
      },
      "value[0].shape differs from the key's");
  expect_rejected(
      dec,
      [](Params&, Inputs& in, auto& m) {
        in.key = {StridedView<const bfloat16>(m.kc.data(), {m.nb, 1, 16, 512})};
        in.value = in.key;
      },
      "key[0].shape not a paged MLA cache");
  expect_rejected(
      dec,
      [](Params&, Inputs& in, auto& m) {
        m.table[0] = m.nb;
        (void)in;
      },
      "block_table[0][0]", /*out_of_range=*/true);
  expect_rejected(
      dec, [](Params&, Inputs& in, auto&) { in.actual_seq_lengths_kv.clear(); },
      "actual_seq_lengths_kv required with a paged cache");
  expect_rejected(
      dec, [](Params&, Inputs& in, auto& m) { in.actual_seq_lengths_kv[0] = m.maxb * 16 + 1; },
      "actual_seq_lengths_kv[0] out of range");
  expect_rejected(
      tnd,
      [](Params&, Inputs& in, auto&) {
        in.actual_seq_lengths = {1, 18, 18, 22};
      },
      "out of range (cumulative, at most 16 query rows a batch with MLA)");
  expect_rejected(
      tnd, [](Params& p, Inputs&, auto&) { p.input_layout = "NTD_TND"; },
      "NTD_TND does not take MLA");
  expect_rejected(
      tnd, [](Params&, Inputs& in, auto&) { in.actual_seq_lengths.clear(); },
      "actual_seq_lengths required with TND");
  expect_rejected(
      tnd, [](Params& p, Inputs&, auto&) { p.sparse_mode = 2; },
      "params.sparse_mode not supported");
}

// int8 K / V with a floating query (MLA antiquant): not implemented; the int8-query form is
// tests/cann/fia_mla_quant_test.cpp's.
TEST(FiaRope, MlaAntiquantIsNotImplemented) {
  Mla<bfloat16> m(MlaCase{});
  attnref::FusedInferAttentionScoreInputs<bfloat16, std::int8_t> in;
  const Inputs f = m.inputs();
  std::vector<std::int8_t> k8(m.kc.size(), 1);
  in.query = f.query;
  in.query_rope = f.query_rope;
  in.key_rope = f.key_rope;
  in.key = {StridedView<const std::int8_t>(k8.data(), f.key[0].shape())};
  in.value = in.key;
  in.block_table = f.block_table;
  in.actual_seq_lengths_kv = f.actual_seq_lengths_kv;
  support::expect_rejected(
      [&] { attnref::fused_infer_attention_score(m.params(), in, m.outputs()); },
      "quantized MLA other than the full quantization");
}

TEST(FiaRope, Rope128Rejections) {
  const Index N = 2, D = 128;
  std::vector<bfloat16> q(static_cast<size_t>(4 * N * 192)), k(q.size()),
      o(q.size(), bfloat16(-3.0f));
  std::vector<half> qh(q.size()), oh(q.size(), half(-3.0f));
  const auto call = [&](const std::string& layout, Index d, Shape qs, Shape rs) {
    Params p;
    p.num_heads = N;
    p.input_layout = layout;
    Inputs in;
    (void)d;
    in.query = StridedView<const bfloat16>(q.data(), qs);
    in.key = {StridedView<const bfloat16>(k.data(), qs)};
    in.value = in.key;
    in.query_rope = StridedView<const bfloat16>(q.data(), rs);
    in.key_rope = StridedView<const bfloat16>(k.data(), rs);
    if (layout == "TND") in.actual_seq_lengths = in.actual_seq_lengths_kv = {4};
    return [p, in, &o, qs] {
      attnref::fused_infer_attention_score(
          p, in,
          attnref::FusedInferAttentionScoreOutputs<bfloat16>{StridedView<bfloat16>(o.data(), qs)});
    };
  };
  support::expect_rejected(call("BSND", D, {1, 1, N, D}, {1, 1, N, kR}),
                           "query_rope with head size 128 takes TND (head size 512: MLA)");
  support::expect_rejected(call("BSND", D, {1, 4, N, D}, {1, 4, N, kR}),
                           "query_rope with head size 128 takes TND (head size 512: MLA)");
  support::expect_rejected(call("TND", 64, {4, N, 64}, {4, N, kR}),
                           "query / key / value head sizes with query_rope");
  support::expect_rejected(call("TND", D, {4, N, D}, {4, N, 32}), "query_rope.shape mismatch");
  EXPECT_TRUE(std::all_of(o.begin(), o.end(), [](bfloat16 x) { return float(x) == -3.0f; }));
  // fp16: the vendor's rule is bf16 only
  Params p;
  p.num_heads = N;
  p.input_layout = "TND";
  attnref::FusedInferAttentionScoreInputs<half> in;
  in.query = StridedView<const half>(qh.data(), {4, N, D});
  in.key = {in.query};
  in.value = {in.query};
  in.query_rope = StridedView<const half>(qh.data(), {4, N, kR});
  in.key_rope = in.query_rope;
  in.actual_seq_lengths = in.actual_seq_lengths_kv = {4};
  support::expect_rejected(
      [&] {
        attnref::fused_infer_attention_score(p, in,
                                             attnref::FusedInferAttentionScoreOutputs<half>{
                                                 StridedView<half>(oh.data(), {4, N, D})});
      },
      "query_rope with head size 128 takes bfloat16 data");
}

}  // namespace fia_rope_test
