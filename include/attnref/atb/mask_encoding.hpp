#pragma once
/// The mask-encoding table of ATB's attention operators: how the values of a mask tensor enter
/// the score, per operator, the kernel its params select, and dtype (docs/masks.md "Encodings",
/// where each row names its public vendor source). The one place in attnref that decides it:
/// SelfAttention and PagedAttention ask these functions, and check the values they read with
/// check_mask_values() before anything is written.
///
/// SelfAttention — the kernel (sa_kernel):
///   DECODER, any kernelType                 decoder kernel: fp32 scores; fp16 masks added,
///                                           bf16 / float NORM masks binary x -3e38
///   PREFIX_ENCODER (HIGH_PRECISION only)    prefix-cache kernel: fp32 scores; fp16 added,
///                                           bf16 / float binary x -3e38
///   fp16 with kernelType DEFAULT, or fp16   fp16 kernel: fp16 scores, masks added in fp16
///     with batchRunStatus (that kernel
///     ignores kernelType)
///   otherwise (bf16, float, fp16 with       high-precision kernel: fp32 scores, NORM /
///     HIGH_PRECISION)                       NORM_COMPRESS / SWA masks binary x -3e38
/// The dtype is the mask's: with qkv quantization, the output type (outDataType).
/// ALiBi masks with a head axis (ALIBI, and the [heads, seqLen, 128] compressed form) are added
/// as given by every kernel; the compressed [256, 256] ALiBi tile is expanded and multiplied by
/// the slopes (mask/alibi.hpp).
///
/// PagedAttention: every kernel adds its masks in fp32, except the MLA multi-token kernel
/// (mlaVHeadSize > 0 with calcType SPEC) in bf16 (and float), which takes a binary SPEC mask and
/// multiplies it by -3e38.
///
/// Accepted values (anything else: std::invalid_argument naming the element):
///   Additive  0 (keep) or negative (-10000, -65504, -inf): hide. A positive value is a binary
///             mask given to an additive kernel (it would hide nothing).
///   Binary    exactly 0 (keep) or 1 (hide). -10000 x -3e38 overflows to +inf: a NaN row.
///   Bias      any value but NaN and +inf (ALiBi biases; -inf hides).
///   AlibiTile not NaN; an infinite entry only where its expansion times every head's slope is
///             -inf (the vendor's tile holds +inf or +60000 above the diagonal, slopes negated).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attnref/atb/paged_attention_params.hpp"
#include "attnref/atb/self_attention_params.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"
#include "attnref/mask/builders.hpp"

