#pragma once
/// attnref::incre_flash_attention — CANN IncreFlashAttention (aclnnIncreFlashAttentionV4,
/// MindSpore ops.incre_flash_attention) on the attention engine (docs/semantics.md §7).
///
/// One query token per batch against its keys t < actual_seq_lengths[b] (default: the kv
/// tensor's S), contiguous (one tensor with batch B, or B tensors with batch 1) or paged
/// (block_table, block_size: key t is row t % blockSize of block block_table[b][t / blockSize]
/// of the cache [blockNum, blockSize, KV_N·D], or [blockNum, KV_N, blockSize, D] with BNSD).
/// Score s = q·k·scale_value + pse[b or 0][h][0][t] (pse_order as PromptFlashAttention); a
/// masked key (atten_mask[b][t] nonzero) gets s = -1e12 (the NPU's select): IFA has no row fix,
/// so a row whose every key is masked is the mean of V over them. A batch with no key gives 0.
/// Antiquant (int8 K/V): K = (K8 + offset)·scale per channel (KV_N·D) or per tensor, V likewise
/// (index 0 of antiquant_scale / antiquant_offset: key, 1: value); computed exactly in that
/// algebra with the K scale folded into q, the offset term added to every score of the row and
/// V's affine map applied to the normalised output, fp32 throughout. Per-token antiquant
/// (antiquant_mode 1, FusedInferAttentionScore's (2, B, S) fp32 scales): K and V of the keys
/// read are dequantized to fp32, K = (K8 + offset[0][b][p])·scale[0][b][p] at position p, and
/// the float problem runs on the engine. Softmax and P·V in fp32 (the NPU rounds P to the KV
/// type before P·V; attnref keeps fp32), output rounded to T.
///
/// kv left padding (kv_padding_size, one int64 pad, contiguous single tensor with actual
/// lengths): batch b reads positions [S - pad - len_b, S - pad) of its S (pad < 0 counts as 0),
/// and its mask, pse and per-token scale columns are those positions. A batch whose window
/// would start before 0 gives 0 (the vector kernel's InitAllZeroOutput; the docs call the
/// result unspecified).

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/attention.hpp"
#include "attnref/attention/paged_kv.hpp"
#include "attnref/cann/detail/common.hpp"
#include "attnref/cann/prompt_flash_attention.hpp"
#include "attnref/core/dense.hpp"
#include "attnref/core/types.hpp"

namespace attnref {

struct IncreFlashAttentionParams {
  std::int64_t num_heads = 1;            ///< numHeads
  double scale_value = 1.0;              ///< scaleValue
  std::string input_layout = "BSH";      ///< BSH, BSND, BNSD
  std::int64_t num_key_value_heads = 0;  ///< 0: num_heads
  std::int64_t block_size = 0;           ///< paged KV (with block_table)
  std::int64_t inner_precise = 1;        ///< 0 or 1 (no row-invalid fix in IFA)
  PseOrder pse_order = PseOrder::ScaleThenAdd;
  /// FusedInferAttentionScore's antiquantMode: 0 per channel / per tensor (antiquant_scale),
  /// 1 per token (antiquant_scale_per_token).
  std::int64_t antiquant_mode = 0;
};

/// T: half or bfloat16 (float: attnref extension); TKV: T, or int8 with antiquant; TM: bool,
/// int8 or uint8.
template <class T, class TKV = T, class TM = std::uint8_t>
struct IncreFlashAttentionInputs {
  StridedView<const T> query;  ///< BSH [B, 1, H], BSND [B, 1, N, D], BNSD [B, N, 1, D]
  /// One tensor with batch B, or B tensors with batch 1 (layout of the query, S = kv length);
  /// paged: one cache tensor [blockNum, blockSize, KV_N·D] (or [blockNum, KV_N, blockSize, D]
  /// with BNSD).
  std::vector<StridedView<const TKV>> key;
  std::vector<StridedView<const TKV>> value;
  StridedView<const T> pse_shift{};                ///< [B or 1, N, 1, >= S]
  StridedView<const TM> atten_mask{};              ///< [B, S'], [B, 1, S'], [B, 1, 1, S']
  std::vector<std::int64_t> actual_seq_lengths{};  ///< kv lengths per batch (required if paged)
  StridedView<const T>
      antiquant_scale{};  ///< int8 K/V: (2, N, 1, D), (2, 1, N, D), (2, N, D), (2, N·D), (2)
  StridedView<const T> antiquant_offset{};  ///< optional, same shape
  /// antiquant_mode 1: (2, B, S') fp32, [0][b][p] the scale of key position p of batch b,
  /// [1][b][p] its value's; S' covers every position read. The offset is optional.
  StridedView<const float> antiquant_scale_per_token{};
  StridedView<const float> antiquant_offset_per_token{};
  /// kv left padding: one int64 (shape [] or [1]); needs one contiguous key / value tensor and
  /// actual_seq_lengths.
  StridedView<const std::int64_t> kv_padding_size{};
  StridedView<const std::int32_t> block_table{};  ///< [B, maxBlocksPerSeq]
  /// int8 output: out = sat(rint(O·quant_scale2 + quant_offset2)), per tensor or per channel
  /// (N·D values); the offset is optional.
  StridedView<const float> quant_scale2{};
  StridedView<const float> quant_offset2{};

