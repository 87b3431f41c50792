#pragma once
/// MASK_TYPE_SLIDING_WINDOW_COMPRESS: expansion of the [512, 512] SWA pattern, and the rolling
/// SWA kv cache (cacheType SWA).
///
/// The pattern (mask/builders.hpp: swa_compress_mask) is triu(1) + tril(−W') of size 512, W' the
/// "true size" of the window W for the kernel's block size B (128, or 64 for head sizes above
/// 128). The kernel walks the scores in B x B blocks; for query i and key j, with block distance
/// d = i/B − j/B and a = i % B, b = j % B:
///   d < 0                      block skipped (keys after the query)
///   d = 0                      pattern row a            (the diagonal block)
///   d > 0, r = d − o in [1, 3] pattern row r·B + a      (blocks crossing the window's edge)
///   d > 0, r < 1               nothing added            (blocks inside the window)
///   r > 3                      block skipped            (blocks left of the window)
/// with o = 0 when W <= 3B, W/B − 3 when W is a multiple of B, W/B − 2 otherwise, so that
/// B·r + a − b >= W' exactly when B·d + a − b >= W: with the documented pattern the expansion is
/// the sliding window i − W < j <= i (tested against the full SWA mask), and a pattern with other
/// content is read the way the kernel reads it.

#include <algorithm>
#include <stdexcept>
#include <string>

#include "attnref/attention/variant.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"
#include "attnref/mask/builders.hpp"

namespace attnref {

struct SwaCompressHook {
  static constexpr Index kSize = 512;
  static constexpr Index kFree = -1;     // no pattern value: inside the window
  static constexpr Index kSkipped = -2;  // outside the window or after the query
  Index block = 128;
  Index offset = 0;  // o, in blocks

  static SwaCompressHook make(Index window, Index head_size, Index v_head_size = 0) {
    SwaCompressHook h;
    h.block = swa_compress_block(head_size, v_head_size);
    const Index w = window;
    h.offset = w <= 3 * h.block ? 0 : (w % h.block == 0 ? w / h.block - 3 : w / h.block - 2);
    return h;
  }

  /// Pattern row for (i, j), or kFree / kSkipped.
  Index pattern_row(Index i, Index j) const {
    const Index d = i / block - j / block;
    if (d < 0) return kSkipped;
    if (d == 0) return i % block;
    const Index r = d - offset;
    if (r < 1) return kFree;
    if (r > 3) return kSkipped;
    return r * block + i % block;
  }
  Index pattern_col(Index j) const { return j % block; }

  bool masked(const SeqInfo&, Index i, Index j) const { return pattern_row(i, j) == kSkipped; }
  /// Keys of the blocks query i reads.
  KvRange visible(const SeqInfo& s, Index i) const {
    const Index m = i / block;
    const Index first = std::max<Index>(0, (m - offset - 3) * block);
    const Index end = std::min(s.kv_len, (m + 1) * block);
    return {std::min(first, end), end};
  }
  KvRange kv_range(const SeqInfo& s, Index q_begin, Index q_end) const {
    if (q_end <= q_begin) return {0, 0};
    return {visible(s, q_begin).begin, visible(s, q_end - 1).end};
  }
  TileMask classify(const SeqInfo& s, Index q_begin, Index q_end, Index kv_begin,
                    Index kv_end) const {
    if (kv_begin >= visible(s, q_end - 1).end || kv_end <= visible(s, q_begin).begin)
      return TileMask::All;
    const Index d_max = (q_end - 1) / block - kv_begin / block;
    const Index d_min = q_begin / block - (kv_end - 1) / block;
    if (d_min >= 1 && d_max - offset < 1) return TileMask::None;  // every pair inside the window
    return TileMask::Partial;
  }
};

/// Rolling SWA cache (cacheType SWA): token t of a sequence lives in slot t % window; after
/// appending, the slots [0, min(window, length)) hold the last `window` tokens (their order does
/// not matter to attention without a position bias).
inline Index swa_cache_slot(Index token, Index window) { return token % window; }

/// Writes tokens first .. first + n − 1 (rows of `tokens`, [n, hidden]) into a rolling cache
/// ([rows >= min(window, first + n), hidden]); only the last `window` of them survive, so only
/// those are written.
template <class T>
void swa_cache_write(const StridedView<T, 2>& cache, const StridedView<const T, 2>& tokens,
                     Index first, Index window) {
  constexpr const char* fn = "swa_cache_write";
  ATTNREF_CHECK(window > 0, std::invalid_argument, fn, "window", "not positive", "> 0", window);
  ATTNREF_CHECK(first >= 0, std::invalid_argument, fn, "first", "negative", ">= 0", first);
  const Index n = tokens.size(0);
  ATTNREF_CHECK(tokens.size(1) == cache.size(1), std::invalid_argument, fn, "tokens.shape[1]",
                "mismatch with cache.shape[1]", cache.size(1), tokens.size(1));
  const Index need = std::min(window, first + n);
  ATTNREF_CHECK(cache.size(0) >= need, std::invalid_argument, fn, "cache.shape[0]",
                "smaller than the slots used", ">= " + std::to_string(need), cache.size(0));
  for (Index r = std::max<Index>(0, n - window); r < n; ++r) {
    const Index slot = swa_cache_slot(first + r, window);
    for (Index x = 0; x < tokens.size(1); ++x) cache(slot, x) = tokens(r, x);
  }
}

}  // namespace attnref