namespace attnref {

/// How the values of one mask tensor enter the score.
enum class MaskEncoding {
  Additive,  ///< added as given: 0 keep, negative hide
  Binary,    ///< 0 keep, 1 hide; multiplied by MaskRule::factor before the add
  Bias,      ///< ALiBi with a head axis: added as given
  AlibiTile  ///< compressed ALiBi: expanded block by block, times the slopes
};

/// Which mask tensor of an operator (the encodings differ between them).
enum class MaskRole {
  Causal,    ///< NORM, NORM_COMPRESS, the sliding-window masks, PagedAttention NORM and SPEC
  HeadBias,  ///< ALIBI, and ALIBI_COMPRESS* in the [heads, seqLen, 128] form
  AlibiTile  ///< ALIBI_COMPRESS* as the [256, 256] tile with slopes
};

/// The NPU kernel family whose mask handling applies.
enum class AtbKernel {
  Fp16Default,    ///< SelfAttention fp16 kernel (scores and mask add in fp16)
  HighPrecision,  ///< SelfAttention fp32 kernel (bf16, float, fp16 HIGH_PRECISION)
  Decoder,        ///< SelfAttention DECODER kernel (fp32 scores, any kernelType)
  PrefixCache,    ///< SelfAttention PREFIX_ENCODER kernel
  PagedDecode,    ///< PagedAttention (decode, SPEC, MLA combined cache)
  PagedMlaSpec    ///< PagedAttention MLA multi-token (mlaVHeadSize > 0 with SPEC)
};

struct MaskRule {
  MaskEncoding encoding = MaskEncoding::Additive;
  float factor = 1.0f;  ///< Binary: -3e38; otherwise 1
  AtbKernel kernel = AtbKernel::HighPrecision;
  /// The builders' form (mask/builders.hpp) for a Causal-role mask of this rule.
  MaskForm form() const {
    return encoding == MaskEncoding::Binary ? MaskForm::Binary : MaskForm::Additive;
  }
};

namespace detail {

inline constexpr float kBinaryMaskFactor = -3e38f;

template <class T>
constexpr bool is_fp16_v = std::is_same_v<T, half>;

inline const char* kernel_name(AtbKernel k) {
  switch (k) {
    case AtbKernel::Fp16Default:
      return "the fp16 kernel (kernelType DEFAULT, or batchRunStatus)";
    case AtbKernel::HighPrecision:
      return "the high-precision kernel (bf16, float, or fp16 with HIGH_PRECISION)";
    case AtbKernel::Decoder:
      return "the DECODER kernel";
    case AtbKernel::PrefixCache:
      return "the PREFIX_ENCODER kernel";
    case AtbKernel::PagedDecode:
      return "the PagedAttention kernel";
    case AtbKernel::PagedMlaSpec:
      return "the PagedAttention MLA multi-token kernel";
  }
  return "";
}

}  // namespace detail

/// The SelfAttention kernel the params select for mask type TM (the output type with qkv
/// quantization).
template <class TM>
AtbKernel sa_kernel(const SelfAttentionParams& p) {
  using P = SelfAttentionParams;
  if (p.calc_type == P::CalcType::Decoder) return AtbKernel::Decoder;
  if (p.calc_type == P::CalcType::PrefixEncoder) return AtbKernel::PrefixCache;
  if (detail::is_fp16_v<TM> &&
      (p.kernel_type == P::KernelType::Default || p.batch_run_status_enable))
    return AtbKernel::Fp16Default;
  return AtbKernel::HighPrecision;
}

/// The encoding of a SelfAttention mask of element type TM in `role`.
template <class TM>
MaskRule self_attention_mask_rule(const SelfAttentionParams& p, MaskRole role) {
  MaskRule r;
  r.kernel = sa_kernel<TM>(p);
  if (role == MaskRole::HeadBias) {
    r.encoding = MaskEncoding::Bias;
  } else if (role == MaskRole::AlibiTile) {
    r.encoding = MaskEncoding::AlibiTile;
  } else {
    const bool additive = r.kernel == AtbKernel::Fp16Default ||
                          (detail::is_fp16_v<TM> &&
                           (r.kernel == AtbKernel::Decoder || r.kernel == AtbKernel::PrefixCache));
    r.encoding = additive ? MaskEncoding::Additive : MaskEncoding::Binary;
    r.factor = additive ? 1.0f : detail::kBinaryMaskFactor;
  }
  return r;
}

/// The encoding of a PagedAttention mask of element type TM in `role`.
template <class TM>
MaskRule paged_attention_mask_rule(const PagedAttentionParams& p, MaskRole role) {
  using P = PagedAttentionParams;
  MaskRule r;
  const bool mla_spec = p.mla_v_head_size > 0 && p.calc_type == P::CalcType::Spec;
  r.kernel = mla_spec ? AtbKernel::PagedMlaSpec : AtbKernel::PagedDecode;
  if (role != MaskRole::Causal) {
    r.encoding = MaskEncoding::Bias;
  } else if (mla_spec && !detail::is_fp16_v<TM>) {
    r.encoding = MaskEncoding::Binary;
    r.factor = detail::kBinaryMaskFactor;
  }
  return r;
}

namespace detail {

/// Whether v is an accepted value of an Additive / Binary / Bias mask.
inline bool mask_value_ok(MaskEncoding e, float v) {
  switch (e) {
    case MaskEncoding::Additive:
      return v <= 0.0f;  // NaN fails too
    case MaskEncoding::Binary:
      return v == 0.0f || v == 1.0f;
    case MaskEncoding::Bias:
      return !std::isnan(v) && v != INFINITY;
    case MaskEncoding::AlibiTile:  // check_alibi_tile
      return !std::isnan(v);
  }
  return false;
}

inline const char* mask_value_rule(MaskEncoding e) {
  switch (e) {
    case MaskEncoding::Additive:
      return "0 (keep) or a negative value (hide), added as given";
    case MaskEncoding::Binary:
      return "0 (keep) or 1 (hide), multiplied by -3e38";
    case MaskEncoding::Bias:
      return "an additive bias: not NaN or +inf";
    case MaskEncoding::AlibiTile:
      return "not NaN";
  }
  return "";
}

template <std::size_t R>
std::string index_str(const std::array<Index, R>& i) {
  std::string s;
  for (Index x : i) s += "[" + std::to_string(x) + "]";
  return s;
}

}  // namespace detail

/// Checks the values of a mask (Additive, Binary or Bias) in the box [lo, hi) of its indices
/// (clamped to the view: the part the operator reads for one sequence). Throws
/// std::invalid_argument naming the first bad element, the encoding and the kernel.
template <class T, int R>
void check_mask_values(const char* fn, const std::string& arg, const StridedView<const T, R>& m,
                       const MaskRule& rule, std::array<Index, R> lo, std::array<Index, R> hi) {
  if (m.absent()) return;
  for (int d = 0; d < R; ++d) {
    const size_t u = static_cast<size_t>(d);
    hi[u] = std::min(hi[u], m.size(d));
    lo[u] = std::max<Index>(lo[u], 0);
    if (lo[u] >= hi[u]) return;
  }
  std::array<Index, R> i = lo;
  for (;;) {
    Index off = 0;
    for (int d = 0; d < R; ++d) off += i[static_cast<size_t>(d)] * m.stride(d);
    const float v = static_cast<float>(m.data()[off]);
    if (!detail::mask_value_ok(rule.encoding, v))
      detail::raise<std::invalid_argument>(fn, arg + detail::index_str(i),
                                           std::string("not a value of this mask's encoding (") +
                                               detail::kernel_name(rule.kernel) + ")",
                                           detail::mask_value_rule(rule.encoding), v);
    int d = R - 1;
    for (; d >= 0; --d) {
      const size_t u = static_cast<size_t>(d);
      if (++i[u] < hi[u]) break;
      i[u] = lo[u];
    }
    if (d < 0) return;
  }
}

/// Checks a compressed ALiBi tile [1, 256, 256] against its slopes [heads]: no NaN, and an
/// infinite entry only where every head's bias comes out -inf (sign of the entry, or + for the
/// rows 128.. of the SQRT tile, whose values are squared, times the slope). Throws
/// std::invalid_argument naming the first bad element.
template <class T>
void check_alibi_tile(const char* fn, const StridedView<const T, 3>& tile,
                      const StridedView<const float, 1>& slopes, bool sqrt_tile) {
  bool all_neg = slopes.size(0) > 0, all_pos = slopes.size(0) > 0;
  for (Index h = 0; h < slopes.size(0); ++h) {
    all_neg = all_neg && slopes(h) < 0.0f;
    all_pos = all_pos && slopes(h) > 0.0f;
  }
  for (Index i = 0; i < tile.size(1); ++i)
    for (Index j = 0; j < tile.size(2); ++j) {
      const float v = static_cast<float>(tile(0, i, j));
      if (!std::isnan(v) && !std::isinf(v)) continue;
      const bool positive = v > 0.0f || (sqrt_tile && i >= 128);
      if (!std::isnan(v) && (positive ? all_neg : all_pos)) continue;
      detail::raise<std::invalid_argument>(
          fn, "mask[0][" + std::to_string(i) + "][" + std::to_string(j) + "]",
          "would give a NaN or +inf ALiBi bias (the kernel multiplies the expanded tile by each "
          "head's slope)",
          std::isnan(v) ? "not NaN"
          : positive    ? "+inf only with every slope negative"
                        : "-inf only with every slope positive",
          v);
    }
}

}  // namespace attnref
