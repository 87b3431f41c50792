#pragma once
/// attnref::prompt_flash_attention — CANN PromptFlashAttention (aclnnPromptFlashAttentionV3,
/// MindSpore ops.prompt_flash_attention) on the attention engine (docs/semantics.md §7).
///
/// Per batch b: S1_b = actual_seq_lengths[b] query rows, S2_b = actual_seq_lengths_kv[b] keys
/// (empty lists: the full extents; one value broadcasts; TND: cumulative). Key j is excluded
/// from row i's softmax by sparse_mode:
///   0  no mask: nothing; with a mask: outside the band -pre_tokens <= j - i <= next_tokens
///   1  nothing (the full mask alone; pre / next ignored)
///   2  j > i (top-left causal)
///   3  j > i + S2_b - S1_b (bottom-right causal)
///   4  outside the band -pre_tokens <= j - i - (S2_b - S1_b) <= next_tokens
/// Modes 0 and 1 read atten_mask[b or 0][i][j] (nonzero = masked); modes 2–4 take the fixed
/// 2048 x 2048 compressed mask, whose content attnref does not read (the mode is the pattern).
/// Score: s = q·k·scale_value + pse[b or 0][h][i][j] (pse_order AddThenScale: (q·k + pse)·scale).
/// inner_precise bit 1 set: masked keys are excluded too, and a row with no key left gives 0;
/// bit 1 clear: a masked key's score becomes -FLT_MAX (the NPU's select), so a row whose every
/// key is masked is the plain mean of V over them. Rows excluded entirely (band, causal), padded
/// rows i >= S1_b and batches with S2_b = 0 give 0. Softmax and P·V in fp32, the output rounded
/// to T. GQA: query head h reads kv head h / (N / KV_N).
/// int8 q / k / v (deq_scale1, quant_scale1, deq_scale2 per tensor): s = fp32(int32(q·k) ·
/// deq_scale1) · scale (+ pse, masks as above); keys in blocks of params.quant_block_size from
/// key 0 against the running row max m: P8 = sat(rint(exp(s - m) · quant_scale1)), O += deq_scale2
/// · (P8·V8) (exact), l = Σ exp(s - m) unrounded; out = O / l as fp16, or int8. int8 output (any
/// input type, quant_scale2 per tensor or per channel, quant_offset2 optional): out =
/// sat(rint(O · quant_scale2 + quant_offset2)), round half to even (docs/semantics.md §10 item 9);
/// padded rows stay 0, a row with no key left is the quantized 0.
/// Every check runs before the output is written; results never depend on exec.threads.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/attention.hpp"
#include "attnref/cann/detail/common.hpp"
#include "attnref/cann/detail/layouts.hpp"
#include "attnref/cann/prompt_flash_attention_io.hpp"
#include "attnref/core/dense.hpp"
#include "attnref/core/layout.hpp"
#include "attnref/core/types.hpp"