  /// Calls f(name, view) for every tensor field (key[i], value[i] for the lists).
  template <class F>
  void for_each_view(F&& f) {
    f("query", query);
    for (size_t i = 0; i < key.size(); ++i) f("key[" + std::to_string(i) + "]", key[i]);
    for (size_t i = 0; i < value.size(); ++i) f("value[" + std::to_string(i) + "]", value[i]);
    f("pse_shift", pse_shift), f("atten_mask", atten_mask);
    f("antiquant_scale", antiquant_scale), f("antiquant_offset", antiquant_offset);
    f("antiquant_scale_per_token", antiquant_scale_per_token);
    f("antiquant_offset_per_token", antiquant_offset_per_token);
    f("kv_padding_size", kv_padding_size), f("block_table", block_table);
    f("quant_scale2", quant_scale2), f("quant_offset2", quant_offset2);
  }
};

template <class T>
struct IncreFlashAttentionOutputs {
  StridedView<T> attention_out;  ///< the query's shape

  template <class F>
  void for_each_view(F&& f) {
    f("attention_out", attention_out);
  }
};

namespace detail {

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

/// What IFA's checks found: the layout, heads and query dims (CannFront), the keys and values
/// as the engine reads them, and the antiquant mode.
template <class TKV>
struct IfaPlan : CannFront {
  Index B = 0, D = 0, per = 0;  // per: antiquant values per K or V (KV_N·D, or 1)
  bool paged = false, per_token = false;
  IfaKv<TKV> kv;
};

/// Views, layout, heads, params and the output shape, then the keys and values (paged or
/// listed, with lengths and left padding).
template <class T, class TKV, class TM, class TO>
IfaPlan<TKV> ifa_plan(const char* fn, const IncreFlashAttentionParams& params,
                      const IncreFlashAttentionInputs<T, TKV, TM>& in,
                      const IncreFlashAttentionOutputs<TO>& out,
                      const char* lens_arg = "actual_seq_lengths") {
  check_views(fn, "query", in.query, "pse_shift", in.pse_shift, "atten_mask", in.atten_mask,
              "antiquant_scale", in.antiquant_scale, "antiquant_offset", in.antiquant_offset,
              "antiquant_scale_per_token", in.antiquant_scale_per_token,
              "antiquant_offset_per_token", in.antiquant_offset_per_token, "kv_padding_size",
              in.kv_padding_size, "block_table", in.block_table, "quant_scale2", in.quant_scale2,
              "quant_offset2", in.quant_offset2, "attention_out", out.attention_out);
  for (size_t i = 0; i < in.key.size(); ++i)
    check_view(fn, "key[" + std::to_string(i) + "]", in.key[i]);
  for (size_t i = 0; i < in.value.size(); ++i)
    check_view(fn, "value[" + std::to_string(i) + "]", in.value[i]);
  IfaPlan<TKV> pl;
  static_cast<CannFront&>(pl) = cann_front(fn, params.input_layout, true, params.num_heads,
                                           params.num_key_value_heads, in.query);
  ATTNREF_CHECK(pl.qd[1] == 1, std::invalid_argument, fn, "query.shape",
                "query sequence length must be 1", "S = 1", shape_str(in.query));
  const Index B = pl.B = pl.qd[0], D = pl.D = pl.qd[3];
  const Index kvn = pl.kvn;
  const Layout layout = pl.layout;
  ATTNREF_CHECK(params.inner_precise == 0 || params.inner_precise == 1, std::invalid_argument, fn,
                "params.inner_precise", "out of range for IncreFlashAttention", "0 or 1",
                std::to_string(params.inner_precise));
  ATTNREF_CHECK(std::isfinite(params.scale_value), std::invalid_argument, fn, "params.scale_value",
                "not finite", "a finite value", std::to_string(params.scale_value));
  ATTNREF_CHECK(!out.attention_out.absent() && out.attention_out.shape() == in.query.shape(),
                std::invalid_argument, fn, "attention_out.shape", "mismatch (the query's shape)",
                shape_str(in.query), shape_str(out.attention_out));
  const bool paged = pl.paged = !in.block_table.absent();
  ATTNREF_CHECK(in.key.size() == in.value.size() && !in.key.empty(), std::invalid_argument, fn,
                "key / value", "tensor lists of different or zero length", "equal lengths >= 1",
                std::to_string(in.key.size()) + " and " + std::to_string(in.value.size()));

  // Keys and values: the engine view (shape of sequence 0 / the pool), pages, lengths.
  ATTNREF_CHECK(in.kv_padding_size.absent() || !paged, std::invalid_argument, fn, "kv_padding_size",
                "not supported with a paged cache", "no block_table", shape_str(in.block_table));
  IfaKv<TKV>& kv = pl.kv;
  kv.lens_arg = lens_arg;
  if (paged)
    ifa_paged_kv(fn, params, in, layout, B, kvn, D, kv);
  else
    ifa_listed_kv(fn, in, layout, B, kvn, D, kv);
  return pl;
}

/// The mask and pse_shift, checked against the key positions and bound to the variant.
template <class T, class TKV, class TM>
void ifa_bind_masks(const char* fn, const IncreFlashAttentionParams& params,
                    const IncreFlashAttentionInputs<T, TKV, TM>& in, const IfaPlan<TKV>& pl,
                    CannVariant<TM, T>& var) {
  const Index B = pl.B, n = pl.n, mask_cols = pl.kv.mask_cols;
  var.fill = -1e12f;
  var.scale = static_cast<float>(params.scale_value);
  if (!pl.kv.shift.empty()) var.kv_shift = pl.kv.shift.data();
  const auto& m = in.atten_mask;
  if (!m.absent()) {
    const Index r = m.rank();
    const bool ok = !m.absent() && r >= 2 && r <= 4 && m.size(0) == B &&
                    (r < 3 || m.size(1) == 1) && (r < 4 || m.size(2) == 1) &&
                    m.size(r - 1) >= mask_cols;
    ATTNREF_CHECK(ok, std::invalid_argument, fn, "atten_mask.shape", "mismatch",
                  "[" + std::to_string(B) + ", S'], [" + std::to_string(B) + ", 1, S'] or [" +
                      std::to_string(B) + ", 1, 1, S'] with S' >= " + std::to_string(mask_cols),
                  shape_str(m));
    var.mask = StridedView<const TM, 3>(m.data(), {B, 1, m.size(r - 1)}, {m.size(r - 1), 0, 1});
  }
  const auto& ps = in.pse_shift;
  if (!ps.absent()) {
    ATTNREF_CHECK(!ps.absent() && ps.rank() == 4 && (ps.size(0) == 1 || ps.size(0) == B) &&
                      ps.size(1) == n && ps.size(2) == 1 && ps.size(3) >= mask_cols,
                  std::invalid_argument, fn, "pse_shift.shape", "mismatch",
                  "[1 or " + std::to_string(B) + ", " + std::to_string(n) +
                      ", 1, >= " + std::to_string(mask_cols) + "]",
                  shape_str(ps));
    var.pse = StridedView<const T, 4>(ps.data(), {ps.size(0), ps.size(1), 1, ps.size(3)});
    var.add_then_scale = params.pse_order == PseOrder::AddThenScale;
  }
}

/// The antiquant mode and its scale / offset shapes (per channel, per tensor or per token).
template <class T, class TKV, class TM>
void ifa_antiquant(const char* fn, const IncreFlashAttentionParams& params,
                   const IncreFlashAttentionInputs<T, TKV, TM>& in, IfaPlan<TKV>& pl) {
  constexpr bool kQuant = std::is_same_v<TKV, std::int8_t>;
  const Index B = pl.B, D = pl.D, kvn = pl.kvn, mask_cols = pl.kv.mask_cols;
  // Antiquant scales: per channel (KV_N·D) or per tensor, [0] key and [1] value.
  const auto& as = in.antiquant_scale;
  const auto& ao = in.antiquant_offset;
  Index& per = pl.per;  // values per K or V: KV_N·D, or 1
  const auto& ts = in.antiquant_scale_per_token;
  const auto& to = in.antiquant_offset_per_token;
  ATTNREF_CHECK(
      params.antiquant_mode == 0 || (params.antiquant_mode == 1 && kQuant), std::invalid_argument,
      fn, "params.antiquant_mode", "not supported",
      kQuant ? "0 (per channel / per tensor) or 1 (per token)" : "0 (no int8 key / value)",
      std::to_string(params.antiquant_mode));
  const bool per_token = pl.per_token = params.antiquant_mode == 1;
  if (per_token) {
    ATTNREF_CHECK(as.absent() && ao.absent(), std::invalid_argument, fn,
                  "antiquant_scale / antiquant_offset", "given with antiquant_mode 1 (per token)",
                  "none (antiquant_scale_per_token instead)", shape_str(as));
    ATTNREF_CHECK(
        !ts.absent() && ts.rank() == 3 && ts.size(0) == 2 && ts.size(1) == B &&
            ts.size(2) >= mask_cols,
        std::invalid_argument, fn, "antiquant_scale_per_token.shape", "mismatch (antiquant_mode 1)",
        "(2, " + std::to_string(B) + ", >= " + std::to_string(mask_cols) + ")", shape_str(ts));
    ATTNREF_CHECK(to.absent() || (to.shape() == ts.shape()), std::invalid_argument, fn,
                  "antiquant_offset_per_token.shape", "differs from antiquant_scale_per_token's",
                  shape_str(ts), shape_str(to));
  } else {
    ATTNREF_CHECK(ts.absent() && to.absent(), std::invalid_argument, fn,
                  "antiquant_scale_per_token / antiquant_offset_per_token",
                  "given without antiquant_mode 1", "none", shape_str(ts));
  }
  if (!per_token) {
    if constexpr (kQuant) {
      const std::vector<std::vector<Index>> shapes{
          {2, kvn, 1, D}, {2, 1, kvn, D}, {2, kvn, D}, {2, kvn * D}, {2}};
      const bool ok =
          !as.absent() && std::find(shapes.begin(), shapes.end(), as.shape()) != shapes.end();
      ATTNREF_CHECK(ok, std::invalid_argument, fn, "antiquant_scale.shape",
                    "not an accepted shape (int8 key / value)",
                    "(2, KV_N, 1, D), (2, 1, KV_N, D), (2, KV_N, D), (2, KV_N*D) or (2)",
                    shape_str(as));
      ATTNREF_CHECK(ao.absent() || (ao.shape() == as.shape()), std::invalid_argument, fn,
                    "antiquant_offset.shape", "differs from antiquant_scale's", shape_str(as),
                    shape_str(ao));
      per = as.numel() / 2;
    } else {
      ATTNREF_CHECK(as.absent() && ao.absent(), std::invalid_argument, fn,
                    "antiquant_scale / antiquant_offset", "given with floating-point key / value",
                    "none", shape_str(as));
    }
  }
}

/// A validated IncreFlashAttention call, ready to run: the plan, the engine problem (B sequences
/// of one query token), its hooks and its execution config. The hooks and pages point into the
/// plan: a problem is filled in place and never copied.
template <class T, class TKV, class TM, class TO>
struct IfaProblem {
  IfaProblem() = default;
  IfaProblem(const IfaProblem&) = delete;
  IfaProblem& operator=(const IfaProblem&) = delete;
  IfaPlan<TKV> pl;
  CannVariant<TM, T> var{};
  AttentionInputs<T, TKV> e;
  AttentionParams ep;
  AttentionOutputs<TO> eo;
  ExecConfig ex;
  const char* fn = "incre_flash_attention";     ///< the operator named in error messages
  const char* lens_arg = "actual_seq_lengths";  ///< the caller's name of the kv lengths
  /// The caller binds the antiquant maps itself (FusedInferAttentionScore's separate K / V
  /// scales): no antiquant_scale is required or read.
  bool external_antiquant = false;
  /// Called on the plan before the masks and scales are checked against it: a caller's change
  /// of the keys (FusedInferAttentionScore's shared prefix). Empty: none.
  std::function<void(IfaPlan<TKV>&)> extend_kv;
};

/// The engine problem, validated against the caller's tensors, with the shared query / output
/// hooks (detail/hooks/io.hpp): per-channel antiquant folds the K scale into q and the K offset
/// into a row constant, V's affine map and the int8 output quantization apply to each output
/// row; per-token antiquant dequantizes each key and value as the engine loads its tile. Batches
/// without keys give 0.
template <class T, class TKV, class TM, class TO>
void ifa_engine_problem(const IncreFlashAttentionParams& params,
                        const IncreFlashAttentionInputs<T, TKV, TM>& in,
                        const IncreFlashAttentionOutputs<TO>& out, IfaProblem<T, TKV, TM, TO>& pr) {
  constexpr bool kInt8Out = std::is_same_v<TO, std::int8_t>;
  constexpr bool kQuant = std::is_same_v<TKV, std::int8_t>;
  const char* fn = pr.fn;
  const IfaPlan<TKV>& pl = pr.pl;
  const Index B = pl.B, D = pl.D, n = pl.n, per = pl.per;
  auto& var = pr.var;
  auto& e = pr.e;
  auto& ep = pr.ep;
  auto& eo = pr.eo;
  e.read_kv(pl.kv.cache);
  e.q = pfa_view(in.query.data(), pl.layout, pl.qd);
  const KvPages<TKV>& pages = pl.kv.pages;
  ep.scale = var.add_then_scale ? 1.0 : params.scale_value;
  eo.o = pfa_view(out.attention_out.data(), pl.layout, pl.qd);
  cann_post_quant(fn, in.quant_scale2, in.quant_offset2, n, D, kInt8Out, var);
  var.post_zero_empty = true;
  if (pages.first.empty())  // the engine's checks, as the run will make them
    validate(e, ep, eo, pr.ex);
  else
    (void)resolve("attention_with", e, ep, eo, pr.ex, /*kv_template=*/true);
  var.group = n / pl.kvn;
  if constexpr (kQuant) {
    var.zero_empty = true;
    if (pr.external_antiquant) {  // (the caller's maps)
    } else if (pl.per_token) {    // the engine dequantizes each key and value as it loads its tile
      const auto& ts = in.antiquant_scale_per_token;
      const auto& to = in.antiquant_offset_per_token;
      var.tok_scale = ts.data();
      var.tok_offset = to.absent() ? nullptr : to.data();
      var.tok_batch = B;
      var.tok_stride = ts.size(2);
    } else {  // [0] the keys', [1] the values': per channel (KV_N·D values) or per tensor
      const T* as = in.antiquant_scale.data();
      const T* ao = in.antiquant_offset.absent() ? nullptr : in.antiquant_offset.data();
      var.bias_scale = static_cast<float>(ep.scale);
      for (Index c = 0; c < pl.kvn * D; ++c) {
        const Index i = per == 1 ? 0 : c;
        var.k_scale.push_back(static_cast<float>(as[i]));
        var.v_scale.push_back(static_cast<float>(as[per + i]));
        if (ao == nullptr) continue;
        var.k_offset.push_back(static_cast<float>(ao[i]));
        var.v_offset.push_back(static_cast<float>(ao[per + i]));
      }
    }
  }
}

/// Validate and plan into `pr` (dense arguments): every check of incre_flash_attention, nothing
/// written; ifa_run runs it.
template <class T, class TKV, class TM, class TO>
void ifa_prepare(const IncreFlashAttentionParams& params,
                 const IncreFlashAttentionInputs<T, TKV, TM>& in,
                 const IncreFlashAttentionOutputs<TO>& out, const ExecConfig& exec,
                 IfaProblem<T, TKV, TM, TO>& pr) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "incre_flash_attention query: half, bfloat16 or float");
  static_assert(std::is_same_v<TKV, T> || std::is_same_v<TKV, std::int8_t>,
                "incre_flash_attention key / value: the query's type or int8 (antiquant)");
  constexpr bool kInt8Out = std::is_same_v<TO, std::int8_t>;
  static_assert(std::is_same_v<TO, T> || kInt8Out,
                "incre_flash_attention: the output type is the query's, or int8");
  static_assert(std::is_same_v<TM, bool> || std::is_same_v<TM, std::int8_t> ||
                    std::is_same_v<TM, std::uint8_t>,
                "incre_flash_attention mask: bool, int8 or uint8");
  pr.ex = exec;
  pr.pl = ifa_plan(pr.fn, params, in, out, pr.lens_arg);
  if (pr.extend_kv) pr.extend_kv(pr.pl);
  ifa_bind_masks(pr.fn, params, in, pr.pl, pr.var);
  if (!pr.external_antiquant) ifa_antiquant(pr.fn, params, in, pr.pl);
  ifa_engine_problem(params, in, out, pr);
}

