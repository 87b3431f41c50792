// The engine's int8 paths: q·k of int8 data reaches the hooks as the exact int32 product, and
// the quantize_p hook's integer P times int8 V is exact, tile by tile, with the hook's row state
// carried across the tiles of a row in key order.

#include <gtest/gtest.h>

#include <atomic>
#include <attnref/attention/attention.hpp>
#include <attnref/detail/gemm_i8.hpp>
#include <cstdint>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "support/random.hpp"
#include "support/simd_levels.hpp"

namespace quantize_p_test {

using attnref::Coord;
using attnref::Index;
using attnref::KvRange;
using attnref::SeqInfo;
using attnref::StridedView;
using attnref::TileMask;
namespace simd = attnref::detail::simd;
using support::extreme_i8;

// Records the raw score of every (head, query, key); every key visible.
struct RecordScores {
  std::vector<double>* raw;
  Index heads, len;
  bool has_transform() const { return true; }
  KvRange kv_range(const SeqInfo& s, Index, Index) const { return {0, s.kv_len}; }
  TileMask classify(const SeqInfo&, Index, Index, Index, Index) const { return TileMask::None; }
  bool masked(const SeqInfo&, const Coord&) const { return false; }
  template <class Acc>
  Acc transform(const SeqInfo&, const Coord& c, Acc s) const {
    (*raw)[static_cast<size_t>((c.q_head * len + c.q) * len + c.kv)] = static_cast<double>(s);
    return Acc(0);
  }
};

// The same with a quantize_p hook (P left at 0): the int8 kernels' Q·Kᵀ when they are enabled.
struct RecordScoresQuant : RecordScores {
  template <class Acc>
  Acc quantize_p(const Coord&, Acc* row, Index cols, Acc&, Acc& sum) const {
    std::fill(row, row + cols, Acc(0));
    sum = Acc(1);
    return Acc(0);
  }
};

template <class Variant>
void check_scores(simd::Level level) {
  std::mt19937 rng(3);
  // (len, kv_tile): tiles of 24 keys, and of 72 (the VNNI kernels' 64-column block and a
  // partial 16-column one)
  for (const auto& [len, tile] : {std::pair<Index, Index>{40, 24}, {72, 72}})
    for (Index d : {32, 576, 1024}) {
      const Index heads = 2;
      auto q = extreme_i8(static_cast<size_t>(len * heads * d), rng);
      auto k = extreme_i8(static_cast<size_t>(len * d), rng);
      if (d == 1024) {  // the largest magnitude: 1024 · (-128)² = 2^24
        std::fill(q.begin(), q.begin() + d, std::int8_t{-128});
        std::fill(k.begin(), k.begin() + d, std::int8_t{-128});
      }
      const std::vector<std::int8_t> v(static_cast<size_t>(len * 8), 1);
      std::vector<float> o(static_cast<size_t>(len * heads * 8));
      attnref::AttentionInputs<std::int8_t> in;
      in.q = StridedView<const std::int8_t, 4>(q.data(), {1, len, heads, d});
      in.k = StridedView<const std::int8_t, 4>(k.data(), {1, len, 1, d});
      in.v = StridedView<const std::int8_t, 4>(v.data(), {1, len, 1, 8});
      std::vector<double> raw(static_cast<size_t>(heads * len * len), -1.0);
      attnref::ExecConfig x;
      x.threads = 1;
      x.kv_tile = tile;
      attnref::attention_with(
          Variant{{&raw, heads, len}}, in, attnref::AttentionParams{},
          attnref::AttentionOutputs<float>{StridedView<float, 4>(o.data(), {1, len, heads, 8})}, x);
      for (Index h = 0; h < heads; ++h)
        for (Index i = 0; i < len; ++i)
          for (Index j = 0; j < len; ++j) {
            std::int64_t dot = 0;
            for (Index e = 0; e < d; ++e)
              dot += static_cast<std::int64_t>(q[static_cast<size_t>((i * heads + h) * d + e)]) *
                     k[static_cast<size_t>(j * d + e)];
            ASSERT_EQ(raw[static_cast<size_t>((h * len + i) * len + j)], static_cast<double>(dot))
                << "d " << d << " head " << h << " q " << i << " k " << j << " level "
                << static_cast<int>(level);
          }
      if (d == 1024) {
        EXPECT_EQ(raw[0], 16777216.0);
      }
    }
}

struct Plain : RecordScores {};

TEST(EngineInt8, ScoresAreTheExactInt32Products) {
  for (simd::Level level : support::simd_levels()) {
    const simd::Level previous = simd::set_level(level);
    check_scores<Plain>(level);
    check_scores<RecordScoresQuant>(level);
    simd::set_level(previous);
  }
}

// Scores 0 (so m = 0 and no rescaling), P replaced by a pattern of int8 values, factor 1, and a
// denominator of 1 (the first tile's sum): the output is Σ over the tiles of P8 · V, exactly.
struct PatternP {
  std::atomic<int>* bad;  // set when a row's state does not count its tiles in key order
  Index tile;
  bool has_transform() const { return true; }
  KvRange kv_range(const SeqInfo& s, Index, Index) const { return {0, s.kv_len}; }
  TileMask classify(const SeqInfo&, Index, Index, Index, Index) const { return TileMask::None; }
  bool masked(const SeqInfo&, const Coord&) const { return false; }
  template <class Acc>
  Acc transform(const SeqInfo&, const Coord&, Acc) const {
    return Acc(0);
  }
  static int p8(Index q, Index kv) { return static_cast<int>((q * 7 + kv * 13) % 256) - 128; }
  template <class Acc>
  Acc quantize_p(const Coord& c, Acc* row, Index cols, Acc& state, Acc& sum) const {
    for (Index j = 0; j < cols; ++j) row[j] = static_cast<Acc>(p8(c.q, c.kv + j));
    // the row state counts this row's tiles; the tile's first key says which tile it is
    if (c.kv % tile != 0 || state != static_cast<Acc>(c.kv / tile)) bad->store(1);
    state += Acc(1);
    sum = c.kv == 0 ? Acc(1) : Acc(0);
    return Acc(1);
  }
};

TEST(EngineInt8, QuantizedPTimesVIsExactTileByTile) {
  std::mt19937 rng(4);
  struct Shape {
    Index len, tile, dv;
  };
  for (simd::Level level : support::simd_levels())
    for (const Shape sh : {Shape{1024, 1024, 16}, Shape{1024, 128, 24}, Shape{300, 100, 8},
                           Shape{77, 33, 40}, Shape{130, 130, 72}}) {
      const simd::Level previous = simd::set_level(level);
      const Index heads = 2;
      const std::vector<std::int8_t> q(static_cast<size_t>(sh.len * heads * 32), 1);
      const std::vector<std::int8_t> k(static_cast<size_t>(sh.len * 32), 1);
      const auto v = extreme_i8(static_cast<size_t>(sh.len * sh.dv), rng);
      std::vector<double> o(static_cast<size_t>(sh.len * heads * sh.dv));
      attnref::AttentionInputs<std::int8_t> in;
      in.q = StridedView<const std::int8_t, 4>(q.data(), {1, sh.len, heads, 32});
      in.k = StridedView<const std::int8_t, 4>(k.data(), {1, sh.len, 1, 32});
      in.v = StridedView<const std::int8_t, 4>(v.data(), {1, sh.len, 1, sh.dv});
      attnref::ExecConfig x;
      x.kv_tile = sh.tile;
      x.q_tile = 64;
      std::atomic<int> bad{0};
      attnref::attention_with(PatternP{&bad, sh.tile}, in, attnref::AttentionParams{},
                              attnref::AttentionOutputs<double>{
                                  StridedView<double, 4>(o.data(), {1, sh.len, heads, sh.dv})},
                              x);
      EXPECT_EQ(bad.load(), 0);
      for (Index h = 0; h < heads; ++h)
        for (Index i = 0; i < sh.len; ++i)
          for (Index e = 0; e < sh.dv; ++e) {
            std::int64_t pv = 0;
            for (Index j = 0; j < sh.len; ++j)
              pv += PatternP::p8(i, j) *
                    static_cast<std::int64_t>(v[static_cast<size_t>(j * sh.dv + e)]);
            const double got = o[static_cast<size_t>((i * heads + h) * sh.dv + e)];
            ASSERT_EQ(got, static_cast<double>(pv))
                << "len " << sh.len << " tile " << sh.tile << " q " << i << " e " << e << " level "
                << static_cast<int>(level);
          }
      simd::set_level(previous);
    }
}

TEST(EngineInt8, VnniKernelsAreCompiledWhereTheMachineHasThem) {
  // Informational on machines without AVX-512 VNNI (the float GEMM path is then the one tested).
  std::printf("int8 VNNI kernels: %s\n", ATTNREF_HAVE_VNNI ? "compiled in" : "not compiled in");
  EXPECT_EQ(attnref::detail::i8::enabled(),
            ATTNREF_HAVE_VNNI && simd::level() == simd::Level::Avx512);
}

}  // namespace quantize_p_test
