#pragma once
/// Shared pieces of the CANN attention operators (PromptFlashAttention, IncreFlashAttention):
/// the engine variant (sparse-mode band, boolean mask as exclusion or as a selected fill value,
/// pseShift, the antiquant offset term) and small checking helpers. Not part of the API.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/variant.hpp"
#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"
#include "attnref/detail/hooks/io.hpp"
#include "attnref/detail/hooks/quant_p.hpp"

namespace attnref::detail {

/// The engine hooks of PFA / IFA. Positions are those inside each sequence.
///   band:  key j visible to row i iff -pre <= j - i - off <= next, off = kv_len - q_len when
///          bottom_right, else 0 (sparse modes 0 with a mask, 2, 3, 4; none: every key)
///   mask:  [Bm, S1', S2'] (nonzero = masked): excluded (mask_excludes) or its score replaced
///          by `fill` after scaling and pse (the NPU's select)
///   pse:   [Bp, N, S1' (or 1: one row for all), S2'], added after scaling (or before, with
///          add_then_scale: then the engine's scale is 1 and `scale` applies here)
///   (IoHooks: the per-channel antiquant fold, V's affine map and the int8 output)
///   kv_shift: per batch, the position of key 0 in the mask / pse columns (kv left padding);
///          null: 0. q_shift: the same for row 0 in the mask / pse rows (query left padding)
///   tok_scale / tok_offset: IFA's per-token antiquant, applied as the engine loads each tile
///   sinks: FIA's learnable sink per q head (the sink hook)
template <class TM, class TP>
struct CannVariant : IoHooks {
  bool band = false;
  bool bottom_right = false;
  Index pre = 0, next = 0;
  StridedView<const TM, 3> mask{};
  bool mask_excludes = false;
  float fill = -std::numeric_limits<float>::max();
  StridedView<const TP, 4> pse{};
  bool add_then_scale = false;
  float scale = 1.0f;
  bool int8_scores = false;  // int8 q / k: s = int32(q·k)·deq1 here, then the scale
  float deq1 = 1.0f;
  const Index* kv_shift = nullptr;  // [batch]
  const Index* q_shift = nullptr;   // [batch]
  /// IFA's per-token antiquant (kv_dequant hook): scales (and offsets) [2, tok_batch,
  /// tok_heads, tok_stride], [0] the keys', [1] the values', indexed by the key's column (col());
  /// tok_heads 1: one map for every kv head.
  const float* tok_scale = nullptr;
  const float* tok_offset = nullptr;
  Index tok_batch = 0, tok_heads = 1, tok_stride = 0;
  /// FIA's learnable sink: one logit per q head (sink hook); null: none.
  const bfloat16* sinks = nullptr;

  bool has_sink() const { return sinks != nullptr; }
  double sink(Index q_head) const { return static_cast<double>(static_cast<float>(sinks[q_head])); }

  Index col(const Coord& c) const { return kv_shift == nullptr ? c.kv : c.kv + kv_shift[c.batch]; }
  Index row(const Coord& c) const { return q_shift == nullptr ? c.q : c.q + q_shift[c.batch]; }

  bool has_kv_dequant() const { return tok_scale != nullptr; }
  void kv_dequant(const SeqInfo& s, Index kv, Index kv_head, KvAffine& k, KvAffine& v) const {
    const Index row = s.batch * tok_heads + (tok_heads == 1 ? 0 : kv_head);
    const Index p = row * tok_stride + (kv_shift == nullptr ? kv : kv + kv_shift[s.batch]);
    const Index pv = tok_batch * tok_heads * tok_stride + p;
    k = {tok_scale[p], tok_offset == nullptr ? 0.0f : tok_offset[p]};
    v = {tok_scale[pv], tok_offset == nullptr ? 0.0f : tok_offset[pv]};
  }

