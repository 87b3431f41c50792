#pragma once
/// The compressed ALiBi masks of ATB's encoders (docs/semantics.md §2.5), expanded block by block
/// as the NPU kernel does. Blocks are 128 x 128; for query i (shifted by kv_len − q_len with
/// PREFIX_ENCODER) and key j, m = i / 128, n = j / 128, a = i % 128, b = j % 128, and blocks
/// above the diagonal (n > m) are skipped (NormCompressHook's block structure).
///
///   ALIBI_COMPRESS, [256, 256] tile M (M[i][j] = i − j, + 60000 above the diagonal) and the
///     negated slopes s_h:  diagonal block  s_h · M[a][b];
///                          block below it  s_h · (M[128 + a][b] + Δ − 128), Δ = 128·(m − n),
///     i.e. s_h · (i − j) = slope_h · (j − i) with the documented tile.
///   ALIBI_COMPRESS_SQRT, M holding sqrt(i − j): off-diagonal blocks use
///     s_h · sqrt(M[128 + a][b]² + Δ − 128) = slope_h · −sqrt(i − j).
///   ALIBI_COMPRESS_LEFT_ALIGN, M[i][j] = j (−inf above the diagonal), positive slopes:
///     s_h · (M[a][b] + 128·n) on the diagonal block, s_h · (M[128 + a][b] + 128·n) below it:
///     slope_h · j, the key's absolute position.
///   ALIBI_COMPRESS with a [headNum, seqLen, 128] mask H (no slopes): the first 128 key columns
///     of the full per-head mask; the bias depends on j − i only, so block n reads the rows
///     shifted by 128·n: H[h][i − 128·n][b].

#include <cmath>

#include "attnref/attention/variant.hpp"
#include "attnref/core/types.hpp"
#include "attnref/mask/norm_compress.hpp"

namespace attnref {

struct AlibiCompressHook {
  enum class Kind { Distance, Sqrt, LeftAlign, HeadMask };
  static constexpr Index kTile = 128;
  Kind kind = Kind::Distance;
  NormCompressHook blocks{};  // causal block structure (and the PREFIX_ENCODER shift)

  /// How query i reads key block n (n <= i's block): the mask row, and what is done to it.
  struct BlockRead {
    Index row;  // row of the tile (HeadMask: of the head's mask)
    float add;  // added to the value (Distance: Δ − 128; LeftAlign: 128·n)
    bool sqrt;  // Sqrt off the diagonal: sqrt(x² + add)
  };
  BlockRead block_read(const SeqInfo& s, Index i, Index n) const {
    const Index ip = i + blocks.offset(s);
    const Index m = ip / kTile, a = ip % kTile;
    const float delta = static_cast<float>((m - n) * kTile - kTile);
    switch (kind) {
      case Kind::Distance:
        return m == n ? BlockRead{a, 0.0f, false} : BlockRead{kTile + a, delta, false};
      case Kind::Sqrt:
        return m == n ? BlockRead{a, 0.0f, false} : BlockRead{kTile + a, delta, true};
      case Kind::LeftAlign:
        return {m == n ? a : kTile + a, static_cast<float>(n * kTile), false};
      case Kind::HeadMask:
        return {ip - n * kTile, 0.0f, false};
    }
    return {a, 0.0f, false};
  }
  static float apply(const BlockRead& r, float x) {
    return r.sqrt ? std::sqrt(x * x + r.add) : x + r.add;
  }

  /// The value read from the mask for (i, j) of a visible block, before the slope multiply;
  /// `tile(r, c)` reads the [256, 256] tile (or, for HeadMask, row r of the head's mask).
  template <class Tile>
  float value(const SeqInfo& s, Index i, Index j, Tile&& tile) const {
    const BlockRead r = block_read(s, i, j / kTile);
    return apply(r, tile(r.row, j % kTile));
  }
};

}  // namespace attnref
