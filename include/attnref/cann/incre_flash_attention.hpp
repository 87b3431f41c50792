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
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/attention.hpp"
#include "attnref/attention/paged_kv.hpp"
#include "attnref/cann/detail/common.hpp"
#include "attnref/cann/detail/ifa_kv.hpp"
#include "attnref/cann/incre_flash_attention_io.hpp"
#include "attnref/cann/prompt_flash_attention.hpp"
#include "attnref/core/dense.hpp"
#include "attnref/core/types.hpp"

namespace attnref {

namespace detail {

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
