#pragma once
/// The layout front matter of the CANN attention operators (PromptFlashAttention,
/// IncreFlashAttention, FusedInferAttentionScore): the layout strings each takes, the (B, S, N,
/// D) of a q / k / v tensor in a layout, its engine view and vendor shape, and the heads and query
/// dims every call starts from. Not part of the API.

#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/cann/detail/common.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/layout.hpp"
#include "attnref/core/view.hpp"

namespace attnref::detail {

/// The layout of PFA (ifa false) or IFA (ifa true).
inline Layout pfa_layout(const char* fn, const std::string& s, bool ifa) {
  if (ifa)
    return parse_layout(fn, "params.input_layout", s, {Layout::BSH, Layout::BSND, Layout::BNSD});
  return parse_layout(fn, "params.input_layout", s,
                      {Layout::BSH, Layout::BSND, Layout::BNSD, Layout::BNSD_BSND, Layout::TND});
}

/// (B, S, N, D) of a q / k / v tensor in `layout` (TND: B = 1, S = T), checked against the head
/// count `n` (BSH: D = H / n).
template <class T>
std::array<Index, 4> pfa_dims(const char* fn, const char* arg, const StridedView<T>& t,
                              Layout layout, Index n) {
  const bool r3 = layout == Layout::BSH || layout == Layout::TND;
  ATTNREF_CHECK(!t.absent(), std::invalid_argument, fn, arg, "missing", "a tensor", "none");
  ATTNREF_CHECK(t.rank() == (r3 ? 3 : 4), std::invalid_argument, fn, std::string(arg) + ".shape",
                "rank mismatch for the layout", r3 ? "rank 3" : "rank 4", shape_str(t));
  std::array<Index, 4> d{};
  switch (layout) {
    case Layout::BSH:
      ATTNREF_CHECK(t.size(2) % n == 0 && t.size(2) > 0, std::invalid_argument, fn,
                    std::string(arg) + ".shape[2]", "hidden size not a multiple of the head count",
                    "a multiple of " + std::to_string(n), std::to_string(t.size(2)));
      d = {t.size(0), t.size(1), n, t.size(2) / n};
      break;
    case Layout::BSND:
      d = {t.size(0), t.size(1), t.size(2), t.size(3)};
      break;
    case Layout::BNSD:
    case Layout::BNSD_BSND:
      d = {t.size(0), t.size(2), t.size(1), t.size(3)};
      break;
    case Layout::TND:
      d = {1, t.size(0), t.size(1), t.size(2)};
      break;
  }
  ATTNREF_CHECK(d[2] == n, std::invalid_argument, fn, std::string(arg) + ".shape",
                "head count mismatch", std::to_string(n) + " heads", shape_str(t));
  ATTNREF_CHECK(d[3] >= 1 && d[3] <= 512, std::invalid_argument, fn, std::string(arg) + ".shape",
                "head size out of range", "[1, 512]", shape_str(t));
  return d;
}

/// The engine view of a q / k / v / out tensor with dims (B, S, N, D) in `layout`.
template <class T>
StridedView<T, 4> pfa_view(T* data, Layout layout, const std::array<Index, 4>& d) {
  switch (layout) {
    case Layout::BNSD:
    case Layout::BNSD_BSND:
      return bnsd_view(data, d[0], d[2], d[1], d[3]);
    case Layout::TND:
      return tnd_view(data, d[1], d[2], d[3]);
    default:
      return bsnd_view(data, d[0], d[1], d[2], d[3]);
  }
}

/// The vendor shape of an output with dims (B, S, N, D) in `layout` (BNSD_BSND: BSND).
inline std::vector<Index> pfa_shape(Layout layout, const std::array<Index, 4>& d) {
  switch (layout) {
    case Layout::BSH:
      return {d[0], d[1], d[2] * d[3]};
    case Layout::BNSD:
      return {d[0], d[2], d[1], d[3]};
    case Layout::TND:
      return {d[1], d[2], d[3]};
    default:
      return {d[0], d[1], d[2], d[3]};
  }
}

/// An NTD tensor [N, T, D] seen as TND [T, N, D]: the two strides swapped, nothing copied
/// (FusedInferAttentionScore's NTD_TND).
template <class T>
StridedView<T> ntd_as_tnd(const char* fn, const std::string& arg, const StridedView<T>& v) {
  if (v.absent()) return v;
  ATTNREF_CHECK(v.rank() == 3, std::invalid_argument, fn, arg + ".shape",
                "rank mismatch for the layout", "rank 3 ([N, T, D], NTD_TND)", shape_str(v));
  return StridedView<T>(v.data(), {v.size(1), v.size(0), v.size(2)},
                        {v.stride(1), v.stride(0), v.stride(2)});
}

inline Index pfa_clamp_tokens(std::int64_t v) {
  return static_cast<Index>(std::clamp<std::int64_t>(v, -2147483648LL, 2147483647LL));
}

/// The front matter both operators share: the layout, the head counts (N, KV_N) and the
/// query's (B, S, N, D).
struct CannFront {
  Layout layout;
  Index n, kvn;
  std::array<Index, 4> qd;
};

template <class T>
CannFront cann_front(const char* fn, const std::string& layout, bool ifa, std::int64_t num_heads,
                     std::int64_t num_kv_heads, const StridedView<T>& query) {
  CannFront f{};
  f.layout = pfa_layout(fn, layout, ifa);
  f.kvn = cann_kv_heads(fn, num_heads, num_kv_heads);
  f.n = static_cast<Index>(num_heads);
  f.qd = pfa_dims(fn, "query", query, f.layout, f.n);
  return f;
}

}  // namespace attnref::detail
