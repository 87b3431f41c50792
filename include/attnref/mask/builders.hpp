#pragma once
/// Builders of the mask tensors ATB's attention operators document, in each dtype form, and the
/// ALiBi slopes (docs/semantics.md §2.3–2.6, §3). Every builder returns a row-major std::vector of
/// the shape it names; view it with StridedView.
///
/// Forms (MaskForm): Additive: 0 = keep, `masked_value` (−10000 by default; the SWA examples use
/// −65536) = masked, added to the score; Binary: 0 = keep, 1 = masked (the kernel multiplies by
/// −3e38). Which one a kernel takes: atb/mask_encoding.hpp (MaskRule::form()).
///
/// Positions: query i (row), key j (column) of one sequence, from 0.

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"

namespace attnref {

enum class MaskForm { Additive, Binary };

namespace detail {

inline void check_positive(const char* fn, const char* arg, Index v) {
  ATTNREF_CHECK(v > 0, std::invalid_argument, fn, arg, "not positive", "> 0", v);
}

template <class T, class Hidden>
std::vector<T> pattern(Index rows, Index cols, MaskForm form, float masked_value, Hidden&& hidden) {
  const T on = T(form == MaskForm::Binary ? 1.0f : masked_value), off = T(0.0f);
  std::vector<T> m(static_cast<size_t>(rows * cols));
  for (Index i = 0; i < rows; ++i)
    for (Index j = 0; j < cols; ++j) m[static_cast<size_t>(i * cols + j)] = hidden(i, j) ? on : off;
  return m;
}

}  // namespace detail

/// MASK_TYPE_NORM: [max_seq, max_seq], key j hidden from query i iff j > i.
template <class T>
std::vector<T> norm_mask(Index max_seq, MaskForm form, float masked_value = -10000.0f) {
  detail::check_positive("norm_mask", "max_seq", max_seq);
  return detail::pattern<T>(max_seq, max_seq, form, masked_value,
                            [](Index i, Index j) { return j > i; });
}

/// MASK_TYPE_NORM_COMPRESS (isTriuMask = 1): the [128, 128] tile of the causal mask.
template <class T>
std::vector<T> norm_compress_mask(MaskForm form, float masked_value = -10000.0f) {
  return norm_mask<T>(128, form, masked_value);
}

/// MASK_TYPE_SLIDING_WINDOW_NORM: [max_seq, max_seq], key j hidden from query i iff j > i or
/// j <= i − window (W keys visible, the current one included: the golden's triu(1) + tril(−W)).
template <class T>
std::vector<T> swa_mask(Index max_seq, Index window, MaskForm form,
                        float masked_value = -10000.0f) {
  detail::check_positive("swa_mask", "max_seq", max_seq);
  detail::check_positive("swa_mask", "window", window);
  return detail::pattern<T>(max_seq, max_seq, form, masked_value,
                            [window](Index i, Index j) { return j > i || j <= i - window; });
}

/// Block size of the SWA_COMPRESS expansion: 128 for head sizes <= 128 (or when the q/k and v
/// head sizes differ), 64 above.
inline Index swa_compress_block(Index head_size, Index v_head_size = 0) {
  if (v_head_size > 0 && v_head_size != head_size) return 128;
  return head_size <= 128 ? 128 : 64;
}

/// The window the [512, 512] SWA_COMPRESS pattern encodes ("true size"): W itself when
/// W <= 3·block, else 3·block when W is a multiple of the block, else 2·block + W % block.
inline Index swa_compress_true_size(Index window, Index block) {
  if (window <= 3 * block) return window;
  return window % block == 0 ? 3 * block : 2 * block + window % block;
}

/// MASK_TYPE_SLIDING_WINDOW_COMPRESS: [512, 512], the SWA pattern of the true size.
template <class T>
std::vector<T> swa_compress_mask(Index window, Index head_size, MaskForm form,
                                 float masked_value = -10000.0f, Index v_head_size = 0) {
  detail::check_positive("swa_compress_mask", "window", window);
  detail::check_positive("swa_compress_mask", "head_size", head_size);
  return swa_mask<T>(512,
                     swa_compress_true_size(window, swa_compress_block(head_size, v_head_size)),
                     form, masked_value);
}

/// The standard ALiBi slopes (Press et al.): for the largest power of two n <= H, slope k =
/// 2^(−8k/n), k = 1..n; for H > n the odd-indexed slopes of 2n heads, 2^(−4k/n) for k = 1, 3, ...,
/// 2(H − n) − 1, are appended.
inline std::vector<float> alibi_slopes(Index num_heads) {
  detail::check_positive("alibi_slopes", "num_heads", num_heads);
  Index n = 1;
  while (n * 2 <= num_heads) n *= 2;
  std::vector<float> s;
  for (Index k = 1; k <= n; ++k)
    s.push_back(static_cast<float>(std::pow(2.0, -8.0 * static_cast<double>(k) / n)));
  for (Index k = 1; static_cast<Index>(s.size()) < num_heads; k += 2)
    s.push_back(static_cast<float>(std::pow(2.0, -4.0 * static_cast<double>(k) / n)));
  return s;
}

/// ALiBi bias of key j for query i (right aligned): slope·(j − i); sqrt variant
/// slope·sign(j − i)·sqrt(|j − i|).
inline double alibi_bias(double slope, Index i, Index j, bool sqrt_variant = false) {
  const double d = static_cast<double>(j - i);
  if (!sqrt_variant) return slope * d;
  return slope * (d < 0 ? -std::sqrt(-d) : std::sqrt(d));
}

/// Decode-time ALiBi bias (PagedAttention): slope·(t − context_len + 1) for cache position t,
/// 0 at the newest token.
inline double alibi_decode_bias(double slope, Index t, Index context_len) {
  return slope * static_cast<double>(t - context_len + 1);
}

/// MASK_TYPE_ALIBI full mask [heads, max_seq, max_seq] (repeat it per batch for the
/// [batch, heads, ...] form): the bias (alibi_bias) plus `masked_value` above the diagonal
/// (−10000 for fp16; the bf16 golden uses −inf). Additive in every dtype.
template <class T>
std::vector<T> alibi_mask(const std::vector<float>& slopes, Index max_seq,
                          bool sqrt_variant = false, float masked_value = -10000.0f) {
  detail::check_positive("alibi_mask", "max_seq", max_seq);
  const Index h_n = static_cast<Index>(slopes.size());
  detail::check_positive("alibi_mask", "slopes.size()", h_n);
  std::vector<T> m(static_cast<size_t>(h_n * max_seq * max_seq));
  for (Index h = 0; h < h_n; ++h)
    for (Index i = 0; i < max_seq; ++i)
      for (Index j = 0; j < max_seq; ++j) {
        double x = alibi_bias(slopes[static_cast<size_t>(h)], i, j, sqrt_variant);
        if (j > i) x += static_cast<double>(masked_value);
        m[static_cast<size_t>((h * max_seq + i) * max_seq + j)] = T(static_cast<float>(x));
      }
  return m;
}

/// ALIBI_COMPRESS (and, with sqrt_variant, ALIBI_COMPRESS_SQRT) with a [heads, seq_len, 128]
/// mask: the first 128 key columns of the full mask. The kernel reads it as given (no square
/// root of its own), so the SQRT form holds the final sqrt biases.
template <class T>
std::vector<T> alibi_head_mask(const std::vector<float>& slopes, Index seq_len,
                               float masked_value = -10000.0f, bool sqrt_variant = false) {
  detail::check_positive("alibi_head_mask", "seq_len", seq_len);
  const Index width = seq_len > 128 ? seq_len : 128;
  const std::vector<T> full = alibi_mask<T>(slopes, width, sqrt_variant, masked_value);
  const Index h_n = static_cast<Index>(slopes.size());
  std::vector<T> m(static_cast<size_t>(h_n * seq_len * 128));
  for (Index h = 0; h < h_n; ++h)
    for (Index i = 0; i < seq_len; ++i)
      for (Index j = 0; j < 128; ++j)
        m[static_cast<size_t>((h * seq_len + i) * 128 + j)] =
            full[static_cast<size_t>((h * width + i) * width + j)];
  return m;
}

/// MASK_TYPE_ALIBI_COMPRESS (and _SQRT): the [256, 256] distance tile, M[i][j] = i − j on and
/// below the diagonal (sqrt variant: sqrt(i − j)) and i − j + 60000 above it. Pass it with the
/// negated slopes (alibi_compress_slopes).
template <class T>
std::vector<T> alibi_compress_mask(bool sqrt_variant = false) {
  std::vector<T> m(256 * 256);
  for (Index i = 0; i < 256; ++i)
    for (Index j = 0; j < 256; ++j) {
      const double d = static_cast<double>(i - j);
      const double x = j > i ? d + 60000.0 : (sqrt_variant ? std::sqrt(d) : d);
      m[static_cast<size_t>(i * 256 + j)] = T(static_cast<float>(x));
    }
  return m;
}

/// The slopes input of ALIBI_COMPRESS / ALIBI_COMPRESS_SQRT: the ALiBi slopes negated.
inline std::vector<float> alibi_compress_slopes(const std::vector<float>& slopes) {
  std::vector<float> s = slopes;
  for (float& x : s) x = -x;
  return s;
}

/// MASK_TYPE_ALIBI_COMPRESS_LEFT_ALIGN: the [256, 256] tile M[i][j] = j on and below the diagonal,
/// −inf above (T's infinity); pass it with the positive slopes.
template <class T>
std::vector<T> alibi_left_align_mask() {
  std::vector<T> m(256 * 256);
  for (Index i = 0; i < 256; ++i)
    for (Index j = 0; j < 256; ++j)
      m[static_cast<size_t>(i * 256 + j)] =
          T(j > i ? -std::numeric_limits<float>::infinity() : static_cast<float>(j));
  return m;
}

}  // namespace attnref
