#pragma once
/// attnref::paged_attention — ATB PagedAttentionOperation (decode over a paged KV cache) on the
/// attention engine (docs/semantics.md §3).
///
/// Implemented: calcType UNDEFINED (one query token per sequence) and SPEC (parallel decoding:
/// q_seq_lens[b] query tokens per sequence, the last q_seq_lens[b] positions of its context),
/// GQA, qkScale, qScale (0 or 1: no effect; otherwise q · qScale rounded to the data type),
/// maskType UNDEFINED, NORM (rows [batch or 1, 1, maxSeq], ATB's [1, maxSeq] as [1, 1, maxSeq];
/// or the square [1, maxSeq, maxSeq], ATB's [maxSeq, maxSeq], whose row context - q_len + i
/// serves query i), SPEC ([numTokens, maxSeq], one row per query token) and ALIBI ([batch,
/// headNum, 1, maxSeq] or ATB's [headNum, 1, maxSeq] as [1, headNum, 1, maxSeq]), all additive;
/// scaleType LOGN (one float per sequence), mlaVHeadSize (V = the first mlaVHeadSize elements of
/// each K head; no value cache), batchRunStatus, and the quantized modes:
///   DEQUANT_FUSION (int8 caches): K = (K8 + k_offset[c]) · k_descale[c] per channel
///     c = kvHead · headSize + d (offset with hasQuantOffset), V likewise; then as unquantized.
///     Computed exactly in that algebra with the scale folded into q and the V affine applied
///     to the output (O = (Σ p·V8 / l + v_offset) · v_descale), fp32 throughout.
///   QKV_OFFLINE / QKV_ONLINE (int8 q and caches, fp16 / bf16 out): s = fp32(int32(q8·k8) ·
///     k_descale[h]) · qkScale + mask; blocks of params.quant_block_size keys from key 0 with the
///     running max m: P̂ = exp(s - m); online P8 = rint(fp16(P̂ / (bmax / 127))) with bmax the
///     block's largest P̂ and factor v_descale[h] · bmax / 127; offline P8 = rint(fp16(P̂ ·
///     p_scale[h])) (PagedAttention multiplies; SelfAttention divides) and factor v_descale[h]
///     (which must therefore fold 1 / p_scale, as in the golden); O = Σ factor · (P8·V8), l = Σ P̂
///     (unrounded), out = O / l. No split-KV (the NPU's kv split, a tiling choice, would restart
///     the blocks and the running max per split).
/// Validated and rejected: MASK_FREE and NORM_COMPRESS (Atlas 300I Duo only), compressType
/// (razor attention) and BNSD (not implemented), and ATB's incompatible combinations (SPEC with
/// batchRunStatus or DEQUANT_FUSION or, without MLA, masks other than NORM / SPEC; MLA with
/// ALIBI, DEQUANT_FUSION or, under SPEC, NORM or quantization; qkv quantization with offsets).
///
/// Shapes (BSND):
///   query          [numTokens, headNum, headSize]    numTokens = batch, or Σ q_seq_lens (SPEC)
///   key_cache      [numBlocks, blockSize, kvHeadNum, headSize]
///   value_cache    [numBlocks, blockSize, kvHeadNum, headSizeV]   (absent with MLA)
///   block_tables   [batch, maxBlocksPerSeq] int32: key t of sequence b is row t % blockSize of
///                  block block_tables[b][t / blockSize]; entries past the used blocks never read
///   context_lens   [batch]
///   out            [numTokens, headNum, headSizeV]
///
/// Per query token (sequence b), head h (kv head h / G), key t < context_lens[b], in fp32:
///   s_t = q · k_t · qkScale (· logN[b]) + mask + alibi[b][h][t];  p = softmax(s)
///   out = Σ_t p_t v_t rounded to the output type
/// The scores and P stay fp32 (the golden's fp32 reference; its P cast to the data type before
/// P·V is what the NPU's rounding does, not the definition — docs/semantics.md §1). A sequence with
/// context length 0 or batchRunStatus 0 gets zero output rows. Masks are additive (ATB's
/// -10000 / -inf entries): a row whose keys are all masked is an ordinary softmax over them.

#include <cstdint>
#include <type_traits>

#include "attnref/atb/detail/paged_attention_bind.hpp"
#include "attnref/atb/detail/paged_attention_plan.hpp"
#include "attnref/atb/detail/paged_attention_variant.hpp"
#include "attnref/atb/paged_attention_io.hpp"
#include "attnref/atb/paged_attention_params.hpp"
#include "attnref/attention/attention.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

