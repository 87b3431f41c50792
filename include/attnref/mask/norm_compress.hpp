#pragma once
/// MASK_TYPE_NORM_COMPRESS (isTriuMask = 1): the compressed causal mask of ATB's encoders.
///
/// The user passes one 128 x 128 tile (fp16 DEFAULT: additive values, -10000 above the
/// diagonal; bf16 / HIGH_PRECISION: binary, 1 above the diagonal). The NPU kernel walks the score
/// matrix in 128 x 128 blocks: a block on the diagonal adds the tile, a block below it adds
/// nothing, a block above it is skipped (its keys get probability 0). With query positions
/// shifted by `offset` (kv_len - q_len for PREFIX_ENCODER, whose causal diagonal is aligned
/// bottom-right; 0 otherwise), query i and key j fall in block row (i + offset) / 128 and block
/// column j / 128, and the diagonal block reads tile[(i + offset) % 128][j % 128]. With the
/// documented triangular tile this is exactly the (bottom-right aligned) causal mask
/// (docs/semantics.md §2.4). ENCODER / DECODER / UNDEFINED use offset 0, like the top-left slice
/// [0, seqLen) x [0, tokenOffset) the vendor's golden takes of a mask: a decoder query (row 0)
/// then sees key 0 only, so a compressed mask makes no sense there (use maskType UNDEFINED).

#include <algorithm>

#include "attnref/attention/variant.hpp"
#include "attnref/core/types.hpp"

namespace attnref {

struct NormCompressHook {
  static constexpr Index kTile = 128;
  bool bottom_right = false;  // PREFIX_ENCODER: queries shifted by kv_len - q_len

  Index offset(const SeqInfo& s) const { return bottom_right ? s.kv_len - s.q_len : 0; }
  /// Block row of query i (also the last visible block column).
  Index block(const SeqInfo& s, Index i) const { return (i + offset(s)) / kTile; }

  /// Keys in blocks above the diagonal are skipped.
  bool masked(const SeqInfo& s, Index i, Index j) const { return j / kTile > block(s, i); }
  /// True when (i, j) lies in the diagonal block; then tile_row / tile_col index the tile.
  bool on_diagonal(const SeqInfo& s, Index i, Index j) const { return j / kTile == block(s, i); }
  Index tile_row(const SeqInfo& s, Index i) const { return (i + offset(s)) % kTile; }
  static Index tile_col(Index j) { return j % kTile; }

  /// The keys query i may see: every block up to its diagonal block.
  KvRange visible(const SeqInfo& s, Index i) const {
    return {0, std::min(s.kv_len, (block(s, i) + 1) * kTile)};
  }
  KvRange kv_range(const SeqInfo& s, Index q_begin, Index q_end) const {
    if (q_end <= q_begin) return {0, 0};
    return {0, std::min(s.kv_len, (block(s, q_end - 1) + 1) * kTile)};
  }
  /// None: every key of the tile lies left of the diagonal block of every query (nothing added);
  /// All: every key lies right of it; Partial otherwise.
  TileMask classify(const SeqInfo& s, Index q_begin, Index q_end, Index kv_begin,
                    Index kv_end) const {
    if (kv_begin >= (block(s, q_end - 1) + 1) * kTile) return TileMask::All;
    if (kv_end <= block(s, q_begin) * kTile) return TileMask::None;
    return TileMask::Partial;
  }
};

}  // namespace attnref
