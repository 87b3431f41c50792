#pragma once
/// FusedInferAttentionScore's shared prefix (V2+: key_shared_prefix, value_shared_prefix,
/// actual_shared_prefix_len): the first P rows of one prefix tensor stand in front of every
/// sequence's own keys and values, so sequence b sees P + len_b keys, the prefix at positions
/// [0, P) (its mask, pse and per-token scale columns too). Built as engine pages of one token
/// each, pointing into the caller's tensors: nothing is copied, except the prefix rows when the
/// prefix's head stride differs from the keys' (BNSD: the head stride is S·D). Not part of the
/// API.

#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/cann/detail/common.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"
#include "attnref/detail/engine/work.hpp"

namespace attnref::detail {

/// The pages and views of a call with a shared prefix (P > 0).
template <class TKV>
struct FiaPrefix {
  Index P = 0;                    // prefix rows in use
  std::vector<TKV> kbuf, vbuf;    // prefix rows copied to the keys' head stride, when needed
  KvPages<TKV> pages;             // one page per token: the prefix rows, then the sequence's
  StridedView<const TKV, 4> k{};  // [B, P + S, KV_N, D], batch stride 0 (strides of a page)
  StridedView<const TKV, 4> v{};
};

/// The checks of the prefix tensors against key / value (dims from pfa_dims: (1, Ps, KV_N, D))
/// and P from actual_shared_prefix_len (empty: Ps).
inline Index fia_prefix_len(const char* fn, const std::vector<std::int64_t>& len,
                            const std::array<Index, 4>& pkd, const std::array<Index, 4>& pvd,
                            const std::array<Index, 4>& kd, const std::array<Index, 4>& vd) {
  ATTNREF_CHECK(pkd[0] == 1 && pvd[0] == 1, std::invalid_argument, fn,
                "key_shared_prefix / value_shared_prefix", "batch other than 1", "batch 1",
                std::to_string(pkd[0]) + " and " + std::to_string(pvd[0]));
  ATTNREF_CHECK(
      pkd[2] == kd[2] && pkd[3] == kd[3] && pvd[2] == vd[2] && pvd[3] == vd[3] && pvd[1] == pkd[1],
      std::invalid_argument, fn, "key_shared_prefix / value_shared_prefix",
      "heads, head sizes or lengths differ from key / value's",
      "KV_N " + std::to_string(kd[2]) + ", D " + std::to_string(kd[3]) + " / " +
          std::to_string(vd[3]) + ", equal lengths",
      "S " + std::to_string(pkd[1]) + " and " + std::to_string(pvd[1]));
  if (len.empty()) return pkd[1];
  ATTNREF_CHECK(len.size() == 1 && len[0] >= 0 && len[0] <= pkd[1], std::invalid_argument, fn,
                "actual_shared_prefix_len", "not one value in [0, prefix S]",
                "[0, " + std::to_string(pkd[1]) + "]",
                len.size() == 1 ? std::to_string(len[0]) : std::to_string(len.size()) + " values");
  return static_cast<Index>(len[0]);
}

/// Rows [0, P) of a prefix view at head stride `hs` (its own when equal; else copied to `buf`
/// in chunks of hs / D rows, so that row p's head h is at row(p) + h·hs).
template <class TKV>
std::vector<const TKV*> fia_prefix_rows(const StridedView<const TKV, 4>& x, Index P, Index hs,
                                        std::vector<TKV>& buf) {
  std::vector<const TKV*> rows;
  const Index n = x.size(2), d = x.size(3);
  if (x.stride(2) == hs || n == 1) {
    for (Index p = 0; p < P; ++p) rows.push_back(x.ptr(0, p, 0, 0));
    return rows;
  }
  const Index chunk = std::max<Index>(1, hs / d);  // rows per chunk of n·hs elements
  const Index chunks = (P + chunk - 1) / chunk;
  buf.assign(static_cast<size_t>(chunks * n * hs), TKV{});
  for (Index p = 0; p < P; ++p) {
    TKV* row = buf.data() + (p / chunk) * n * hs + (p % chunk) * d;
    for (Index h = 0; h < n; ++h)
      for (Index e = 0; e < d; ++e) row[h * hs + e] = x(0, p, h, e);
    rows.push_back(row);
  }
  return rows;
}

/// The pages: per sequence b, the P prefix rows, then its S rows of `key` / `value` ([B, S, KV_N,
/// D] engine views of dense tensors); `pk` / `pv` the prefix views (1, Ps, KV_N, D).
template <class TKV>
void fia_prefix_pages(FiaPrefix<TKV>& f, const StridedView<const TKV, 4>& key,
                      const StridedView<const TKV, 4>& value, const StridedView<const TKV, 4>& pk,
                      const StridedView<const TKV, 4>& pv) {
  const Index B = key.size(0), S = key.size(1), P = f.P;
  // Every page shares one head stride: the keys', or the prefix's when the keys have no rows.
  const Index khs = S > 0 ? key.stride(2) : pk.stride(2);
  const Index vhs = S > 0 ? value.stride(2) : pv.stride(2);
  const auto kp = fia_prefix_rows(pk, P, khs, f.kbuf);
  const auto vp = fia_prefix_rows(pv, P, vhs, f.vbuf);
  f.pages.page_size = 1;
  for (Index b = 0; b < B; ++b) {
    f.pages.first.push_back(b * (P + S));
    f.pages.k.insert(f.pages.k.end(), kp.begin(), kp.end());
    f.pages.v.insert(f.pages.v.end(), vp.begin(), vp.end());
    for (Index t = 0; t < S; ++t) {
      f.pages.k.push_back(key.ptr(b, t, 0, 0));
      f.pages.v.push_back(value.ptr(b, t, 0, 0));
    }
  }
  const Index kts = S > 0 ? key.stride(1) : pk.stride(1);
  const Index vts = S > 0 ? value.stride(1) : pv.stride(1);
  const TKV* k0 = S > 0 ? key.data() : pk.data();
  const TKV* v0 = S > 0 ? value.data() : pv.data();
  f.k = StridedView<const TKV, 4>(k0, {B, P + S, key.size(2), key.size(3)}, {0, kts, khs, 1});
  f.v = StridedView<const TKV, 4>(v0, {B, P + S, value.size(2), value.size(3)}, {0, vts, vhs, 1});
}

}  // namespace attnref::detail
