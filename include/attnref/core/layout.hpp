#pragma once
/// Layouts of q / k / v / o tensors and the default strides they imply.
///
/// attnref indexes every attention tensor through a 4-D view in the canonical index order
/// (b, s, n, d) = (batch, sequence position, head, head dimension). A layout only decides the
/// default strides of that view; padded, permuted or otherwise strided data work by passing a
/// StridedView with explicit strides.
///
///   BSND  [B, S, N, D]  token-major (ATB "ND"/BSND, FlashInfer NHD)
///   BSH   [B, S, N*D]   same memory as BSND with heads merged into the hidden dimension
///   BNSD  [B, N, S, D]  head-major (ATB TYPE_BNSD, FlashInfer HND)
///   TND   [T, N, D]     packed tokens of all sequences; the view has batch extent 1 and the
///                       per-sequence token ranges come from cumulative offsets (SeqLens::*_cu)
///   BNSD_BSND           inputs BNSD, output BSND (CANN PromptFlashAttention)
///
/// Vendor layout strings ("BSH", "BNSD_BSND", "TND", ...) are parsed once, by
/// detail::parse_layout, into this enum; every operator that takes a layout string uses it.

#include <initializer_list>
#include <string>

#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

enum class Layout { BSND, BSH, BNSD, TND, BNSD_BSND };

inline const char* to_string(Layout layout) {
  switch (layout) {
    case Layout::BSND:
      return "BSND";
    case Layout::BSH:
      return "BSH";
    case Layout::BNSD:
      return "BNSD";
    case Layout::TND:
      return "TND";
    case Layout::BNSD_BSND:
      return "BNSD_BSND";
  }
  return "?";
}

namespace detail {
/// The vendor layout string `s` as a Layout, which must be one of `allowed` (the operator's
/// list, in its documented order); anything else throws std::invalid_argument naming `fn` /
/// `arg`: "not supported: expected BSH, BSND or BNSD, got "NSD"".
inline Layout parse_layout(const char* fn, const char* arg, const std::string& s,
                           std::initializer_list<Layout> allowed) {
  std::string list;
  size_t i = 0;
  for (Layout l : allowed) {
    if (s == to_string(l)) return l;
    list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + std::string(to_string(l));
    ++i;
  }
  raise<std::invalid_argument>(fn, arg, "not supported", list, "\"" + s + "\"");
}
}  // namespace detail

/// View over BSND data [B, S, N, D].
template <class T>
StridedView<T, 4> bsnd_view(T* data, Index batch, Index seq, Index heads, Index head_size) {
  const auto st = detail::dense_strides<4>("bsnd_view", {batch, seq, heads, head_size});
  return StridedView<T, 4>(data, {batch, seq, heads, head_size}, st);
}

/// View over BNSD data [B, N, S, D] (indexed as (b, s, n, d)).
template <class T>
StridedView<T, 4> bnsd_view(T* data, Index batch, Index heads, Index seq, Index head_size) {
  const auto st = detail::dense_strides<4>("bnsd_view", {batch, heads, seq, head_size});
  return StridedView<T, 4>(data, {batch, seq, heads, head_size}, {st[0], st[2], st[1], st[3]});
}

/// View over packed TND data [T, N, D] (batch extent 1).
template <class T>
StridedView<T, 4> tnd_view(T* data, Index tokens, Index heads, Index head_size) {
  const auto st = detail::dense_strides<4>("tnd_view", {1, tokens, heads, head_size});
  return StridedView<T, 4>(data, {1, tokens, heads, head_size}, st);
}

/// View over logical (B, S, N, D) data stored in `layout`. For TND, `batch` must be 1 and `seq`
/// is the total token count T. BSH is BSND with N*D merged.
template <class T>
StridedView<T, 4> make_qkv_view(T* data, Layout layout, Index batch, Index seq, Index heads,
                                Index head_size) {
  switch (layout) {
    case Layout::BSND:
    case Layout::BSH:
      return bsnd_view(data, batch, seq, heads, head_size);
    case Layout::BNSD:
    case Layout::BNSD_BSND:
      return bnsd_view(data, batch, heads, seq, head_size);
    case Layout::TND:
      ATTNREF_CHECK(batch == 1, std::invalid_argument, "make_qkv_view", "batch",
                    "must be 1 for layout TND (packed tokens)", 1, batch);
      return tnd_view(data, seq, heads, head_size);
  }
  detail::raise<std::invalid_argument>("make_qkv_view", "layout", "unknown",
                                       "BSND|BSH|BNSD|TND|BNSD_BSND", static_cast<int>(layout));
}

}  // namespace attnref
