// Defined numerical edge cases: empty KV, fully masked rows, NaN/Inf in masked positions.

#include <gtest/gtest.h>

#include <attnref/attnref.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "support/case.hpp"
#include "support/simd_levels.hpp"

namespace edge_test {

using attnref::Index;

struct Buffers {
  Index B, Sq, Skv, N, Nkv, D;
  std::vector<float> q, k, v, o, lse;
  Buffers(Index b, Index sq, Index skv, Index n, Index nkv, Index d)
      : B(b),
        Sq(sq),
        Skv(skv),
        N(n),
        Nkv(nkv),
        D(d),
        q(static_cast<size_t>(b * sq * n * d)),
        k(static_cast<size_t>(b * skv * nkv * d) + 1),
        v(static_cast<size_t>(b * skv * nkv * d) + 1),
        o(static_cast<size_t>(b * sq * n * d), 777.0f),
        lse(static_cast<size_t>(b * n * sq)) {
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37f * static_cast<float>(i));
    for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.11f * static_cast<float>(i));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.05f * static_cast<float>(i) + 1.0f);
  }
  attnref::AttentionInputs<float> inputs() const {
    return {attnref::bsnd_view<const float>(q.data(), B, Sq, N, D),
            attnref::bsnd_view<const float>(k.data(), B, Skv, Nkv, D),
            attnref::bsnd_view<const float>(v.data(), B, Skv, Nkv, D)};
  }
  attnref::AttentionOutputs<float> outputs() {
    attnref::AttentionOutputs<float> out{attnref::bsnd_view(o.data(), B, Sq, N, D)};
    out.lse = attnref::StridedView<float, 3>(lse.data(), {B, N, Sq});
    return out;
  }
};

TEST(EdgeCases, EmptyKvGivesZeroOutputAndMinusInfLse) {
  Buffers b(2, 3, 0, 4, 2, 8);
  attnref::attention(b.inputs(), attnref::AttentionParams{}, b.outputs());
  for (float x : b.o) EXPECT_EQ(x, 0.0f);
  for (float x : b.lse) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
}

TEST(EdgeCases, EmptyKvInOneSequenceOfAVarlenBatch) {
  Buffers b(2, 3, 5, 2, 2, 4);
  auto in = b.inputs();
  in.seq.kv = {0, 5};
  attnref::attention(in, attnref::AttentionParams{}, b.outputs());
  for (Index i = 0; i < 3 * 2 * 4; ++i) EXPECT_EQ(b.o[static_cast<size_t>(i)], 0.0f);
  for (Index i = 3 * 2 * 4; i < 2 * 3 * 2 * 4; ++i) EXPECT_NE(b.o[static_cast<size_t>(i)], 0.0f);
}

TEST(EdgeCases, FullyMaskedRowGivesZeroAndMinusInf) {
  Buffers b(1, 4, 6, 2, 1, 8);
  std::vector<std::uint8_t> mask(4 * 6, 0);
  for (int j = 0; j < 6; ++j) mask[2 * 6 + j] = 1;  // row 2 sees nothing
  auto in = b.inputs();
  in.mask_bool = attnref::StridedView<const std::uint8_t, 4>(mask.data(), {1, 1, 4, 6});
  attnref::attention(in, attnref::AttentionParams{}, b.outputs());
  for (Index h = 0; h < 2; ++h) {
    for (Index d = 0; d < 8; ++d) EXPECT_EQ(b.o[static_cast<size_t>((2 * 2 + h) * 8 + d)], 0.0f);
    EXPECT_EQ(b.lse[static_cast<size_t>(h * 4 + 2)], -std::numeric_limits<float>::infinity());
    EXPECT_TRUE(std::isfinite(b.lse[static_cast<size_t>(h * 4 + 1)]));
  }
}