namespace detail {

/// A validated PagedAttention call, ready to run: the plan, the engine problem (the packed query
/// tokens against the paged cache), its hooks and its execution config. The hooks point into the
/// plan: a problem is filled in place and never copied.
template <class TQ, class TKV, class TM, class TO>
struct PaProblem {
  PaProblem() = default;
  PaProblem(const PaProblem&) = delete;
  PaProblem& operator=(const PaProblem&) = delete;
  PaPlan<TKV> pl;
  AttentionInputs<TQ, TKV> e;
  AttentionParams ep;
  AttentionOutputs<TO> eo;
  ExecConfig ex;
  PaVariant<TQ, TM> var{};
};

/// The engine problem, validated against the caller's tensors, with the shared query / output
/// hooks (detail/hooks/io.hpp): qScale, and for DequantFusion k_descale folded into q, k_offset
/// into a row constant and V's affine map applied to each output row (rows of sequences without
/// keys: 0).
template <class TQ, class TKV, class TM, class TO>
void pa_engine_problem(const PagedAttentionParams& params,
                       const PagedAttentionInputs<TQ, TKV, TM>& in,
                       const PagedAttentionOutputs<TO>& out, const PaPlan<TKV>& pl,
                       PaProblem<TQ, TKV, TM, TO>& pr) {
  constexpr bool kQkv = std::is_same_v<TQ, std::int8_t>;
  constexpr bool kDequant = !kQkv && std::is_same_v<TKV, std::int8_t>;
  const Index tokens = pl.tokens, nh = pl.nh, d = pl.d, dv = pl.dv;
  auto& e = pr.e;
  e.q = StridedView<const TQ, 4>(in.query.data(), {1, tokens, nh, d},
                                 {0, in.query.stride(0), in.query.stride(1), in.query.stride(2)});
  e.read_kv(pl.cache);
  e.seq.q_cu = pl.q_cu;
  pr.ep.scale = kQkv ? 1.0f : params.qk_scale;
  if (kQkv) pr.ex.kv_tile = params.quant_block_size;  // P is quantized block by block
  pr.eo.o = StridedView<TO, 4>(out.out.data(), {1, tokens, nh, dv},
                               {0, out.out.stride(0), out.out.stride(1), out.out.stride(2)});
  validate(e, pr.ep, pr.eo, pr.ex);  // engine checks, overlaps included

  auto& var = pr.var;
  if (!kQkv && params.q_scale != 0.0f && params.q_scale != 1.0f)
    var.template scale_query<TQ>(params.q_scale);
  if constexpr (kDequant) {
    var.group = nh / pl.nkv;
    var.bias_scale = params.qk_scale;
    var.zero_empty = true;
    for (Index c = 0; c < in.k_descale.size(0); ++c) var.k_scale.push_back(in.k_descale(c));
    for (Index c = 0; c < in.v_descale.size(0); ++c) var.v_scale.push_back(in.v_descale(c));
    if (params.has_quant_offset) {
      for (Index c = 0; c < in.k_offset.size(0); ++c) var.k_offset.push_back(in.k_offset(c));
      for (Index c = 0; c < in.v_offset.size(0); ++c)
        var.v_offset.push_back(static_cast<float>(in.v_offset(c)));
    }
  }
}

/// Validate and plan into `pr`: every check of paged_attention (params, tensors, execution
/// config), nothing written; pa_run runs it.
template <class TQ, class TKV, class TM, class TO>
void pa_prepare(const PagedAttentionParams& params, const PagedAttentionInputs<TQ, TKV, TM>& in,
                const PagedAttentionOutputs<TO>& out, const ExecConfig& exec,
                PaProblem<TQ, TKV, TM, TO>& pr) {
  constexpr bool kQkv = std::is_same_v<TQ, std::int8_t>;
  constexpr bool kDequant = !kQkv && std::is_same_v<TKV, std::int8_t>;
  static_assert(kQkv ? std::is_same_v<TKV, std::int8_t> &&
                           (std::is_same_v<TO, half> || std::is_same_v<TO, bfloat16>)&&(
                               std::is_same_v<TM, half> || std::is_same_v<TM, bfloat16>)
                     : pa_float_v<TQ> && std::is_same_v<TM, TQ> && std::is_same_v<TO, TQ> &&
                           (kDequant || std::is_same_v<TKV, TQ>),
                "paged_attention types: TQ = TKV = TM = TO (half, bfloat16, float); int8 caches "
                "(dequant fusion); or int8 q and caches with half / bfloat16 out and mask");
  check_exec("paged_attention", exec);
  pa_check_modes<TQ, TKV, TO>(params);
  pr.pl = pa_plan(params, in, out);
  pr.ex = exec;
  pa_bind_masks(params, in, pr.pl, pr.var);
  pa_bind_scales(params, in, pr.pl, pr.var);
  pa_engine_problem(params, in, out, pr.pl, pr);
}

template <class TQ, class TKV, class TM, class TO>
void pa_run(const PaProblem<TQ, TKV, TM, TO>& pr) {
  attention_with(pr.var, pr.e, pr.ep, pr.eo, pr.ex);
}

}  // namespace detail

/// Every check of paged_attention() (params, tensors, execution config), without computing or
/// writing anything.
template <class TQ, class TKV, class TM, class TO>
void validate(const PagedAttentionParams& params, const PagedAttentionInputs<TQ, TKV, TM>& in,
              const PagedAttentionOutputs<TO>& out, const ExecConfig& exec = {}) {
  detail::PaProblem<TQ, TKV, TM, TO> pr;
  detail::pa_prepare(params, in, out, exec, pr);
}

/// ATB PagedAttention. Three type families (checked against params.quant_type):
///   unquantized       TQ = TKV = TM = TO: half, bfloat16 or float
///   DEQUANT_FUSION    TQ = TM = TO: half, bfloat16 or float; TKV = int8
///   QKV_OFFLINE/ONLINE TQ = TKV = int8; TO = half or bfloat16 (params.out_data_type); TM: half
///                     or bfloat16
/// validate -> plan -> run: every check runs before `out` is written (validate() runs them
/// alone); results never depend on exec.threads.
template <class TQ, class TKV, class TM, class TO>
void paged_attention(const PagedAttentionParams& params,
                     const PagedAttentionInputs<TQ, TKV, TM>& in,
                     const PagedAttentionOutputs<TO>& out, const ExecConfig& exec = {}) {
  detail::PaProblem<TQ, TKV, TM, TO> pr;
  detail::pa_prepare(params, in, out, exec, pr);
  detail::pa_run(pr);
}

}  // namespace attnref