namespace attnref {

namespace detail {

/// Batch count and per-batch lengths of a PFA call (TND: from the cumulative lists); with left
/// padding (FusedInferAttentionScore), each batch's first query row / key (empty: 0).
struct PfaLengths {
  Index B = 0;
  std::vector<Index> q_len, kv_len, q_cu, kv_cu;
  std::vector<Index> q_start, kv_start;
  Index q_begin(Index b) const { return q_start.empty() ? 0 : q_start[static_cast<size_t>(b)]; }
};

template <class T, class TM, class TP>
PfaLengths pfa_lengths(const char* fn, const PromptFlashAttentionInputs<T, TM, TP>& in, bool tnd,
                       std::int64_t sm, Index batch, Index S1, Index S2) {
  PfaLengths l;
  l.B = batch;
  if (tnd) {
    const auto& ql = in.actual_seq_lengths;
    const auto& kl = in.actual_seq_lengths_kv;
    ATTNREF_CHECK(!ql.empty() && ql.size() == kl.size(), std::invalid_argument, fn,
                  "actual_seq_lengths(_kv)", "required and of equal length with TND",
                  "two cumulative lists of B values",
                  std::to_string(ql.size()) + " and " + std::to_string(kl.size()));
    l.B = static_cast<Index>(ql.size());
    l.q_cu.push_back(0);
    l.kv_cu.push_back(0);
    for (size_t b = 0; b < ql.size(); ++b) {
      const std::string i = "[" + std::to_string(b) + "]";
      ATTNREF_CHECK(ql[b] >= l.q_cu.back(), std::invalid_argument, fn, "actual_seq_lengths" + i,
                    "decreasing (TND lengths are cumulative)",
                    ">= " + std::to_string(l.q_cu.back()), std::to_string(ql[b]));
      ATTNREF_CHECK(kl[b] >= l.kv_cu.back(), std::invalid_argument, fn, "actual_seq_lengths_kv" + i,
                    "decreasing (TND lengths are cumulative)",
                    ">= " + std::to_string(l.kv_cu.back()), std::to_string(kl[b]));
      l.q_cu.push_back(static_cast<Index>(ql[b]));
      l.kv_cu.push_back(static_cast<Index>(kl[b]));
      l.q_len.push_back(l.q_cu.back() - l.q_cu[b]);
      l.kv_len.push_back(l.kv_cu.back() - l.kv_cu[b]);
    }
    ATTNREF_CHECK(l.q_cu.back() == S1, std::invalid_argument, fn, "actual_seq_lengths",
                  "last value differs from T1", std::to_string(S1), std::to_string(l.q_cu.back()));
    ATTNREF_CHECK(l.kv_cu.back() == S2, std::invalid_argument, fn, "actual_seq_lengths_kv",
                  "last value differs from T2", std::to_string(S2), std::to_string(l.kv_cu.back()));
    ATTNREF_CHECK(sm == 3 || sm == 4 || (sm == 0 && in.atten_mask.absent()), std::invalid_argument,
                  fn, "params.sparse_mode", "TND takes sparse_mode 0 without a mask, 3 or 4",
                  "0 (no mask), 3 or 4", std::to_string(sm));
    ATTNREF_CHECK(in.pse_shift.absent(), std::invalid_argument, fn, "pse_shift",
                  "not supported with TND", "none", shape_str(in.pse_shift));
  } else {
    l.q_len = detail::cann_lengths(fn, "actual_seq_lengths", in.actual_seq_lengths, l.B, S1);
    l.kv_len = detail::cann_lengths(fn, "actual_seq_lengths_kv", in.actual_seq_lengths_kv, l.B, S2);
  }
  return l;
}

/// The mask and the band of sparse_mode `sm` (0–4) as the variant's hooks, checked.
template <class TM, class TP>
void pfa_mask_band(const char* fn, const PromptFlashAttentionParams& params,
                   const StridedView<const TM>& m, Index B, Index S1, Index S2,
                   CannVariant<TM, TP>& var) {
  const std::int64_t sm = params.sparse_mode;
  ATTNREF_CHECK(sm == 0 || !m.absent(), std::invalid_argument, fn, "atten_mask",
                "required by sparse_mode " + std::to_string(sm), "a mask", "none");
  if (!m.absent()) {
    ATTNREF_CHECK(!m.absent() && m.rank() >= 2 && m.rank() <= 4, std::invalid_argument, fn,
                  "atten_mask.shape", "rank out of range", "rank 2–4", shape_str(m));
    const Index r = m.rank();
    const Index ms1 = m.size(r - 2), ms2 = m.size(r - 1);
    const Index mb = r >= 3 ? m.size(0) : 1;
    const Index mh = r == 4 ? m.size(1) : 1;
    if (sm >= 2) {
      ATTNREF_CHECK(ms1 == 2048 && ms2 == 2048 && mb == 1 && mh == 1, std::invalid_argument, fn,
                    "atten_mask.shape",
                    "sparse_mode " + std::to_string(sm) + " takes the 2048 x 2048 compressed mask",
                    "[2048, 2048], [1, 2048, 2048] or [1, 1, 2048, 2048]", shape_str(m));
    } else {
      ATTNREF_CHECK((mb == 1 || mb == B) && mh == 1 && ms1 >= S1 && ms2 >= S2,
                    std::invalid_argument, fn, "atten_mask.shape", "mismatch",
                    "[S1' >= " + std::to_string(S1) + ", S2' >= " + std::to_string(S2) +
                        "] with an optional batch (1 or " + std::to_string(B) +
                        ") and head (1) dimension",
                    shape_str(m));
      var.mask = StridedView<const TM, 3>(m.data(), {mb, ms1, ms2}, {ms1 * ms2, ms2, 1});
      var.mask_excludes = (params.inner_precise & 2) != 0;
    }
  }
  const Index kInf = Index(1) << 40;
  const Index pre = detail::pfa_clamp_tokens(params.pre_tokens);
  const Index next = detail::pfa_clamp_tokens(params.next_tokens);
  const bool uses_band = (sm == 0 && !m.absent()) || sm == 4;
  if (uses_band) {
    ATTNREF_CHECK(!(pre < 0 && next < 0), std::invalid_argument, fn,
                  "params.pre_tokens / next_tokens", "both negative", "at least one >= 0",
                  std::to_string(pre) + " / " + std::to_string(next));
    ATTNREF_CHECK(pre + next >= 0, std::invalid_argument, fn, "params.pre_tokens / next_tokens",
                  "an empty band (pre_tokens + next_tokens < 0)", ">= 0",
                  std::to_string(pre + next));
  }
  switch (sm) {
    case 0:
      var.band = !m.absent();
      var.pre = pre;
      var.next = next;
      break;
    case 2:
      var.band = true;
      var.pre = kInf;
      var.next = 0;
      break;
    case 3:
      var.band = true;
      var.bottom_right = true;
      var.pre = kInf;
      var.next = 0;
      break;
    case 4:
      var.band = true;
      var.bottom_right = true;
      var.pre = pre;
      var.next = next;
      break;
    default:
      break;
  }
}

/// TND with sparse_mode 4 (the vendor's tiling): value head size 64 or 128, and for every batch
/// with query rows and keys pre_tokens + q_len >= 0 and next_tokens + kv_len >= 0.
inline void pfa_tnd_band(const char* fn, const PromptFlashAttentionParams& params,
                         const PfaLengths& l, Index Dv) {
  ATTNREF_CHECK(Dv == 64 || Dv == 128, std::invalid_argument, fn, "value.shape",
                "head size not supported with TND and sparse_mode 4", "64 or 128",
                std::to_string(Dv));
  const Index pre = pfa_clamp_tokens(params.pre_tokens);
  const Index next = pfa_clamp_tokens(params.next_tokens);
  for (size_t b = 0; b < l.q_len.size(); ++b) {
    if (l.q_len[b] == 0 || l.kv_len[b] == 0) continue;
    ATTNREF_CHECK(pre + l.q_len[b] >= 0 && next + l.kv_len[b] >= 0, std::invalid_argument, fn,
                  "params.pre_tokens / next_tokens",
                  "leave batch " + std::to_string(b) + " no band (TND, sparse_mode 4)",
                  "pre_tokens >= -" + std::to_string(l.q_len[b]) + ", next_tokens >= -" +
                      std::to_string(l.kv_len[b]),
                  std::to_string(pre) + " / " + std::to_string(next));
  }
}

/// What PFA's checks found: the layout, heads and query dims (CannFront), the key / value /
/// output dims, the lengths of every batch.
struct PfaPlan : CannFront {
  std::array<Index, 4> kd{}, vd{}, od{};
  Index D = 0, Dv = 0, S1 = 0, S2 = 0;
  bool tnd = false;
  PfaLengths lens;
};

/// Views' dims and layout, the params, the lengths and the output shape.
template <class T, class TM, class TP, class TO>
PfaPlan pfa_plan(const char* fn, const PromptFlashAttentionParams& params,
                 const PromptFlashAttentionInputs<T, TM, TP>& in,
                 const PromptFlashAttentionOutputs<TO>& out) {
  using detail::shape_str;
  PfaPlan pl;
  static_cast<CannFront&>(pl) = cann_front(fn, params.input_layout, false, params.num_heads,
                                           params.num_key_value_heads, in.query);
  const Layout layout = pl.layout;
  const Index n = pl.n, kvn = pl.kvn;
  const auto& qd = pl.qd;
  const auto kd = pl.kd = pfa_dims(fn, "key", in.key, layout, kvn);
  // value: its own head size (BSH: H_v / KV_N).
  const auto vd = pl.vd = pfa_dims(fn, "value", in.value, layout, kvn);
  const Index D = pl.D = qd[3], Dv = pl.Dv = vd[3];
  ATTNREF_CHECK(kd[3] == D, std::invalid_argument, fn, "key.shape",
                "head size differs from the query's", std::to_string(D), shape_str(in.key));
  ATTNREF_CHECK(kd[0] == qd[0] && vd[0] == qd[0] && vd[1] == kd[1], std::invalid_argument, fn,
                "key / value .shape", "batch or sequence mismatch",
                "batch " + std::to_string(qd[0]) + ", equal S2",
                shape_str(in.key) + " and " + shape_str(in.value));
  const std::int64_t sm = params.sparse_mode;
  ATTNREF_CHECK(!(sm >= 5 && sm <= 8), std::invalid_argument, fn, "params.sparse_mode",
                "not supported by PromptFlashAttention (5–8 are prefix / varlen modes of other "
                "operators)",
                "0–4", std::to_string(sm));
  ATTNREF_CHECK(sm >= 0 && sm <= 4, std::invalid_argument, fn, "params.sparse_mode", "out of range",
                "0–4", std::to_string(sm));
  ATTNREF_CHECK(params.inner_precise >= 0 && params.inner_precise <= 3, std::invalid_argument, fn,
                "params.inner_precise", "out of range", "0–3",
                std::to_string(params.inner_precise));
  ATTNREF_CHECK(params.quant_block_size >= 1 && params.quant_block_size <= 1024,
                std::invalid_argument, fn, "params.quant_block_size", "out of range", "[1, 1024]",
                std::to_string(params.quant_block_size));
  ATTNREF_CHECK(std::isfinite(params.scale_value), std::invalid_argument, fn, "params.scale_value",
                "not finite", "a finite value", std::to_string(params.scale_value));
  const bool tnd = pl.tnd = layout == Layout::TND;

  // Lengths.
  const Index S1 = pl.S1 = qd[1], S2 = pl.S2 = kd[1];
  pl.lens = pfa_lengths(fn, in, tnd, sm, qd[0], S1, S2);
  if (tnd && sm == 4) pfa_tnd_band(fn, params, pl.lens, Dv);
  const std::array<Index, 4> od = pl.od = {qd[0], qd[1], n, Dv};
  const std::vector<Index> oshape = pfa_shape(layout, od);
  ATTNREF_CHECK(!out.attention_out.absent() && out.attention_out.shape() == oshape,
                std::invalid_argument, fn, "attention_out.shape", "mismatch", dims_str(oshape),
                shape_str(out.attention_out));

  return pl;
}

/// The mask and band, and pse_shift, checked and bound to the variant.
template <class T, class TM, class TP>
void pfa_bind(const char* fn, const PromptFlashAttentionParams& params,
              const PromptFlashAttentionInputs<T, TM, TP>& in, const PfaPlan& pl,
              CannVariant<TM, TP>& var) {
  using detail::shape_str;
  const Index B = pl.lens.B, S1 = pl.S1, S2 = pl.S2, n = pl.n;
  // Mask and band.
  pfa_mask_band(fn, params, in.atten_mask, B, S1, S2, var);
  // pseShift.
  const auto& ps = in.pse_shift;
  if (!ps.absent()) {
    ATTNREF_CHECK(!ps.absent() && ps.rank() == 4 && (ps.size(0) == 1 || ps.size(0) == B) &&
                      ps.size(1) == n && ps.size(2) >= S1 && ps.size(3) >= S2,
                  std::invalid_argument, fn, "pse_shift.shape", "mismatch",
                  "[1 or " + std::to_string(B) + ", " + std::to_string(n) +
                      ", >= " + std::to_string(S1) + ", >= " + std::to_string(S2) + "]",
                  shape_str(ps));
    var.pse = StridedView<const TP, 4>(ps.data(), {ps.size(0), ps.size(1), ps.size(2), ps.size(3)});
  }
  const bool ats = params.pse_order == PseOrder::AddThenScale;
  var.add_then_scale = ats && !ps.absent();
  var.scale = static_cast<float>(params.scale_value);
}

/// The variant of the int8 path (P quantized block by block) or the plain one.
template <class T, class TM, class TP>
using PfaVariant = std::conditional_t<std::is_same_v<T, std::int8_t>, CannQuantVariant<TM, TP>,
                                      CannVariant<TM, TP>>;

/// A validated PromptFlashAttention call, ready to run: the plan, the engine problem, its hooks
/// and its execution config (filled in place, never copied).
/// TKV: the engine's key / value type, T, or int8 with a floating T (FusedInferAttentionScore's
/// antiquant with Q_S > 1: kv_key / kv_value hold the int8 tensors, key / value only give the
/// plan its dims).
template <class T, class TM, class TP, class TO, class TKV = T>
struct PfaProblem {
  PfaProblem() = default;
  PfaProblem(const PfaProblem&) = delete;
  PfaProblem& operator=(const PfaProblem&) = delete;
  PfaPlan pl;
  PfaVariant<T, TM, TP> var{};
  AttentionInputs<T, TKV> e;
  AttentionParams ep;
  AttentionOutputs<TO> eo;
  ExecConfig ex;
  const char* fn = "prompt_flash_attention";  ///< the operator named in error messages
  /// Keys a caller puts in front of every sequence (FusedInferAttentionScore's shared prefix),
  /// and the pages and views the engine then reads instead of key / value (null: none).
  Index front_keys = 0;
  const KvPages<TKV>* kv_pages = nullptr;
  StridedView<const TKV, 4> kv_k{}, kv_v{};
  /// Split scores (FusedInferAttentionScore's query_rope / key_rope), engine views (none: absent).
  StridedView<const T, 4> q_rope{};
  StridedView<const TKV, 4> k_rope{};
  /// int8 key / value with a floating query (TKV int8), in the query's layout.
  StridedView<const TKV> kv_key{}, kv_value{};
  /// A paged cache the engine reads instead of key / value (FusedInferAttentionScore with
  /// block_table; key / value then only give the plan its dims), validated by the caller.
  const PagedKvCache<const TKV>* paged = nullptr;
  /// Left padding (FusedInferAttentionScore's query_padding_size / kv_padding_size, negative
  /// values already 0): batch b's rows / keys are the last len_b before the final `pad` of the
  /// view (pfa_left_padding); -1: none.
  Index q_pad = -1, kv_pad = -1;
};

/// Left padding: the windows [S - pad - len_b, S - pad) of every batch, checked to fit (the
/// vendor's documents call a window starting below 0 out of contract; attnref rejects it).
inline void pfa_left_padding(const char* fn, Index q_pad, Index kv_pad, PfaPlan& pl) {
  auto starts = [&](Index pad, Index S, const std::vector<Index>& len, const char* arg,
                    const char* len_arg, std::vector<Index>& out) {
    if (pad < 0) return;
    out.assign(len.size(), 0);
    for (size_t b = 0; b < len.size(); ++b) {
      ATTNREF_CHECK(pad <= S - len[b], std::invalid_argument, fn, arg,
                    "with " + std::string(len_arg) + "[" + std::to_string(b) +
                        "] = " + std::to_string(len[b]) + " starts the window before position 0",
                    "<= " + std::to_string(S - len[b]), std::to_string(pad));
      out[b] = S - pad - len[b];
    }
  };
  starts(q_pad, pl.S1, pl.lens.q_len, "query_padding_size", "actual_seq_lengths", pl.lens.q_start);
  starts(kv_pad, pl.S2, pl.lens.kv_len, "kv_padding_size", "actual_seq_lengths_kv",
         pl.lens.kv_start);
}

/// The quantization scales, then the engine problem, validated against the caller's tensors,
/// with the int8 path's P step or none.
template <class T, class TM, class TP, class TO, class TKV>
void pfa_engine_problem(const PromptFlashAttentionParams& params,
                        const PromptFlashAttentionInputs<T, TM, TP>& in,
                        const PromptFlashAttentionOutputs<TO>& out,
                        PfaProblem<T, TM, TP, TO, TKV>& pr) {
  using detail::shape_str;
  constexpr bool kInt8In = std::is_same_v<T, std::int8_t>;
  constexpr bool kInt8Out = std::is_same_v<TO, std::int8_t>;
  using L = Layout;
  const char* fn = pr.fn;
  const PfaPlan& pl = pr.pl;
  const Layout layout = pl.layout;
  const Index n = pl.n, Dv = pl.Dv;
  const auto &qd = pl.qd, &kd = pl.kd, &vd = pl.vd, &od = pl.od;
  const bool tnd = pl.tnd;
  // Quantization: the int8 path's three per-tensor scales, the int8 output's scale / offset.
  auto scalar = [&](const StridedView<const float>& t, const char* arg, bool want) {
    if (!want) {
      ATTNREF_CHECK(t.absent(), std::invalid_argument, fn, arg,
                    kInt8In ? "given for int8 output only"
                            : "given without int8 "
                              "query / key / value",
                    "none", shape_str(t));
      return 1.0f;
    }
    ATTNREF_CHECK(!t.absent() && t.numel() == 1, std::invalid_argument, fn, arg,
                  "per-tensor scale required", "[1]", shape_str(t));
    ATTNREF_CHECK(std::isfinite(t.data()[0]), std::invalid_argument, fn, arg, "not finite",
                  "a finite value", std::to_string(t.data()[0]));
    return t.data()[0];
  };
  const float deq1 = scalar(in.deq_scale1, "deq_scale1", kInt8In);
  const float qs1 = scalar(in.quant_scale1, "quant_scale1", kInt8In);
  const float deq2 = scalar(in.deq_scale2, "deq_scale2", kInt8In);
  auto& var = pr.var;
  cann_post_quant(fn, in.quant_scale2, in.quant_offset2, n, Dv, kInt8Out, var);

  // The engine problem.
  auto& e = pr.e;
  e.q = pfa_view(in.query.data(), layout, qd);
  if constexpr (std::is_same_v<TKV, T>) {
    e.k = pfa_view(in.key.data(), layout, kd);
    e.v = pfa_view(in.value.data(), layout, vd);
  } else {
    e.k = pfa_view(pr.kv_key.data(), layout, kd);
    e.v = pfa_view(pr.kv_value.data(), layout, vd);
  }
  e.q_rope = pr.q_rope;
  e.k_rope = pr.k_rope;
  if (tnd) {
    e.seq.q_cu = pl.lens.q_cu;
    e.seq.kv_cu = pl.lens.kv_cu;
  } else {
    e.seq.q = pl.lens.q_len;
    e.seq.kv = pl.lens.kv_len;
    e.seq.q_start = pl.lens.q_start;
    e.seq.kv_start = pl.lens.kv_start;
  }
  pr.ep.scale = var.add_then_scale || kInt8In ? 1.0 : params.scale_value;
  if (kInt8In) pr.ex.kv_tile = params.quant_block_size;  // P is quantized block by block
  const L out_layout = layout == L::BNSD_BSND ? L::BSND : layout;
  pr.eo.o = pfa_view(out.attention_out.data(), out_layout, od);
  if (pr.paged != nullptr) {  // a paged cache: per-batch kv lengths through its block table
    e.k = pr.paged->k;
    e.v = pr.paged->v;
    e.block_table = pr.paged->block_table;
    e.seq.kv = pr.paged->context_lens;
    e.seq.kv_cu.clear();
  }
  if (pr.kv_pages != nullptr) {  // the caller's pages (their memory is the caller's to check)
    e.k = pr.kv_k;
    e.v = pr.kv_v;
    (void)resolve(fn, e, pr.ep, pr.eo, pr.ex, /*kv_template=*/true);
  } else {
    validate(e, pr.ep, pr.eo, pr.ex);  // overlaps and data checks; nothing written yet
  }
  // (an int8 output: sat(rint(O·quant_scale2 + quant_offset2)) per channel (h, d), the hooks'
  // quantize_o)
  if constexpr (kInt8In) {
    var.int8_scores = true;
    var.deq1 = deq1;
    var.form = PQuantStep::Form::PromptFlash;
    var.scale1 = qs1;
    var.factor = deq2;
  }
}

/// Validate and plan into `pr` (dense arguments): every check of prompt_flash_attention, nothing
/// written; pfa_run runs it.
template <class T, class TM, class TP, class TO, class TKV>
void pfa_prepare(const PromptFlashAttentionParams& params,
                 const PromptFlashAttentionInputs<T, TM, TP>& in,
                 const PromptFlashAttentionOutputs<TO>& out, const ExecConfig& exec,
                 PfaProblem<T, TM, TP, TO, TKV>& pr) {
  constexpr bool kInt8In = std::is_same_v<T, std::int8_t>;
  constexpr bool kInt8Out = std::is_same_v<TO, std::int8_t>;
  static_assert(
      std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float> || kInt8In,
      "prompt_flash_attention data: half, bfloat16, float or int8");
  static_assert(kInt8Out || (kInt8In ? std::is_same_v<TO, half> : std::is_same_v<TO, T>),
                "prompt_flash_attention output: the input's type (half for int8 input) or int8");
  static_assert(std::is_same_v<TP, typename detail::pfa_pse<T>::type>,
                "prompt_flash_attention pse: the input's type (half for int8 input)");
  static_assert(std::is_same_v<TM, bool> || std::is_same_v<TM, std::int8_t> ||
                    std::is_same_v<TM, std::uint8_t>,
                "prompt_flash_attention mask: bool, int8 or uint8");
  const char* fn = pr.fn;
  detail::check_views(fn, "query", in.query, "key", in.key, "value", in.value, "pse_shift",
                      in.pse_shift, "atten_mask", in.atten_mask, "deq_scale1", in.deq_scale1,
                      "quant_scale1", in.quant_scale1, "deq_scale2", in.deq_scale2, "quant_scale2",
                      in.quant_scale2, "quant_offset2", in.quant_offset2, "attention_out",
                      out.attention_out);
  pr.ex = exec;
  pr.pl = pfa_plan(fn, params, in, out);
  pfa_left_padding(fn, pr.q_pad, pr.kv_pad, pr.pl);
  if (pr.front_keys > 0) {  // every sequence's keys, and what its mask / pse must cover
    pr.pl.S2 += pr.front_keys;
    for (Index& l : pr.pl.lens.kv_len) l += pr.front_keys;
  }
  auto& var = static_cast<CannVariant<TM, TP>&>(pr.var);
  pfa_bind(fn, params, in, pr.pl, var);
  if (!pr.pl.lens.q_start.empty()) var.q_shift = pr.pl.lens.q_start.data();
  if (!pr.pl.lens.kv_start.empty()) var.kv_shift = pr.pl.lens.kv_start.data();
  pfa_engine_problem(params, in, out, pr);
}

/// Padded query rows 0 (those outside [q_begin, q_begin + q_len)), then the engine.
template <class T, class TM, class TP, class TO, class TKV>
void pfa_run(const PfaProblem<T, TM, TP, TO, TKV>& pr) {
  const PfaPlan& pl = pr.pl;
  if (!pl.tnd)
    for (Index b = 0; b < pl.lens.B; ++b) {
      const Index q0 = pl.lens.q_begin(b), q1 = q0 + pl.lens.q_len[static_cast<size_t>(b)];
      for (Index i = 0; i < pl.S1; ++i) {
        if (i >= q0 && i < q1) continue;
        for (Index h = 0; h < pl.n; ++h)
          for (Index x = 0; x < pl.Dv; ++x) pr.eo.o(b, i, h, x) = TO(0.0f);
      }
    }
  if (pr.kv_pages != nullptr)
    attention_with_pages(pr.var, pr.e, pr.ep, pr.eo, *pr.kv_pages, pr.ex);
  else
    attention_with(pr.var, pr.e, pr.ep, pr.eo, pr.ex);
}

/// prompt_flash_attention (run) or its validation alone (!run), every view through a DenseArena.
template <class T, class TM, class TP, class TO>
void pfa_call(const PromptFlashAttentionParams& params,
              const PromptFlashAttentionInputs<T, TM, TP>& in,
              const PromptFlashAttentionOutputs<TO>& out, const ExecConfig& exec, bool run) {
  check_exec("prompt_flash_attention", exec);
  dense_call("prompt_flash_attention", in, out, run, [&](const auto& din, const auto& dout) {
    PfaProblem<T, TM, TP, TO> pr;
    pfa_prepare(params, din, dout, exec, pr);
    if (run) pfa_run(pr);
  });
}
}  // namespace detail

/// Every check of prompt_flash_attention() (params, tensors, execution config), without computing
/// or writing anything.
template <class T, class TM, class TP, class TO>
void validate(const PromptFlashAttentionParams& params,
              const PromptFlashAttentionInputs<T, TM, TP>& in,
              const PromptFlashAttentionOutputs<TO>& out, const ExecConfig& exec = {}) {
  detail::pfa_call(params, in, out, exec, false);
}

template <class T, class TM, class TP, class TO>
void prompt_flash_attention(const PromptFlashAttentionParams& params,
                            const PromptFlashAttentionInputs<T, TM, TP>& in,
                            const PromptFlashAttentionOutputs<TO>& out,
                            const ExecConfig& exec = {}) {
  detail::pfa_call(params, in, out, exec, true);
}

}  // namespace attnref