template <class T, class TKV, class TM, class TO>
void ifa_run(const IfaProblem<T, TKV, TM, TO>& pr) {
  if (pr.pl.kv.pages.first.empty())
    attention_with(pr.var, pr.e, pr.ep, pr.eo, pr.ex);
  else
    attention_with_pages(pr.var, pr.e, pr.ep, pr.eo, pr.pl.kv.pages, pr.ex);
}

/// incre_flash_attention (run) or its validation alone (!run), every view through a DenseArena.
template <class T, class TKV, class TM, class TO>
void ifa_call(const IncreFlashAttentionParams& params,
              const IncreFlashAttentionInputs<T, TKV, TM>& in,
              const IncreFlashAttentionOutputs<TO>& out, const ExecConfig& exec, bool run) {
  check_exec("incre_flash_attention", exec);
  dense_call("incre_flash_attention", in, out, run, [&](const auto& din, const auto& dout) {
    IfaProblem<T, TKV, TM, TO> pr;
    ifa_prepare(params, din, dout, exec, pr);
    if (run) ifa_run(pr);
  });
}
}  // namespace detail

/// Every check of incre_flash_attention() (params, tensors, execution config), without computing
/// or writing anything.
template <class T, class TKV, class TM, class TO>
void validate(const IncreFlashAttentionParams& params,
              const IncreFlashAttentionInputs<T, TKV, TM>& in,
              const IncreFlashAttentionOutputs<TO>& out, const ExecConfig& exec = {}) {
  detail::ifa_call(params, in, out, exec, false);
}

/// CANN IncreFlashAttention: validate -> plan -> run (every check before the output is written).
template <class T, class TKV, class TM, class TO>
void incre_flash_attention(const IncreFlashAttentionParams& params,
                           const IncreFlashAttentionInputs<T, TKV, TM>& in,
                           const IncreFlashAttentionOutputs<TO>& out, const ExecConfig& exec = {}) {
  detail::ifa_call(params, in, out, exec, true);
}

}  // namespace attnref
