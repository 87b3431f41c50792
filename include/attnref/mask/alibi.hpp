#pragma once
/// The compressed ALiBi masks of ATB's encoders (semantics.md §2.5), expanded block by block as
/// the NPU kernel does. Blocks are 128 x 128; for query i (shifted by kv_len − q_len with
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

  /// The value read from the mask for (i, j) of a visible block, before the slope multiply;
  /// `tile(r, c)` reads the [256, 256] tile (or, for HeadMask, row r of the head's mask).
  template <class Tile>
  double value(const SeqInfo& s, Index i, Index j, Tile&& tile) const {
    const Index ip = i + blocks.offset(s);
    const Index m = ip / kTile, n = j / kTile, a = ip % kTile, b = j % kTile;
    const double delta = static_cast<double>((m - n) * kTile) - static_cast<double>(kTile);
    switch (kind) {
      case Kind::Distance:
        return m == n ? tile(a, b) : tile(kTile + a, b) + delta;
      case Kind::Sqrt: {
        if (m == n) return tile(a, b);
        const double x = tile(kTile + a, b);
        return std::sqrt(x * x + delta);
      }
      case Kind::LeftAlign:
        return (m == n ? tile(a, b) : tile(kTile + a, b)) + static_cast<double>(n * kTile);
      case Kind::HeadMask:
        return tile(ip - n * kTile, b);
    }
    return 0.0;
  }
};

}  // namespace attnref