TEST(EdgeCases, BottomRightCausalWithMoreQueriesThanKeysMasksLeadingRows) {
  // q_len 5 > kv_len 3: query i sees keys j <= i - 2, so rows 0 and 1 see nothing.
  support::Spec s;
  s.q_len = {5};
  s.kv_len = {3};
  s.causal = ref::Causal::kBottomRight;
  EXPECT_TRUE(support::check_against_reference<float>(s));
  support::Data d = support::make_data<float>(s);
  const auto got = support::run_lib<float>(s, d);
  for (int h = 0; h < s.nq; ++h) {
    EXPECT_EQ(got.lse[0][static_cast<size_t>(h * 5 + 0)], -std::numeric_limits<double>::infinity());
    EXPECT_EQ(got.lse[0][static_cast<size_t>(h * 5 + 1)], -std::numeric_limits<double>::infinity());
    EXPECT_TRUE(std::isfinite(got.lse[0][static_cast<size_t>(h * 5 + 2)]));
  }
}

TEST(EdgeCases, NanAndInfInMaskedKeysAndValuesDoNotLeak) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // (12 rows per item: the panel kernels at the vector levels, Eigen's GEMM at Portable)
  support::at_every_level([&] {
    for (Index kv_tile : {Index(4), Index(256)}) {
      Buffers clean(1, 6, 9, 2, 1, 8);
      Buffers dirty = clean;
      // Key/value 8 is hidden by the boolean mask for every query; keys > i are hidden by the
      // causal mask from query i; poison both.
      std::vector<std::uint8_t> mask(6 * 9, 0);
      for (int i = 0; i < 6; ++i) mask[static_cast<size_t>(i * 9 + 8)] = 1;
      for (Index d = 0; d < 8; ++d) {
        dirty.k[static_cast<size_t>(8 * 8 + d)] = nan;
        dirty.v[static_cast<size_t>(8 * 8 + d)] = d % 2 ? inf : nan;
        dirty.v[static_cast<size_t>(7 * 8 + d)] = nan;  // visible only to the last query (i = 5)
      }
      attnref::AttentionParams p;
      p.causal = attnref::CausalMode::BottomRight;  // query i sees keys j <= i + 3
      attnref::ExecConfig x;
      x.kv_tile = kv_tile;
      auto in_clean = clean.inputs();
      auto in_dirty = dirty.inputs();
      in_clean.mask_bool = attnref::StridedView<const std::uint8_t, 4>(mask.data(), {1, 1, 6, 9});
      in_dirty.mask_bool = in_clean.mask_bool;
      attnref::attention(in_clean, p, clean.outputs(), x);
      attnref::attention(in_dirty, p, dirty.outputs(), x);
      // Rows 0..3 never see key 7 or 8: the clean result (up to the rounding of the slower
      // accumulation used for tiles with non-finite values). Row 4 sees key 7 (NaN v).
      for (Index i = 0; i < 4; ++i)
        for (Index h = 0; h < 2; ++h)
          for (Index d = 0; d < 8; ++d) {
            const size_t idx = static_cast<size_t>((i * 2 + h) * 8 + d);
            EXPECT_NEAR(dirty.o[idx], clean.o[idx], 1e-6) << "i=" << i << " h=" << h << " d=" << d;
          }
      for (Index h = 0; h < 2; ++h)
        EXPECT_TRUE(std::isnan(dirty.o[static_cast<size_t>((4 * 2 + h) * 8)]))
            << "a visible NaN value must propagate";
    }
  });
}

TEST(EdgeCases, AdditiveMaskMinusInfIsMaskedAndFiniteValuesAreAdded) {
  support::Spec s;
  s.nq = 2;
  s.nkv = 1;
  s.q_len = {7};
  s.kv_len = {12};
  s.mask = support::MaskKind::Additive;
  s.kv_tile = 4;
  EXPECT_TRUE(support::check_against_reference<float>(s));
}

