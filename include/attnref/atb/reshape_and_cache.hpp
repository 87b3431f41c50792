#pragma once
/// attnref::reshape_and_cache — ATB ReshapeAndCacheOperation (docs/semantics.md §4): writes the key
/// (and value) rows of new tokens into a paged KV cache at the slots of `slot_mapping`.
///
///   key            [numTokens, kvHead, headSizeK]
///   value          [numTokens, kvHead, headSizeV]   absent: K only (V bypass)
///   slot_mapping   [numTokens] int32: token i goes to block s / blockSize, row s % blockSize;
///                  a negative slot skips the token
///   ND caches      [numBlocks, blockSize, kvHead, headSize(V)]          (reshape_and_cache)
///   NZ caches      [numBlocks, kvHead·headSize(V) / C0, blockSize, C0]  (reshape_and_cache_nz;
///                  C0 = 32 bytes of elements: 16 for fp16 / bf16, 32 for int8; a block is a
///                  [blockSize, kvHead·headSize] matrix in FRACTAL_NZ, attnref/core/nz.hpp)
///
/// The copy is exact (any element type). Tokens are written in order, so when two tokens name
/// the same slot the later one stays. Every check runs before anything is written: shapes
/// (std::invalid_argument) and slots at or beyond numBlocks·blockSize (std::out_of_range,
/// naming the entry, e.g. "slot_mapping[3]").

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "attnref/core/error.hpp"
#include "attnref/core/nz.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

template <class T>
struct ReshapeAndCacheInputs {
  StridedView<const T, 3> key;                      ///< [numTokens, kvHead, headSizeK]
  StridedView<const T, 3> value{};                  ///< [numTokens, kvHead, headSizeV] or absent
  StridedView<const std::int32_t, 1> slot_mapping;  ///< [numTokens]
};

namespace detail {

/// Shared checks; returns the number of slots of the cache (numBlocks · blockSize).
template <class T>
Index rac_check(const char* fn, const ReshapeAndCacheInputs<T>& in, bool has_value_cache,
                Index num_blocks, Index block_size) {
  const Index tokens = in.key.size(0);  // key, value and slot_mapping passed check_views
  ATTNREF_CHECK(in.slot_mapping.size(0) == tokens, std::invalid_argument, fn,
                "slot_mapping.shape[0]", "mismatch with key.shape[0] (numTokens)", tokens,
                in.slot_mapping.size(0));
  ATTNREF_CHECK(in.value.absent() == !has_value_cache, std::invalid_argument, fn,
                "value/value_cache", "given one without the other", "both or neither",
                in.value.absent() ? "a value cache without value" : "value without a value cache");
  if (!in.value.absent())
    ATTNREF_CHECK(
        in.value.size(0) == tokens && in.value.size(1) == in.key.size(1), std::invalid_argument, fn,
        "value.shape", "mismatch with key",
        "[" + std::to_string(tokens) + ", " + std::to_string(in.key.size(1)) + ", headSizeV]",
        shape_str(in.value));
  ATTNREF_CHECK(block_size > 0, std::invalid_argument, fn, "cache blockSize", "not positive",
                ">= 1", block_size);
  const Index slots = checked_mul(fn, "numBlocks * blockSize", num_blocks, block_size);
  for (Index i = 0; i < tokens; ++i) {
    const std::int32_t s = in.slot_mapping(i);
    ATTNREF_CHECK(s < slots, std::out_of_range, fn, "slot_mapping[" + std::to_string(i) + "]",
                  "out of range", "< " + std::to_string(slots) + " (numBlocks * blockSize)", s);
  }
  return slots;
}

/// The edge checks of every view argument (extents, sizes, null data).
template <class T>
void rac_check_views(const char* fn, const ReshapeAndCacheInputs<T>& in,
                     const StridedView<T, 4>& key_cache, const StridedView<T, 4>& value_cache) {
  check_view(fn, "key", in.key);
  check_view(fn, "value", in.value);
  check_view(fn, "slot_mapping", in.slot_mapping);
  check_view(fn, "key_cache", key_cache);
  check_view(fn, "value_cache", value_cache);
}

/// The caches must not overlap the inputs nor each other.
template <class T>
void rac_check_overlaps(const char* fn, const ReshapeAndCacheInputs<T>& in,
                        const StridedView<T, 4>& key_cache, const StridedView<T, 4>& value_cache) {
  for (const auto* c : {&key_cache, &value_cache}) {
    ATTNREF_CHECK(
        !overlaps(*c, in.key) && !overlaps(*c, in.value) && !overlaps(*c, in.slot_mapping),
        std::invalid_argument, fn, c == &key_cache ? "key_cache" : "value_cache",
        "overlaps an input", "disjoint memory", "overlapping memory");
  }
  ATTNREF_CHECK(!overlaps(key_cache, value_cache), std::invalid_argument, fn, "value_cache",
                "overlaps key_cache", "disjoint memory", "overlapping memory");
}

}  // namespace detail

