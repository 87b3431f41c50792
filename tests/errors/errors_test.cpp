// Every input check of attnref::attention: exception type, message, and untouched outputs.

#include "support/errors.hpp"

#include <gtest/gtest.h>

#include <attnref/attnref.hpp>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "support/bits.hpp"

namespace errors_test {

using attnref::Index;

struct Fixture {
  Index B = 2, Sq = 3, Skv = 5, N = 4, Nkv = 2, D = 8, Dv = 6;
  std::vector<float> q, k, v, o, lse, probs;
  std::vector<std::uint8_t> mask;
  attnref::AttentionInputs<float> in;
  attnref::AttentionParams p;
  attnref::AttentionOutputs<float> out;
  attnref::ExecConfig x;
  Fixture() {
    q.assign(static_cast<size_t>(B * Sq * N * D), 0.5f);
    k.assign(static_cast<size_t>(B * Skv * Nkv * D), 0.25f);
    v.assign(static_cast<size_t>(B * Skv * Nkv * Dv), 1.0f);
    o.assign(static_cast<size_t>(B * Sq * N * Dv), 42.0f);
    lse.assign(static_cast<size_t>(B * N * Sq), 42.0f);
    probs.assign(static_cast<size_t>(B * N * Sq * Skv), 42.0f);
    mask.assign(static_cast<size_t>(B * Sq * Skv), 0);
    in.q = attnref::bsnd_view<const float>(q.data(), B, Sq, N, D);
    in.k = attnref::bsnd_view<const float>(k.data(), B, Skv, Nkv, D);
    in.v = attnref::bsnd_view<const float>(v.data(), B, Skv, Nkv, Dv);
    out.o = attnref::bsnd_view(o.data(), B, Sq, N, Dv);
    out.lse = attnref::StridedView<float, 3>(lse.data(), {B, N, Sq});
    out.probs = attnref::StridedView<float, 4>(probs.data(), {B, N, Sq, Skv});
  }
  bool outputs_untouched() const {
    for (float x : o)
      if (x != 42.0f) return false;
    for (float x : lse)
      if (x != 42.0f) return false;
    for (float x : probs)
      if (x != 42.0f) return false;
    return true;
  }
};

template <class Exception>
void expect_error(const std::function<void(Fixture&)>& mutate, const std::string& fragment) {
  Fixture s;
  mutate(s);
  support::expect_rejected_by<Exception>([&] { attnref::attention(s.in, s.p, s.out, s.x); },
                                         "attention", {fragment, "expected ", ", got "});
  // validate() is the same checks alone
  support::expect_rejected_by<Exception>([&] { attnref::validate(s.in, s.p, s.out, s.x); },
                                         "attention", {fragment, "expected ", ", got "});
  EXPECT_TRUE(s.outputs_untouched()) << "an output was written before the check failed";
}

using IA = std::invalid_argument;

TEST(Errors, ValidSetupRuns) {
  Fixture s;
  EXPECT_NO_THROW(attnref::attention(s.in, s.p, s.out));
  EXPECT_FALSE(s.outputs_untouched());
}

TEST(Errors, HeadsNotMultipleOfKvHeads) {
  expect_error<IA>(
      [](Fixture& s) {
        s.in.k = attnref::bsnd_view<const float>(s.k.data(), s.B, s.Skv - 2, 3, s.D);
        s.in.v = attnref::bsnd_view<const float>(s.v.data(), s.B, s.Skv - 2, 3, s.Dv);
      },
      "q.shape[2] (num_heads) not a multiple of num_kv_heads: expected a multiple of 3, got 4");
}

TEST(Errors, HeadSizeMismatch) {
  expect_error<IA>(
      [](Fixture& s) { s.in.k = attnref::bsnd_view<const float>(s.k.data(), s.B, s.Skv, 4, 4); },
      "k.shape[3] (head_size) mismatch with q: expected 8, got 4");
}

TEST(Errors, ValueHeadsMismatch) {
  expect_error<IA>(
      [](Fixture& s) { s.in.v = attnref::bsnd_view<const float>(s.v.data(), s.B, s.Skv, 1, 6); },
      "v.shape[2] (num_kv_heads) mismatch with k: expected 2, got 1");
}

TEST(Errors, ValueSequenceMismatch) {
  expect_error<IA>(
      [](Fixture& s) { s.in.v = attnref::bsnd_view<const float>(s.v.data(), s.B, 4, 2, 6); },
      "v.shape[1] (kv sequence) mismatch with k: expected 5, got 4");
}

TEST(Errors, ValueBatchMismatch) {
  expect_error<IA>(
      [](Fixture& s) { s.in.v = attnref::bsnd_view<const float>(s.v.data(), 1, 5, 2, 6); },
      "v.shape[0] (batch) mismatch with k: expected 2, got 1");
}

TEST(Errors, KvBatchMismatch) {
  expect_error<IA>(
      [](Fixture& s) {
        s.in.k = attnref::bsnd_view<const float>(s.k.data(), 1, 5, 2, 8);
        s.in.v = attnref::bsnd_view<const float>(s.v.data(), 1, 5, 2, 6);
      },
      "k.shape[0] (batch) mismatch with q: expected 2, got 1");
}

TEST(Errors, ZeroOrNegativeSizes) {
  expect_error<IA>(
      [](Fixture& s) { s.in.q = attnref::bsnd_view<const float>(s.q.data(), 2, 3, 0, 8); },
      "q.shape[2] (num_heads) not positive: expected >= 1, got 0");
  expect_error<IA>(
      [](Fixture& s) { s.in.q = attnref::bsnd_view<const float>(s.q.data(), 2, 3, 4, 0); },
      "q.shape[3] (head_size) not positive");
  expect_error<IA>(
      [](Fixture& s) {  // (bsnd_view itself rejects a negative extent: explicit strides here)
        s.in.q = attnref::StridedView<const float, 4>(s.q.data(), {2, -3, 4, 8}, {96, 32, 8, 1});
      },
      "q.shape[1] negative: expected >= 0, got -3");
  expect_error<IA>(
      [](Fixture& s) { s.in.k = attnref::bsnd_view<const float>(s.k.data(), 2, 5, 0, 8); },
      "k.shape[2] (num_kv_heads) not positive");
  expect_error<IA>(
      [](Fixture& s) { s.in.v = attnref::bsnd_view<const float>(s.v.data(), 2, 5, 2, 0); },
      "v.shape[3] (v_head_size) not positive");
}

TEST(Errors, NonFiniteScale) {
  expect_error<IA>([](Fixture& s) { s.p.scale = std::numeric_limits<double>::quiet_NaN(); },
                   "params.scale not finite");
  expect_error<IA>([](Fixture& s) { s.p.scale = std::numeric_limits<double>::infinity(); },
                   "params.scale not finite: expected a finite value, got inf");
}

// A tile longer than every sequence is the whole sequence: the bits of the exact-fit tiles, and no
// size arithmetic on 2^63 - 1 rows (UBSan would report the overflow).
TEST(Errors, TilesLongerThanEverySequenceAreTheWholeSequence) {
  Fixture a, b;
  for (Fixture* f : {&a, &b}) {
    for (size_t i = 0; i < f->q.size(); ++i) f->q[i] = std::sin(0.7f * static_cast<float>(i));
    for (size_t i = 0; i < f->k.size(); ++i) f->k[i] = std::cos(0.3f * static_cast<float>(i));
    for (size_t i = 0; i < f->v.size(); ++i) f->v[i] = std::sin(0.11f * static_cast<float>(i));
  }
  a.x.q_tile = a.x.kv_tile = std::numeric_limits<Index>::max();
  b.x.q_tile = b.Sq;
  b.x.kv_tile = b.Skv;
  attnref::attention(a.in, a.p, a.out, a.x);
  attnref::attention(b.in, b.p, b.out, b.x);
  EXPECT_FALSE(a.outputs_untouched());
  EXPECT_TRUE(support::same_bits(a.o, b.o) && support::same_bits(a.lse, b.lse) &&
              support::same_bits(a.probs, b.probs));
}

TEST(Errors, NegativeTuning) {
  expect_error<IA>([](Fixture& s) { s.x.threads = -1; }, "exec.threads negative");
  expect_error<IA>([](Fixture& s) { s.p.window = -1; }, "params.window negative");
  expect_error<IA>([](Fixture& s) { s.p.window = 4; },
                   "params.window set without a causal mode: expected CausalMode::TopLeft or "
                   "BottomRight with a window, got CausalMode::None");
  expect_error<IA>([](Fixture& s) { s.x.q_tile = -2; }, "exec.q_tile negative");
  expect_error<IA>([](Fixture& s) { s.x.kv_tile = -2; }, "exec.kv_tile negative");
}

TEST(Errors, SequenceLengthsBeyondExtents) {
  expect_error<IA>(
      [](Fixture& s) {
        s.in.seq.q = {3, 4};
      },
      "seq.q[1] exceeds q.shape[1]: expected <= 3, got 4");
  expect_error<IA>(
      [](Fixture& s) {
        s.in.seq.kv = {6, 1};
      },
      "seq.kv[0] exceeds k.shape[1]: expected <= 5, got 6");
  expect_error<IA>([](Fixture& s) { s.in.seq.q = {1}; }, "seq.q size mismatch: expected 2, got 1");
  expect_error<IA>([](Fixture& s) { s.in.seq.kv = {-1, 2}; }, "seq.kv[0] negative");
}

TEST(Errors, CumulativeOffsets) {
  auto packed = [](Fixture& s) {
    s.in.q = attnref::tnd_view<const float>(s.q.data(), 6, 4, 8);
    s.in.k = attnref::tnd_view<const float>(s.k.data(), 10, 2, 8);
    s.in.v = attnref::tnd_view<const float>(s.v.data(), 10, 2, 6);
    s.out.o = attnref::tnd_view(s.o.data(), 6, 4, 6);
    s.out.lse = {};
    s.out.probs = {};
  };
  expect_error<IA>(
      [&](Fixture& s) {
        packed(s);
        s.in.seq.q_cu = {0, 4, 3};
        s.in.seq.kv_cu = {0, 5, 10};
      },
      "seq.q_cu[2] not non-decreasing: expected >= 4, got 3");
  expect_error<IA>(
      [&](Fixture& s) {
        packed(s);
        s.in.seq.q_cu = {0, 3, 6};
        s.in.seq.kv_cu = {0, 5, 11};
      },
      "seq.kv_cu[2] exceeds k.shape[1] (tokens): expected <= 10, got 11");
  expect_error<IA>(
      [&](Fixture& s) {
        packed(s);
        s.in.seq.q_cu = {0, 3, 6};
        s.in.seq.kv_cu = {0, 10};
      },
      "seq.kv_cu size mismatch: expected 3, got 2");
  expect_error<IA>(
      [&](Fixture& s) {
        packed(s);
        s.in.seq.q_cu = {0, 3, 6};
        s.in.seq.kv_cu = {0, 5, 10};
        s.in.seq.q = {3, 3};
      },
      "seq.q given together with seq.q_cu");
  expect_error<IA>(
      [&](Fixture& s) {
        s.in.seq.q_cu = {0, 3, 6};  // q view has batch extent 2, not 1
      },
      "q.shape[0] must be 1 for packed (TND) q with q_cu");
  expect_error<IA>(
      [&](Fixture& s) {
        packed(s);
        s.in.seq.q_cu = {-1, 3, 6};
        s.in.seq.kv_cu = {0, 5, 10};
      },
      "seq.q_cu[0] negative");
}

TEST(Errors, OutputShape) {
  expect_error<IA>([](Fixture& s) { s.out.o = attnref::bsnd_view(s.o.data(), 2, 3, 4, 5); },
                   "o.shape mismatch: expected [2, 3, 4, 6], got [2, 3, 4, 5]");
  expect_error<IA>(
      [](Fixture& s) {
        s.out.lse = attnref::StridedView<float, 3>(s.lse.data(), {2, 3, 4});
      },
      "lse.shape mismatch: expected [2, 4, 3], got [2, 3, 4]");
  expect_error<IA>(
      [](Fixture& s) {
        s.out.probs = attnref::StridedView<float, 4>(s.probs.data(), {2, 4, 3, 4});
      },
      "probs.shape mismatch: expected [2, 4, 3, >= 5]");
}

TEST(Errors, NullData) {
  expect_error<IA>(
      [](Fixture& s) { s.in.q = attnref::bsnd_view<const float>(nullptr, 2, 3, 4, 8); },
      "q data is null");
}

TEST(Errors, MaskShapes) {
  expect_error<IA>(
      [](Fixture& s) {
        s.in.mask_bool = attnref::StridedView<const std::uint8_t, 4>(s.mask.data(), {3, 1, 3, 5});
      },
      "mask_bool.shape[0] mismatch: expected 1 or 2, got 3");
  expect_error<IA>(
      [](Fixture& s) {
        s.in.mask_bool = attnref::StridedView<const std::uint8_t, 4>(s.mask.data(), {1, 3, 3, 5});
      },
      "mask_bool.shape[1] mismatch: expected 1 or 4, got 3");
  expect_error<IA>(
      [](Fixture& s) {
        s.in.mask_bool = attnref::StridedView<const std::uint8_t, 4>(s.mask.data(), {2, 1, 2, 5});
      },
      "mask_bool.shape[2] smaller than the longest q sequence: expected >= 3, got 2");
  expect_error<IA>(
      [](Fixture& s) {
        s.in.mask_add = attnref::StridedView<const float, 4>(s.lse.data(), {1, 1, 3, 4});
      },
      "mask_add.shape[3] smaller than the longest kv sequence: expected >= 5, got 4");
}

TEST(Errors, OutputOverlappingAnInput) {
  expect_error<IA>(
      [](Fixture& s) {
        s.in.q = attnref::bsnd_view<const float>(s.o.data(), 2, 3, 4, 6);
        s.in.k = attnref::bsnd_view<const float>(s.k.data(), 2, 5, 2, 6);
      },
      "o overlaps an input: expected memory disjoint from q");
  expect_error<IA>(
      [](Fixture& s) {
        s.out.lse = attnref::StridedView<float, 3>(s.o.data() + 1, {2, 4, 3});
      },
      "lse overlaps an input: expected memory disjoint from o");
}

TEST(Errors, CustomVariantRejectsBuiltInMasks) {
  Fixture s;
  s.p.causal = attnref::CausalMode::TopLeft;
  attnref::DefaultVariant var;
  EXPECT_THROW(attnref::attention_with(var, s.in, s.p, s.out), std::invalid_argument);
  EXPECT_TRUE(s.outputs_untouched());
}

TEST(Errors, LayoutHelperRejectsBatchedTnd) {
  std::vector<float> buf(10);
  EXPECT_THROW(attnref::make_qkv_view(buf.data(), attnref::Layout::TND, 2, 5, 1, 1),
               std::invalid_argument);
}

}  // namespace errors_test

