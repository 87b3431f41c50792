#pragma once
/// IncreFlashAttention's keys and values as the engine reads them (also FusedInferAttentionScore's
/// decode path): a paged cache, or one tensor or a list of per-batch tensors, with their lengths
/// and left padding, every shape and block-table entry checked. Not part of the API.

#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/attention/paged_kv.hpp"
#include "attnref/cann/detail/common.hpp"
#include "attnref/cann/detail/layouts.hpp"
#include "attnref/cann/incre_flash_attention_io.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/layout.hpp"
#include "attnref/core/types.hpp"
#include "attnref/detail/engine/work.hpp"

namespace attnref::detail {

/// The keys and values of an IFA call as the engine reads them: views (the pool, or the shape of
/// sequence 0), the pages of per-batch tensors, the tensors of different lengths gathered, the
/// kv lengths, the left-padding shifts and the key positions a mask / pse row must cover.
template <class TKV>
struct IfaKv {
  /// The views and the kv lengths (context_lens): paged, a validated cache; otherwise
  /// block_table absent and k / v the [B, S, N, D] views that the pages below point into.
  PagedKvCache<const TKV> cache;
  KvPages<TKV> pages;
  std::vector<TKV> packed_k, packed_v;  // BNSD tensor lists of different S, gathered
  std::vector<Index> shift;
  Index mask_cols = 0;
  /// The caller's name of the kv-length list (FusedInferAttentionScore: actual_seq_lengths_kv).
  std::string lens_arg = "actual_seq_lengths";
};

/// A paged cache: one tensor each, [blockNum, blockSize, KV_N·D] (or BNSD [blockNum, KV_N,
/// blockSize, D]), every used block-table entry checked.
template <class T, class TKV, class TM>
void ifa_paged_kv(const char* fn, const IncreFlashAttentionParams& params,
                  const IncreFlashAttentionInputs<T, TKV, TM>& in, Layout layout, Index B,
                  Index kvn, Index D, IfaKv<TKV>& kv) {
  constexpr bool kQuant = std::is_same_v<TKV, std::int8_t>;
  using L = Layout;
  ATTNREF_CHECK(in.key.size() == 1, std::invalid_argument, fn, "key / value",
                "paged: one cache tensor each", "1", std::to_string(in.key.size()));
  const auto& kc = in.key[0];
  const auto& vc = in.value[0];
  ATTNREF_CHECK(!kc.absent() && !vc.absent() && kc.shape() == vc.shape() &&
                    (kc.rank() == 3 || (kc.rank() == 4 && layout == L::BNSD)),
                std::invalid_argument, fn, "key[0].shape", "paged cache shape",
                "[blockNum, blockSize, KV_N * D] (or [blockNum, KV_N, blockSize, D] with BNSD), "
                "value the same",
                shape_str(kc) + " and " + shape_str(vc));
  const Index nb = kc.size(0), bs = kc.rank() == 3 ? kc.size(1) : kc.size(2);
  const Index width = kc.rank() == 3 ? kc.size(2) : kc.size(1) * kc.size(3);
  ATTNREF_CHECK(width == kvn * D && (kc.rank() == 3 || kc.size(1) == kvn), std::invalid_argument,
                fn, "key[0].shape", "KV_N * D mismatch",
                std::to_string(kvn) + " heads of " + std::to_string(D), shape_str(kc));
  const Index align = kQuant ? 32 : 16;
  ATTNREF_CHECK(params.block_size == bs, std::invalid_argument, fn, "params.block_size",
                "differs from the cache's block size", std::to_string(bs),
                std::to_string(params.block_size));
  ATTNREF_CHECK(bs > 0 && bs <= 512 && bs % align == 0, std::invalid_argument, fn,
                "params.block_size", "not supported",
                "(0, 512] and a multiple of " + std::to_string(align), std::to_string(bs));
  const auto& bt = in.block_table;
  ATTNREF_CHECK(!bt.absent() && bt.rank() == 2 && bt.size(0) == B, std::invalid_argument, fn,
                "block_table.shape", "mismatch", "[" + std::to_string(B) + ", maxBlocksPerSeq]",
                shape_str(bt));
  ATTNREF_CHECK(!in.actual_seq_lengths.empty(), std::invalid_argument, fn, kv.lens_arg,
                "required when paged", "kv lengths", "none");
  kv.mask_cols = detail::checked_mul(fn, "block_table.shape[1] * blockSize", bt.size(1), bs);
  kv.cache.context_lens =
      detail::cann_lengths(fn, kv.lens_arg.c_str(), in.actual_seq_lengths, B, kv.mask_cols);
  if (kc.rank() == 3) {
    kv.cache.k = StridedView<const TKV, 4>(kc.data(), {nb, bs, kvn, D}, {bs * width, width, D, 1});
    kv.cache.v = StridedView<const TKV, 4>(vc.data(), {nb, bs, kvn, D}, {bs * width, width, D, 1});
  } else {
    kv.cache.k =
        StridedView<const TKV, 4>(kc.data(), {nb, bs, kvn, D}, {kvn * bs * D, D, bs * D, 1});
    kv.cache.v =
        StridedView<const TKV, 4>(vc.data(), {nb, bs, kvn, D}, {kvn * bs * D, D, bs * D, 1});
  }
  kv.cache.block_table = StridedView<const std::int32_t, 2>(bt.data(), {B, bt.size(1)});
  // Every used block-table entry, named (std::out_of_range), before anything is written.
  kv.cache.validate(fn, {"key[0]", "value[0]", "block_table", kv.lens_arg.c_str(),
                         "params.block_size", "blockSize"});
}

/// One tensor with batch B, or B tensors with batch 1 (their S may differ), with the optional
/// kv left padding.
template <class T, class TKV, class TM>
void ifa_listed_kv(const char* fn, const IncreFlashAttentionInputs<T, TKV, TM>& in, Layout layout,
                   Index B, Index kvn, Index D, IfaKv<TKV>& kv) {
  ATTNREF_CHECK(in.key.size() == 1 || static_cast<Index>(in.key.size()) == B, std::invalid_argument,
                fn, "key / value", "list length neither 1 nor the batch",
                "1 or " + std::to_string(B), std::to_string(in.key.size()));
  const bool list = in.key.size() > 1 || B == 1;
  std::vector<std::array<Index, 4>> dims;
  Index max_s = 0;
  bool same_s = true;
  for (size_t i = 0; i < in.key.size(); ++i) {
    const std::string ki = "key[" + std::to_string(i) + "]",
                      vi = "value[" + std::to_string(i) + "]";
    const auto kd = detail::pfa_dims(fn, ki.c_str(), in.key[i], layout, kvn);
    ATTNREF_CHECK(in.value[i].shape() == in.key[i].shape() && !in.value[i].absent(),
                  std::invalid_argument, fn, vi + ".shape", "differs from the key's",
                  shape_str(in.key[i]), shape_str(in.value[i]));
    ATTNREF_CHECK(kd[3] == D && kd[0] == (list ? 1 : B), std::invalid_argument, fn, ki + ".shape",
                  "mismatch",
                  "batch " + std::to_string(list ? 1 : B) + ", head size " + std::to_string(D),
                  shape_str(in.key[i]));
    dims.push_back(kd);
    if (i > 0 && kd[1] != dims[0][1]) same_s = false;
    max_s = std::max(max_s, kd[1]);
  }
  kv.cache.context_lens.resize(static_cast<size_t>(B));
  const auto& al = in.actual_seq_lengths;
  ATTNREF_CHECK(al.empty() || al.size() == 1 || static_cast<Index>(al.size()) >= B,
                std::invalid_argument, fn, kv.lens_arg, "length neither 1 nor >= batch",
                "1 or >= " + std::to_string(B), std::to_string(al.size()));
  for (Index b = 0; b < B; ++b) {
    const Index s_b = dims[list ? static_cast<size_t>(b) : 0][1];
    Index l = s_b;
    if (!al.empty()) {
      const std::int64_t v = al[al.size() == 1 ? 0 : static_cast<size_t>(b)];
      ATTNREF_CHECK(v >= 0 && v <= s_b, std::invalid_argument, fn,
                    kv.lens_arg + "[" + std::to_string(b) + "]", "out of range",
                    "[0, " + std::to_string(s_b) + "]", std::to_string(v));
      l = static_cast<Index>(v);
    }
    kv.cache.context_lens[static_cast<size_t>(b)] = l;
  }
  const auto& kp = in.kv_padding_size;
  if (!kp.absent()) {
    ATTNREF_CHECK(!kp.absent() && kp.numel() == 1, std::invalid_argument, fn,
                  "kv_padding_size.shape", "not one value", "[] or [1]", shape_str(kp));
    ATTNREF_CHECK(in.key.size() == 1, std::invalid_argument, fn, "kv_padding_size",
                  "needs one key / value tensor", "a list of 1", std::to_string(in.key.size()));
    ATTNREF_CHECK(!al.empty(), std::invalid_argument, fn, "kv_padding_size",
                  "given without kv lengths (the NPU would ignore it)", kv.lens_arg, "none");
    const Index S = dims[0][1];
    const Index pad = std::max<Index>(0, static_cast<Index>(*kp.data()));
    kv.shift.assign(static_cast<size_t>(B), 0);
    for (Index b = 0; b < B; ++b) {
      const Index start = S - pad - kv.cache.context_lens[static_cast<size_t>(b)];
      if (start < 0)
        kv.cache.context_lens[static_cast<size_t>(b)] = 0;  // the kernel's all-zero output
      else
        kv.shift[static_cast<size_t>(b)] = start;
    }
  }
  kv.mask_cols = 0;
  for (Index b = 0; b < B; ++b)
    kv.mask_cols =
        std::max(kv.mask_cols, (kv.shift.empty() ? 0 : kv.shift[static_cast<size_t>(b)]) +
                                   kv.cache.context_lens[static_cast<size_t>(b)]);
  const bool gather = list && !same_s;
  if (!kv.shift.empty()) {
    // One page per sequence starting at its window; dims[0] has batch B (or 1 = B).
    const std::array<Index, 4> d0{B, dims[0][1], kvn, D};
    const auto v0 = detail::pfa_view(in.key[0].data(), layout, d0);
    kv.cache.k =
        StridedView<const TKV, 4>(in.key[0].data(), d0, {0, v0.stride(1), v0.stride(2), 1});
    kv.cache.v =
        StridedView<const TKV, 4>(in.value[0].data(), d0, {0, v0.stride(1), v0.stride(2), 1});
    kv.pages.page_size = std::max<Index>(1, d0[1]);
    for (Index b = 0; b < B; ++b) {
      const Index o = b * v0.stride(0) + kv.shift[static_cast<size_t>(b)] * v0.stride(1);
      kv.pages.k.push_back(in.key[0].data() + o);
      kv.pages.v.push_back(in.value[0].data() + o);
      kv.pages.first.push_back(b);
    }
  } else if (!list) {
    kv.cache.k = detail::pfa_view(in.key[0].data(), layout, dims[0]);
    kv.cache.v = detail::pfa_view(in.value[0].data(), layout, dims[0]);
  } else if (!gather) {
    // One page per sequence, every tensor of tensor 0's shape.
    const std::array<Index, 4> d0{B, max_s, kvn, D};
    const auto v0 = detail::pfa_view(in.key[0].data(), layout, dims[0]);
    kv.cache.k =
        StridedView<const TKV, 4>(in.key[0].data(), d0, {0, v0.stride(1), v0.stride(2), 1});
    kv.cache.v =
        StridedView<const TKV, 4>(in.value[0].data(), d0, {0, v0.stride(1), v0.stride(2), 1});
    kv.pages.page_size = std::max<Index>(1, max_s);
    for (Index b = 0; b < B; ++b) {
      kv.pages.k.push_back(in.key[static_cast<size_t>(b)].data());
      kv.pages.v.push_back(in.value[static_cast<size_t>(b)].data());
      kv.pages.first.push_back(b);
    }
  }
  if (gather) {  // tensors of different lengths: packed into one [B, max_s, KV_N, D]
    kv.packed_k.assign(static_cast<size_t>(B * max_s * kvn * D), TKV{});
    kv.packed_v.assign(kv.packed_k.size(), TKV{});
    for (Index b = 0; b < B; ++b) {
      const auto kb = detail::pfa_view(in.key[static_cast<size_t>(b)].data(), layout,
                                       dims[static_cast<size_t>(b)]);
      const auto vb = detail::pfa_view(in.value[static_cast<size_t>(b)].data(), layout,
                                       dims[static_cast<size_t>(b)]);
      for (Index t = 0; t < kv.cache.context_lens[static_cast<size_t>(b)]; ++t)
        for (Index h = 0; h < kvn; ++h)
          for (Index x = 0; x < D; ++x) {
            const size_t dst = static_cast<size_t>(((b * max_s + t) * kvn + h) * D + x);
            kv.packed_k[dst] = kb(0, t, h, x);
            kv.packed_v[dst] = vb(0, t, h, x);
          }
    }
    kv.cache.k = bsnd_view<const TKV>(kv.packed_k.data(), B, max_s, kvn, D);
    kv.cache.v = bsnd_view<const TKV>(kv.packed_v.data(), B, max_s, kvn, D);
  }
}

}  // namespace attnref::detail