/// ReshapeAndCache into ND caches [numBlocks, blockSize, kvHead, headSize(V)].
template <class T>
void reshape_and_cache(const ReshapeAndCacheInputs<T>& in, const StridedView<T, 4>& key_cache,
                       const StridedView<T, 4>& value_cache = {}) {
  constexpr const char* fn = "reshape_and_cache";
  detail::rac_check_views(fn, in, key_cache, value_cache);
  const Index heads = in.key.size(1);
  ATTNREF_CHECK(!key_cache.absent(), std::invalid_argument, fn, "key_cache", "missing",
                "[numBlocks, blockSize, kvHead, headSize]", "none");
  ATTNREF_CHECK(key_cache.size(2) == heads && key_cache.size(3) == in.key.size(2),
                std::invalid_argument, fn, "key_cache.shape", "mismatch with key",
                "[numBlocks, blockSize, " + std::to_string(heads) + ", " +
                    std::to_string(in.key.size(2)) + "]",
                detail::shape_str(key_cache));
  if (!value_cache.absent() && !in.value.absent())
    ATTNREF_CHECK(
        value_cache.size(0) == key_cache.size(0) && value_cache.size(1) == key_cache.size(1) &&
            value_cache.size(2) == heads && value_cache.size(3) == in.value.size(2),
        std::invalid_argument, fn, "value_cache.shape", "mismatch",
        "[" + std::to_string(key_cache.size(0)) + ", " + std::to_string(key_cache.size(1)) + ", " +
            std::to_string(heads) + ", " + std::to_string(in.value.size(2)) + "]",
        detail::shape_str(value_cache));
  detail::rac_check(fn, in, !value_cache.absent(), key_cache.size(0), key_cache.size(1));
  detail::rac_check_overlaps(fn, in, key_cache, value_cache);
  const Index bs = key_cache.size(1);
  for (Index i = 0; i < in.key.size(0); ++i) {
    const std::int32_t s = in.slot_mapping(i);
    if (s < 0) continue;
    const Index blk = s / bs, off = s % bs;
    for (Index h = 0; h < heads; ++h) {
      for (Index e = 0; e < in.key.size(2); ++e) key_cache(blk, off, h, e) = in.key(i, h, e);
      if (!in.value.absent())
        for (Index e = 0; e < in.value.size(2); ++e)
          value_cache(blk, off, h, e) = in.value(i, h, e);
    }
  }
}

/// ReshapeAndCache into NZ caches [numBlocks, kvHead·headSize(V) / C0, blockSize, C0]
/// (blockSize a multiple of 16, kvHead·headSize(V) a multiple of C0).
template <class T>
void reshape_and_cache_nz(const ReshapeAndCacheInputs<T>& in, const StridedView<T, 4>& key_cache,
                          const StridedView<T, 4>& value_cache = {}) {
  constexpr const char* fn = "reshape_and_cache_nz";
  detail::rac_check_views(fn, in, key_cache, value_cache);
  constexpr Index c0 = nz_c0<T>();
  const Index heads = in.key.size(1);
  ATTNREF_CHECK(!key_cache.absent(), std::invalid_argument, fn, "key_cache", "missing",
                "[numBlocks, hidden / C0, blockSize, C0]", "none");
  const Index bs = key_cache.size(2);
  ATTNREF_CHECK(bs % 16 == 0, std::invalid_argument, fn, "key_cache.shape[2] (blockSize)",
                "not a multiple of 16 (NZ)", "a multiple of 16", bs);
  auto check_cache = [&](const StridedView<T, 4>& c, const char* name, Index hidden) {
    ATTNREF_CHECK(hidden % c0 == 0, std::invalid_argument, fn,
                  std::string(name) + " kvHead * headSize", "not a multiple of C0 (NZ)",
                  "a multiple of " + std::to_string(c0), hidden);
    const std::array<Index, 4> want{key_cache.size(0), hidden / c0, bs, c0};
    ATTNREF_CHECK(c.shape() == want, std::invalid_argument, fn, std::string(name) + ".shape",
                  "mismatch", detail::shape_str<4>(want), detail::shape_str(c));
  };
  check_cache(key_cache, "key_cache", heads * in.key.size(2));
  if (!value_cache.absent() && !in.value.absent())
    check_cache(value_cache, "value_cache", heads * in.value.size(2));
  detail::rac_check(fn, in, !value_cache.absent(), key_cache.size(0), bs);
  detail::rac_check_overlaps(fn, in, key_cache, value_cache);
  for (Index i = 0; i < in.key.size(0); ++i) {
    const std::int32_t s = in.slot_mapping(i);
    if (s < 0) continue;
    const Index blk = s / bs, off = s % bs;
    // The token's flattened kvHead·headSize row: element x goes to chunk x / C0, lane x % C0.
    for (Index h = 0; h < heads; ++h) {
      const Index dk = in.key.size(2);
      for (Index e = 0; e < dk; ++e) {
        const Index x = h * dk + e;
        key_cache(blk, x / c0, off, x % c0) = in.key(i, h, e);
      }
      if (!in.value.absent()) {
        const Index dv = in.value.size(2);
        for (Index e = 0; e < dv; ++e) {
          const Index x = h * dv + e;
          value_cache(blk, x / c0, off, x % c0) = in.value(i, h, e);
        }
      }
    }
  }
}

}  // namespace attnref