namespace errors_test {

// Paged K/V: the fixture's k / v reinterpreted as pools of 2-token blocks (5 blocks per batch
// entry -> 5 blocks of [2, Nkv, D] in each of the first 2 * 5 * 2 / 2 rows).
struct PagedSetup {
  std::vector<std::int32_t> table;
  void apply(Fixture& s, std::vector<std::int32_t> t, Index cols = 3) {
    table = std::move(t);
    s.in.k = attnref::StridedView<const float, 4>(s.k.data(), {5, 2, s.Nkv, s.D});
    s.in.v = attnref::StridedView<const float, 4>(s.v.data(), {5, 2, s.Nkv, s.Dv});
    s.in.seq.kv = {5, 4};
    s.in.block_table = attnref::StridedView<const std::int32_t, 2>(table.data(), {s.B, cols});
    s.out.probs = {};
  }
};

TEST(Errors, PagedSetupRuns) {
  Fixture s;
  PagedSetup ps;
  ps.apply(s, {0, 1, 2, 4, 3, -1});  // -1 past the second sequence's last block is never read
  EXPECT_NO_THROW(attnref::attention(s.in, s.p, s.out));
}

TEST(Errors, BlockTableEntryOutOfRange) {
  PagedSetup ps;
  expect_error<std::out_of_range>(
      [&](Fixture& s) {
        ps.apply(s, {0, 1, 5, 4, 3, -1});
      },
      "block_table[0][2] out of range: expected [0, 5), got 5");
  expect_error<std::out_of_range>(
      [&](Fixture& s) {
        ps.apply(s, {0, 1, 2, -1, 3, -1});
      },
      "block_table[1][0] out of range");
}

TEST(Errors, BlockTableTooShortOrMisshaped) {
  PagedSetup ps;
  expect_error<IA>(
      [&](Fixture& s) {
        ps.apply(s, {0, 1, 2, 3}, 2);
      },
      "seq.kv[0] exceeds block_table.shape[1] * block_size");
  expect_error<IA>(
      [&](Fixture& s) {
        ps.apply(s, {0, 1, 2, 4, 3, -1});
        s.in.seq.kv.clear();
      },
      "seq.kv missing with a block table");
  expect_error<IA>(
      [&](Fixture& s) {
        ps.apply(s, {0, 1, 2, 4, 3, -1});
        s.in.block_table = attnref::StridedView<const std::int32_t, 2>(ps.table.data(), {1, 3});
      },
      "block_table.shape[0] mismatch with the batch");
}

}  // namespace errors_test