  Index off(const SeqInfo& s) const { return bottom_right ? s.kv_len - s.q_len : 0; }
  KvRange visible(const SeqInfo& s, Index i) const {
    if (!band) return {0, s.kv_len};
    const Index o = off(s);
    const Index lo = std::clamp<Index>(i + o - pre, 0, s.kv_len);
    const Index hi = std::clamp<Index>(i + o + next + 1, lo, s.kv_len);
    return {lo, hi};
  }
  bool has_transform() const {
    return !pse.absent() || (!mask.absent() && !mask_excludes) || add_then_scale || int8_scores;
  }
  KvRange kv_range(const SeqInfo& s, Index q0, Index q1) const {
    if (!band || q1 <= q0) return {0, s.kv_len};
    return {visible(s, q0).begin, std::max(visible(s, q1 - 1).end, visible(s, q0).begin)};
  }
  TileMask classify(const SeqInfo& s, Index q0, Index q1, Index j0, Index j1) const {
    bool all_in = true, all_out = true;
    if (band) {
      const Index o = off(s);
      // The tile's smallest and largest j - i - off.
      const Index dmin = j0 - (q1 - 1) - o, dmax = (j1 - 1) - q0 - o;
      all_out = dmax < -pre || dmin > next;
      all_in = dmin >= -pre && dmax <= next;
    } else {
      all_out = false;
    }
    if (all_out) return TileMask::All;
    const bool excl_mask = !mask.absent() && mask_excludes;
    return all_in && !excl_mask ? TileMask::None : TileMask::Partial;
  }
  bool row_interval(const SeqInfo& s, const Coord& c, KvRange& v) const {
    if (!mask.absent() && mask_excludes) return false;
    v = visible(s, c.q);
    return true;
  }
  bool user_masked(const Coord& c) const {
    return mask(mask.size(0) == 1 ? 0 : c.batch, row(c), col(c)) != TM(0);
  }
  bool masked(const SeqInfo& s, const Coord& c) const {
    if (band) {
      const Index d = c.kv - c.q - off(s);
      if (d < -pre || d > next) return true;
    }
    return !mask.absent() && mask_excludes && user_masked(c);
  }
  float pse_term(const Coord& c) const {
    if (pse.absent()) return 0.0f;
    return static_cast<float>(
        pse(pse.size(0) == 1 ? 0 : c.batch, c.q_head, pse.size(2) == 1 ? 0 : row(c), col(c)));
  }
  template <class Acc>
  Acc transform(const SeqInfo&, const Coord& c, Acc score) const {
    float s = static_cast<float>(score);
    const float p = pse_term(c);
    if (int8_scores) s *= deq1;
    if (add_then_scale)
      s = (s + p) * scale;
    else if (int8_scores)
      s = s * scale + p;
    else
      s += p;  // the engine applied the scale
    if (!mask.absent() && !mask_excludes && user_masked(c)) s = fill;
    return static_cast<Acc>(s);
  }
  /// transform() of keys c.kv .. c.kv + cols - 1 of one query row, in place: the same steps
  /// on every key in the same order, each choice made once per row rather than per key, so that
  /// the arithmetic vectorises (per key, the hooks took a third of pfa/int8/dense/S:2048).
  template <class Acc>
  void transform_row(const SeqInfo&, const Coord& c, Acc* row_s, Index cols) const {
    constexpr Index kChunk = 128;
    float p[kChunk];
    const auto f = [](Acc x) { return static_cast<float>(x); };
    for (Index j0 = 0; j0 < cols; j0 += kChunk) {
      const Index n = std::min(kChunk, cols - j0);
      Acc* x = row_s + j0;
      Coord cj = c;
      if (pse.absent()) {
        std::fill_n(p, n, 0.0f);
      } else {
        for (Index j = 0; j < n; ++j) {
          cj.kv = c.kv + j0 + j;
          p[j] = pse_term(cj);
        }
      }
      if (int8_scores)
        for (Index j = 0; j < n; ++j) x[j] = static_cast<Acc>(f(x[j]) * deq1);
      if (add_then_scale)
        for (Index j = 0; j < n; ++j) x[j] = static_cast<Acc>((f(x[j]) + p[j]) * scale);
      else if (int8_scores)
        for (Index j = 0; j < n; ++j) x[j] = static_cast<Acc>(f(x[j]) * scale + p[j]);
      else
        for (Index j = 0; j < n; ++j) x[j] = static_cast<Acc>(f(x[j]) + p[j]);
      if (!mask.absent() && !mask_excludes)
        for (Index j = 0; j < n; ++j) {
          cj.kv = c.kv + j0 + j;
          if (user_masked(cj)) x[j] = static_cast<Acc>(fill);
        }
    }
  }
};

/// PromptFlashAttention's int8 path: P quantized block by block, PQuantStep's PromptFlash form
/// (P8 = sat(rint(P̂ · quant_scale1)), factor deq_scale2).
template <class TM, class TP>
struct CannQuantVariant : CannVariant<TM, TP>, PQuantStep {};

/// Checks quant_scale2 / quant_offset2 for an int8 output (`int8_out`) or their absence, and sets
/// the output quantization of `io`: out = sat(rint(v·scale[c] + offset[c])) with c = h·Dv + d,
/// per tensor (one value) or per channel (heads·Dv values, any shape). The scales and offsets
/// are finite (checked); a NaN value (a NaN in V) quantizes to 0 (docs/semantics.md §9), ±inf
/// saturates.
inline void cann_post_quant(const char* fn, const StridedView<const float>& qs2,
                            const StridedView<const float>& qo2, Index heads, Index dv,
                            bool int8_out, IoHooks& io) {
  const Index channels = heads * dv;
  if (!int8_out) {
    ATTNREF_CHECK(qs2.absent() && qo2.absent(), std::invalid_argument, fn,
                  "quant_scale2 / quant_offset2", "given without int8 output", "none",
                  shape_str(qs2));
    return;
  }
  ATTNREF_CHECK(!qs2.absent() && (qs2.numel() == 1 || qs2.numel() == channels),
                std::invalid_argument, fn, "quant_scale2",
                "required for int8 output: per tensor or per channel",
                "1 or " + std::to_string(channels) + " values", shape_str(qs2));
  ATTNREF_CHECK(qo2.absent() || (qo2.shape() == qs2.shape()), std::invalid_argument, fn,
                "quant_offset2.shape", "differs from quant_scale2's", shape_str(qs2),
                shape_str(qo2));
  for (Index i = 0; i < qs2.numel(); ++i) {  // dense (the operators' DenseArena)
    ATTNREF_CHECK(std::isfinite(qs2.data()[i]), std::invalid_argument, fn,
                  "quant_scale2[" + std::to_string(i) + "]", "not finite", "a finite value",
                  std::to_string(qs2.data()[i]));
    ATTNREF_CHECK(qo2.absent() || std::isfinite(qo2.data()[i]), std::invalid_argument, fn,
                  "quant_offset2[" + std::to_string(i) + "]", "not finite", "a finite value",
                  std::to_string(qo2.absent() ? 0.0f : qo2.data()[i]));
  }
  io.post_scale.assign(qs2.data(), qs2.data() + qs2.numel());
  if (!qo2.absent()) io.post_offset.assign(qo2.data(), qo2.data() + qo2.numel());
  io.post_width = qs2.numel() == 1 ? 0 : dv;
}

inline std::string dims_str(const std::vector<Index>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

/// Per-batch lengths from an actual-length list: empty -> `full` each; one value broadcasts;
/// otherwise at least `batch` values (the first `batch` are used); each in [0, full].
inline std::vector<Index> cann_lengths(const char* fn, const char* arg,
                                       const std::vector<std::int64_t>& list, Index batch,
                                       Index full) {
  std::vector<Index> out(static_cast<size_t>(batch), full);
  if (list.empty()) return out;
  ATTNREF_CHECK(list.size() == 1 || static_cast<Index>(list.size()) >= batch, std::invalid_argument,
                fn, arg, "length neither 1 nor >= batch", "1 or >= " + std::to_string(batch),
                std::to_string(list.size()));
  for (Index b = 0; b < batch; ++b) {
    const std::int64_t v = list[list.size() == 1 ? 0 : static_cast<size_t>(b)];
    ATTNREF_CHECK(v >= 0 && v <= full, std::invalid_argument, fn,
                  std::string(arg) + "[" + std::to_string(b) + "]", "out of range",
                  "[0, " + std::to_string(full) + "]", std::to_string(v));
    out[static_cast<size_t>(b)] = static_cast<Index>(v);
  }
  return out;
}

/// Head rules shared by PFA and IFA: num_heads in (0, 256], num_key_value_heads >= 0 (0: N),
/// N a multiple of KV_N, N / KV_N <= 64. Returns KV_N.
inline Index cann_kv_heads(const char* fn, std::int64_t n, std::int64_t nkv) {
  ATTNREF_CHECK(n > 0 && n <= 256, std::invalid_argument, fn, "params.num_heads", "out of range",
                "[1, 256]", std::to_string(n));
  ATTNREF_CHECK(nkv >= 0, std::invalid_argument, fn, "params.num_key_value_heads", "negative",
                ">= 0", std::to_string(nkv));
  const std::int64_t kv = nkv == 0 ? n : nkv;
  ATTNREF_CHECK(n % kv == 0 && n / kv <= 64, std::invalid_argument, fn, "params.num_heads",
                "not a multiple of num_key_value_heads with a ratio <= 64",
                "a multiple of " + std::to_string(kv) + " up to " + std::to_string(64 * kv),
                std::to_string(n));
  return static_cast<Index>(kv);
}

}  // namespace attnref::detail