TEST(EdgeCases, RowsBeyondSequenceLengthAreNotWritten) {
  Buffers b(2, 4, 4, 1, 1, 4);
  auto in = b.inputs();
  in.seq.q = {2, 4};
  attnref::attention(in, attnref::AttentionParams{}, b.outputs());
  for (Index i = 2; i < 4; ++i)
    for (Index d = 0; d < 4; ++d) EXPECT_EQ(b.o[static_cast<size_t>(i * 4 + d)], 777.0f);
}

TEST(EdgeCases, ZeroBatchIsANoOp) {
  Buffers b(0, 4, 4, 2, 1, 4);
  EXPECT_NO_THROW(attnref::attention(b.inputs(), attnref::AttentionParams{}, b.outputs()));
}

}  // namespace edge_test

namespace edge_test {

// int8 storage is read as exact integer values (the quantized operators add their scales).
TEST(Int8Storage, IntegerValuedInputsMatchReference) {
  using attnref::Index;
  const int B = 2, Sq = 5, Skv = 37, N = 4, Nkv = 2, D = 24;
  std::vector<std::int8_t> q(B * Sq * N * D), k(B * Skv * Nkv * D), v(B * Skv * Nkv * D);
  std::uint32_t st = 7;
  auto next = [&] {
    st = st * 1103515245u + 12345u;
    return static_cast<std::int8_t>(static_cast<int>((st >> 16) % 255) - 127);
  };
  for (auto* x : {&q, &k, &v})
    for (auto& e : *x) e = next();
  for (auto level :
       {attnref::detail::simd::Level::Portable, attnref::detail::simd::compiled_level()}) {
    const auto previous = attnref::detail::simd::set_level(level);
    for (Index sq : {Index(1), Index(Sq)}) {
      // q rows of each sequence packed for this q length (the first sq rows of the Sq ones).
      std::vector<std::int8_t> qp;
      ref::Seqs rq(B), rk(B), rv(B);
      for (int b = 0; b < B; ++b) {
        for (Index i = 0; i < sq * N * D; ++i) {
          qp.push_back(q[static_cast<size_t>(b * Sq * N * D + i)]);
          rq[b].push_back(qp.back());
        }
        for (int i = 0; i < Skv * Nkv * D; ++i) {
          rk[b].push_back(k[static_cast<size_t>(b * Skv * Nkv * D + i)]);
          rv[b].push_back(v[static_cast<size_t>(b * Skv * Nkv * D + i)]);
        }
      }
      std::vector<float> o(static_cast<size_t>(B * sq * N * D));
      attnref::AttentionInputs<std::int8_t> in{
          attnref::bsnd_view<const std::int8_t>(qp.data(), B, sq, N, D),
          attnref::bsnd_view<const std::int8_t>(k.data(), B, Skv, Nkv, D),
          attnref::bsnd_view<const std::int8_t>(v.data(), B, Skv, Nkv, D)};
      attnref::AttentionParams p;
      p.scale = 1.0 / (std::sqrt(static_cast<double>(D)) * 127.0 * 40.0);
      p.causal = attnref::CausalMode::BottomRight;
      attnref::attention(
          in, p, attnref::AttentionOutputs<float>{attnref::bsnd_view(o.data(), B, sq, N, D)});
      ref::Problem pr;
      pr.num_heads = N;
      pr.num_kv_heads = Nkv;
      pr.head_size = D;
      pr.v_head_size = D;
      pr.q_len = {static_cast<int>(sq), static_cast<int>(sq)};
      pr.kv_len = {Skv, Skv};
      pr.scale = p.scale;
      pr.causal = ref::Causal::kBottomRight;
      const ref::Result want = ref::attention(pr, rq, rk, rv);
      std::vector<double> got(o.begin(), o.end());
      EXPECT_TRUE(support::all_close(support::flat(want.o), got, {1e-4, 1e-5}))
          << "sq " << sq << " level " << attnref::detail::simd::to_string(level);
    }
    attnref::detail::simd::set_level(previous);
  }
}

}  // namespace edge_test
