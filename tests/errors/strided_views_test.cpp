// One view type (issue #18): the CANN, MLA and NSA operators take the same strided view as the
// engine. A padded, spread-out copy of every input and output (support::Restrider: each
// dimension leaves a gap, the innermost stride is 2, the gaps hold NaN / -77 / true) must give
// the same bits as the dense call, leave every gap untouched, and in-place and overlap rules
// must hold for strided views as for dense ones. (The fuzz harness repeats the input half of
// this on every accepted valid case of its CANN, MLA and NSA entries.)
#include <gtest/gtest.h>

#include <attnref/attnref.hpp>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/bits.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"
#include "support/views.hpp"

namespace strided_views_test {

using attnref::Dims;
using attnref::half;
using attnref::Index;
using attnref::StridedView;
using support::randn;
using support::same_bits;

// The elements of a view in row-major order (independent of the library's own walk).
template <class T>
void gather(const StridedView<T>& v, int d, Index off, std::vector<std::remove_const_t<T>>& out) {
  if (d == v.rank()) {
    out.push_back(v.data()[off]);
    return;
  }
  for (Index i = 0; i < v.size(d); ++i) gather(v, d + 1, off + i * v.stride(d), out);
}
template <class T>
std::vector<std::remove_const_t<T>> gather(const StridedView<T>& v) {
  std::vector<std::remove_const_t<T>> out;
  gather(v, 0, 0, out);
  return out;
}

// Runs `call(in, out)` on the dense arguments, then on restrided copies of the inputs and of
// the output (filled with the same sentinel), and compares the bits.
template <class In, class T, class Call>
void expect_same_bits(const In& in, std::vector<T>& o, const Dims& oshape, Call call) {
  std::vector<T> dense(o);
  call(in, StridedView<T>(dense.data(), oshape));
  support::Restrider r;
  In sin = in;
  sin.for_each_view(r);
  StridedView<T> so(o.data(), oshape);
  r("out", so);
  call(sin, so);
  EXPECT_TRUE(same_bits(gather(so), dense));
  EXPECT_TRUE(r.gaps_intact());
  bool finite = true;
  for (const T& e : dense) finite = finite && std::isfinite(static_cast<float>(e));
  EXPECT_TRUE(finite);  // the dense result itself read no gap
}

TEST(StridedViews, PromptFlashAttentionWithMaskAndPse) {
  const Index B = 2, S1 = 5, S2 = 7, N = 2, KVN = 1, D = 8;
  const auto q = randn<half>(B * S1 * N * D, 1), k = randn<half>(B * S2 * KVN * D, 2),
             v = randn<half>(B * S2 * KVN * D, 3), pse = randn<half>(B * N * S1 * S2, 4);
  std::vector<std::uint8_t> mask(S1 * S2);
  for (Index i = 0; i < S1; ++i)
    for (Index j = 0; j < S2; ++j) mask[static_cast<size_t>(i * S2 + j)] = j > i + 2;
  attnref::PromptFlashAttentionParams p;
  p.num_heads = N, p.num_key_value_heads = KVN, p.input_layout = "BSND", p.scale_value = 0.35;
  attnref::PromptFlashAttentionInputs<half> in;
  in.query = StridedView<const half>(q.data(), {B, S1, N, D});
  in.key = StridedView<const half>(k.data(), {B, S2, KVN, D});
  in.value = StridedView<const half>(v.data(), {B, S2, KVN, D});
  in.pse_shift = StridedView<const half>(pse.data(), {B, N, S1, S2});
  in.atten_mask = StridedView<const std::uint8_t>(mask.data(), {S1, S2});
  std::vector<half> o(static_cast<size_t>(B * S1 * N * D), half(7.0f));
  expect_same_bits(in, o, {B, S1, N, D}, [&](const auto& i, const StridedView<half>& out) {
    attnref::prompt_flash_attention(p, i, attnref::PromptFlashAttentionOutputs<half>{out});
  });
}

TEST(StridedViews, IncreFlashAttentionBnsdWithTwoKeyTensors) {
  const Index B = 2, S = 9, N = 4, KVN = 2, D = 16;
  const auto q = randn<half>(B * N * D, 5);
  std::vector<std::vector<half>> k, v;
  attnref::IncreFlashAttentionParams p;
  p.num_heads = N, p.num_key_value_heads = KVN, p.input_layout = "BNSD", p.scale_value = 0.25;
  attnref::IncreFlashAttentionInputs<half> in;
  in.query = StridedView<const half>(q.data(), {B, N, 1, D});
  for (Index b = 0; b < B; ++b) {  // one tensor per batch, lengths 9 and 6
    const Index s = b == 0 ? S : 6;
    k.push_back(randn<half>(static_cast<size_t>(KVN * s * D), 6 + static_cast<unsigned>(b)));
    v.push_back(randn<half>(static_cast<size_t>(KVN * s * D), 8 + static_cast<unsigned>(b)));
  }
  for (Index b = 0; b < B; ++b) {
    const Index s = b == 0 ? S : 6;
    in.key.emplace_back(k[static_cast<size_t>(b)].data(), Dims{1, KVN, s, D});
    in.value.emplace_back(v[static_cast<size_t>(b)].data(), Dims{1, KVN, s, D});
  }
  in.actual_seq_lengths = {S, 6};
  std::vector<half> o(static_cast<size_t>(B * N * D), half(7.0f));
  expect_same_bits(in, o, {B, N, 1, D}, [&](const auto& i, const StridedView<half>& out) {
    attnref::incre_flash_attention(p, i, attnref::IncreFlashAttentionOutputs<half>{out});
  });
}

// Both outputs strided: attention_out and softmax_lse (prompt branch with padded rows and an
// empty batch, and the incremental branch over a two-tensor list).
TEST(StridedViews, FusedInferAttentionScoreWithItsLse) {
  const Index B = 2, S1 = 5, S2 = 7, N = 4, KVN = 2, D = 8;
  for (const Index qs : {S1, Index{1}}) {
    const auto q = randn<half>(B * qs * N * D, 11), k = randn<half>(B * S2 * KVN * D, 12),
               v = randn<half>(B * S2 * KVN * D, 13);
    attnref::FusedInferAttentionScoreParams p;
    p.num_heads = N, p.num_key_value_heads = KVN, p.input_layout = "BSND", p.scale_value = 0.3;
    p.softmax_lse_flag = true;
    attnref::FusedInferAttentionScoreInputs<half> in;
    in.query = StridedView<const half>(q.data(), {B, qs, N, D});
    in.key = {StridedView<const half>(k.data(), {B, S2, KVN, D})};
    in.value = {StridedView<const half>(v.data(), {B, S2, KVN, D})};
    if (qs > 1) in.actual_seq_lengths = {3, 5};
    in.actual_seq_lengths_kv = {0, 6};
    std::vector<half> o(static_cast<size_t>(B * qs * N * D), half(7.0f)), dense_o(o);
    std::vector<float> lse(static_cast<size_t>(B * N * qs), 7.0f), dense_lse(lse);
    using Out = attnref::FusedInferAttentionScoreOutputs<half>;
    attnref::fused_infer_attention_score(p, in,
                                         Out{StridedView<half>(dense_o.data(), {B, qs, N, D}),
                                             StridedView<float>(dense_lse.data(), {B, N, qs, 1})});
    support::Restrider r;
    auto sin = in;
    sin.for_each_view(r);
    Out so{StridedView<half>(o.data(), {B, qs, N, D}),
           StridedView<float>(lse.data(), {B, N, qs, 1})};
    so.for_each_view(r);
    attnref::fused_infer_attention_score(p, sin, so);
    EXPECT_TRUE(same_bits(gather(so.attention_out), dense_o));
    EXPECT_TRUE(same_bits(gather(so.softmax_lse), dense_lse));
    EXPECT_TRUE(r.gaps_intact());
  }
}

TEST(StridedViews, MlaDecodePassesStridesToTheEngine) {
  const Index B = 2, H = 3, C = 16, R = 8, W = C + R, bs = 4, blocks = 5;
  attnref::MlaDecodeParams p;
  p.kv_lora_rank = C, p.rope_dim = R, p.scale = 0.2;
  const auto q = randn<float>(B * H * W, 11), cache = randn<float>(blocks * bs * W, 12);
  const std::vector<std::int32_t> table{3, 0, 4, 1};
  attnref::MlaDecodeInputs<float> in;
  in.q = StridedView<const float>(q.data(), {B, H, W});
  in.kv_cache = StridedView<const float>(cache.data(), {blocks, bs, 1, W});
  in.block_table = StridedView<const std::int32_t>(table.data(), {B, 2});
  in.context_lens = {7, 5};
  std::vector<float> o(static_cast<size_t>(B * H * C), 7.0f);
  expect_same_bits(in, o, {B, H, C}, [&](const auto& i, const StridedView<float>& out) {
    attnref::mla_decode(p, i, {out});
  });
}

// The arguments of nsa_compress and nsa_gated_sum, which take no inputs struct.
struct CompressIn {
  StridedView<const float> input, weight;
  template <class F>
  void for_each_view(F&& f) {
    f("input", input), f("weight", weight);
  }
};
struct GatedIn {
  StridedView<const float> gates, o_cmp, o_sel, o_win;
  template <class F>
  void for_each_view(F&& f) {
    f("gates", gates), f("o_cmp", o_cmp), f("o_sel", o_sel), f("o_win", o_win);
  }
};

TEST(StridedViews, NsaCompressAndGatedSum) {
  const Index T = 40, N = 2, D = 8, l = 16, d = 8;
  const auto x = randn<float>(T * N * D, 13), w = randn<float>(l * N, 14);
  attnref::NsaCompressParams p;
  p.compress_block_size = l, p.compress_stride = d, p.strict = false;
  const std::vector<std::int64_t> cu{25, 40};
  const Index blocks =
      attnref::nsa_compressed_count(25, l, d) + attnref::nsa_compressed_count(15, l, d);
  CompressIn in{StridedView<const float>(x.data(), {T, N, D}),
                StridedView<const float>(w.data(), {l, N})};
  std::vector<float> o(static_cast<size_t>(blocks * N * D), 7.0f);
  expect_same_bits(in, o, {blocks, N, D}, [&](const CompressIn& i, const StridedView<float>& out) {
    attnref::nsa_compress(p, i.input, i.weight, cu, out);
  });

  const Index rows = 3;
  const auto g = randn<float>(rows * N * 3, 15), a = randn<float>(rows * N * D, 16),
             b = randn<float>(rows * N * D, 17), c = randn<float>(rows * N * D, 18);
  GatedIn gin{StridedView<const float>(g.data(), {rows, N, 3}),
              StridedView<const float>(a.data(), {rows, N, D}),
              StridedView<const float>(b.data(), {rows, N, D}),
              StridedView<const float>(c.data(), {rows, N, D})};
  std::vector<float> go(static_cast<size_t>(rows * N * D), 7.0f);
  expect_same_bits(gin, go, {rows, N, D}, [&](const GatedIn& i, const StridedView<float>& out) {
    attnref::nsa_gated_sum(i.gates, i.o_cmp, i.o_sel, i.o_win, out);
  });
}

TEST(StridedViews, RopeInPlaceOnAStridedViewEqualsOutOfPlace) {
  const Index Nt = 3, H = 2, R = 8;
  const auto x = randn<float>(Nt * H * R, 19), s = randn<float>(Nt * R, 20),
             c = randn<float>(Nt * R, 21);
  const StridedView<const float> sv(s.data(), {Nt, R}), cv(c.data(), {Nt, R});
  std::vector<float> want(x.size());
  attnref::rope_rotate_half<float>(StridedView<const float>(x.data(), {Nt, H * R}), sv, cv, H,
                                   StridedView<float>(want.data(), {Nt, H * R}));
  // x transposed in memory ([H·R, Nt] storage viewed as [Nt, H·R]) and rotated in place.
  std::vector<float> xt(x.size());
  for (Index t = 0; t < Nt; ++t)
    for (Index j = 0; j < H * R; ++j)
      xt[static_cast<size_t>(j * Nt + t)] = x[static_cast<size_t>(t * H * R + j)];
  const StridedView<float> inplace(xt.data(), {Nt, H * R}, {1, Nt});
  attnref::rope_rotate_half<float>(inplace, sv, cv, H, inplace);
  EXPECT_TRUE(same_bits(gather(inplace), want));
}

// The engine wrote an output row contiguously whatever the head dimension's stride (found by
// the MLA case above): an output with stride 2 there must get the dense bits, gaps untouched.
template <class T>
void engine_output_with_head_stride_2() {
  const Index B = 2, S = 3, N = 2, D = 8;
  const auto q = randn<T>(B * S * N * D, 30), k = randn<T>(B * S * N * D, 31),
             v = randn<T>(B * S * N * D, 32);
  attnref::AttentionInputs<T> in{attnref::bsnd_view<const T>(q.data(), B, S, N, D),
                                 attnref::bsnd_view<const T>(k.data(), B, S, N, D),
                                 attnref::bsnd_view<const T>(v.data(), B, S, N, D)};
  std::vector<T> dense(q.size(), T(7.0f)), spread(2 * q.size(), T(-9.0f));
  attnref::attention(in, attnref::AttentionParams{},
                     attnref::AttentionOutputs<T>{attnref::bsnd_view(dense.data(), B, S, N, D)});
  const StridedView<T, 4> o(spread.data(), {B, S, N, D}, {2 * S * N * D, 2 * N * D, 2 * D, 2});
  attnref::attention(in, attnref::AttentionParams{}, attnref::AttentionOutputs<T>{o});
  for (size_t i = 0; i < dense.size(); ++i) {
    EXPECT_EQ(static_cast<float>(spread[2 * i]), static_cast<float>(dense[i])) << i;
    EXPECT_EQ(static_cast<float>(spread[2 * i + 1]), -9.0f) << i;
  }
}

TEST(StridedViews, EngineOutputWithAHeadStrideOf2) {
  engine_output_with_head_stride_2<float>();
  engine_output_with_head_stride_2<half>();
}

TEST(StridedViews, OverlapsAreRejectedBeforeAnyWrite) {
  const Index B = 1, S = 4, N = 2, D = 8;
  auto q = randn<half>(B * S * N * D * 2, 22);
  attnref::PromptFlashAttentionParams p;
  p.num_heads = N, p.input_layout = "BSND";
  attnref::PromptFlashAttentionInputs<half> in;
  in.query = StridedView<const half>(q.data(), {B, S, N, D}, {S * N * D * 2, N * D * 2, D * 2, 2});
  in.key = in.value = in.query;
  const std::vector<half> before = q;
  // The output interleaves with the (strided) query: every other element of the same memory.
  const StridedView<half> out(q.data() + 1, {B, S, N, D}, {S * N * D * 2, N * D * 2, D * 2, 2});
  support::expect_rejected(
      [&] {
        attnref::prompt_flash_attention(p, in, attnref::PromptFlashAttentionOutputs<half>{out});
      },
      "prompt_flash_attention: attention_out overlaps an input");
  EXPECT_TRUE(same_bits(q, before));
  // A wrong shape is reported as such even when the view also overlaps: the overlap is raised
  // only after the operator's own checks.
  const StridedView<half> bad(q.data() + 1, {B, S, N, D + 1}, {S * N * D * 2, N * D * 2, D * 2, 2});
  support::expect_rejected(
      [&] {
        attnref::prompt_flash_attention(p, in, attnref::PromptFlashAttentionOutputs<half>{bad});
      },
      "attention_out.shape");
  EXPECT_TRUE(same_bits(q, before));
}

TEST(StridedViews, AHugeBroadcastIsRejectedNotCopied) {
  // 2^40 broadcast rows of one weight row: a valid view of 8 bytes' memory whose dense copy
  // would need 8 TiB; rejected by name (was std::bad_alloc at best).
  const std::vector<float> x(16 * 2 * 8, 1.0f), w(2, 0.5f);
  std::vector<float> o(2 * 8, 7.0f);
  attnref::NsaCompressParams p;
  p.compress_block_size = 16, p.compress_stride = 16, p.strict = false;
  support::expect_rejected(
      [&] {
        attnref::nsa_compress<float>(
            p, StridedView<const float>(x.data(), {16, 2, 8}),
            StridedView<const float>(w.data(), {Index(1) << 40, 2}, {0, 1}), {16},
            StridedView<float>(o.data(), {1, 2, 8}));
      },
      "nsa_compress: weight too large for its dense copy");
  for (float e : o) EXPECT_EQ(e, 7.0f);
}

TEST(StridedViews, DynamicRankLimitsAndFixedRankConversion) {
  float x[4] = {1, 2, 3, 4};
  EXPECT_THROW((void)Dims({1, 1, 1, 1, 1, 1, 1, 1, 1}), std::invalid_argument);
  const StridedView<float> v(x, {2, 2});
  EXPECT_EQ(v.stride(0), 2);
  EXPECT_TRUE(v.dense());
  const auto f = v.fixed<2>();
  EXPECT_EQ(f(1, 0), 3.0f);
  EXPECT_THROW((void)v.fixed<3>(), std::invalid_argument);
  const StridedView<const float> back = f;  // fixed rank -> dynamic, mutable -> const
  EXPECT_EQ(back.rank(), 2);
  EXPECT_EQ(back.shape(), Dims({2, 2}));
  EXPECT_FALSE(StridedView<float>(x, {2, 2}, {1, 2}).dense());
  EXPECT_TRUE(StridedView<float>().absent());
}

}  // namespace strided_views_test
