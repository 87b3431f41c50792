#pragma once
/// NSA's engine variant (nsa_compress_attention_infer, and DSA's sparse attention): P rounded to
/// the output type before P·V, and the compressed branch's multi-token mask. Not part of the API.

#include <type_traits>
#include <vector>

#include "attnref/attention/variant.hpp"
#include "attnref/core/types.hpp"
#include "attnref/detail/simd.hpp"

namespace attnref::detail {

/// The multi-token mask as an engine hook: the last compressed key gets −3e38 for query rows
/// with q_len − i − 1 > tail[b].
template <class T>
struct NsaVariant {
  const std::vector<Index>* tail = nullptr;  // null: no mask
  bool has_transform() const { return tail != nullptr; }
  KvRange kv_range(const SeqInfo& s, Index, Index) const { return {0, s.kv_len}; }
  TileMask classify(const SeqInfo&, Index, Index, Index, Index) const { return TileMask::None; }
  bool row_interval(const SeqInfo& s, const Coord&, KvRange& v) const {
    v = {0, s.kv_len};
    return true;
  }
  bool masked(const SeqInfo&, const Coord&) const { return false; }
  /// P·V takes the probabilities rounded to the output type (the engine's two-pass mode).
  template <class Acc>
  void round_p(const Coord&, Acc* row, Index cols) const {
    if constexpr (std::is_same_v<T, half> && std::is_same_v<Acc, float>) {
      simd::round_to_half(row, cols);  // the same bits as the loop below, vectorised
    } else if constexpr (std::is_same_v<T, bfloat16> && std::is_same_v<Acc, float>) {
      simd::round_to_bfloat16(row, cols);  // (likewise)
    } else {
      for (Index j = 0; j < cols; ++j)
        row[j] = static_cast<Acc>(static_cast<float>(T(static_cast<float>(row[j]))));
    }
  }
  template <class Acc>
  Acc transform(const SeqInfo& s, const Coord& c, Acc score) const {
    if (c.kv == s.kv_len - 1 && s.q_len - c.q - 1 > (*tail)[static_cast<size_t>(c.batch)])
      return static_cast<Acc>(-3e38f);
    return score;
  }
};

}  // namespace attnref::detail
