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
/// headNum, 1, maxSeq] or ATB's [headNum, 1, maxSeq] as [1, headNum, 1, maxSeq]), additive
/// but for the bf16 / float SPEC mask of the MLA multi-token kernel (binary x -3e38);
/// scaleType LOGN (one float per sequence), mlaVHeadSize (V = the first mlaVHeadSize elements of
/// each K head; no value cache), batchRunStatus (see the packing below), the quantized modes:
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
///   inputLayout BNSD: only the caches change, key_cache [numBlocks, kvHeadNum, blockSize,
///     headSize] and value_cache [numBlocks, kvHeadNum, blockSize, headSize] (headSizeV must
///     equal headSize); read in place through permuted strides. Masks NORM / ALIBI and
///     batchRunStatus as in BSND; not with SPEC (calcType or mask), compressType, quantization,
///     LOGN or MLA.
///   compressType KVHEAD / KVHEAD_ROPE (razor attention): every (query token t, kv head g) pair
///     b = t · kvHeadNum + g is a sequence of its own, with its own context length and block
///     table row, over caches with one kv head ([numBlocks, blockSize, 1, headSize(V)]); it
///     serves the query heads g·G .. g·G + G - 1 (G = headNum / kvHeadNum): the query and out
///     are read as [numTokens · kvHeadNum, G, ·] in place (stride(0) = headNum · stride(1)
///     unless numTokens or kvHeadNum is 1; otherwise rejected). KVHEAD takes NORM
///     [numTokens or 1, 1, maxSeq] (row = token) and ALIBI [numTokens or 1, headNum, 1, maxSeq]
///     (real head g·G + i), DEQUANT_FUSION (scales of the pair's kv head g) and batchRunStatus.
///     KVHEAD_ROPE adds razor_offset [numBlocks, blockSize]: s_j = qkScale · (q·k_j +
///     razor_offset[block of key j][j % blockSize]); no mask, no batchRunStatus. Neither with
///     SPEC, qkv quantization, LOGN, BNSD or MLA; kvHeadNum must be set.
/// Validated and rejected: MASK_FREE and NORM_COMPRESS (Atlas 300I Duo only), and ATB's
/// incompatible combinations (SPEC with batchRunStatus or DEQUANT_FUSION or, without MLA, masks
/// other than NORM / SPEC; MLA with ALIBI, DEQUANT_FUSION or, under SPEC, NORM or quantization;
/// qkv quantization with offsets; the BNSD and compressType rules above).
///
/// Packing of the query rows (ATB's kernel, paged_attention_tiling_dependency.cpp): a sequence
/// whose context length is 0 takes NO query row and writes NO output row; query and out hold the
/// rows of the sequences with context > 0, in order. numTokens must equal their count (SPEC:
/// the sum of their q_seq_lens; a zero-context sequence contributes 0 rows whatever its
/// q_seq_lens entry says, and q_seq_lens[b] <= context_lens[b] applies to the others).
/// batchRunStatus is read by no PagedAttention kernel: it is checked (0 or 1, one per
/// sequence), and a sequence with status 0 must have context length 0 (else rejected: the NPU
/// would compute it). With compressType the (token, kv head) pairs follow the same rule, while
/// the shapes stay [numTokens · kvHeadNum] pairs: a pair of length 0 drops its G rows, every
/// later pair reads and writes the rows one pair earlier, and the last rows of out are left
/// untouched (ATB's hazard, reproduced: give every pair a nonzero length).
///
/// Shapes (BSND):
///   query          [numTokens, headNum, headSize]    numTokens: see the packing above
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
/// P·V is what the NPU's rounding does, not the definition — docs/semantics.md §1). Masks are
/// additive (ATB's -10000 / -inf entries; a row whose keys are all masked is an ordinary softmax
/// over them), except the SPEC mask of the MLA multi-token kernel (mla_v_head_size > 0 with
/// calcType SPEC) in bf16 / float: 0 / 1, multiplied by -3e38 (atb/mask_encoding.hpp). Values
/// outside the encoding (a positive additive value, a binary value other than 0 / 1, a NaN or
/// +inf ALiBi bias) are rejected.

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
  const Index rows = pl.rows, heads = pl.heads, d = pl.d, dv = pl.dv;
  const bool rope = !pr.var.razor.absent();  // the variant applies qkScale after the offset
  auto& e = pr.e;
  // The packed rows: query tokens, or with compressType the (token, kv head) pairs, each of
  // `heads` query heads (the query reshaped in place, pa_row_stride).
  e.q = StridedView<const TQ, 4>(in.query.data(), {1, rows, heads, d},
                                 {0, pl.q_row_stride, in.query.stride(1), in.query.stride(2)});
  e.read_kv(pl.cache);
  e.seq.q_cu = pl.q_cu;
  pr.ep.scale = kQkv || rope ? 1.0f : params.qk_scale;
  if (kQkv) pr.ex.kv_tile = params.quant_block_size;  // P is quantized block by block
  pr.eo.o = StridedView<TO, 4>(out.out.data(), {1, rows, heads, dv},
                               {0, pl.o_row_stride, out.out.stride(1), out.out.stride(2)});
  validate(e, pr.ep, pr.eo, pr.ex);  // engine checks, overlaps included

  auto& var = pr.var;
  if (!kQkv && params.q_scale != 0.0f && params.q_scale != 1.0f)
    var.template scale_query<TQ>(params.q_scale);
  if constexpr (kDequant) {
    var.group = pl.nh / pl.nkv;
    var.batch_heads = pl.compress;  // compressType: the pair's kv head, b % kvHeadNum
    var.bias_scale = static_cast<float>(pr.ep.scale);
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
  pa_bind_compress(params, in, pr.pl, pr.var);
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
