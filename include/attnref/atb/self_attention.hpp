#pragma once
/// attnref::self_attention — ATB SelfAttentionOperation on the attention engine.
///
/// Implemented: calcType PA_ENCODER (packed tokens, no cache; MLA merged kv cache),
/// ENCODER / DECODER / UNDEFINED (KV caches, written then read; kv-bypass; batchRunStatus; kv
/// tensorlist), PREFIX_ENCODER (paged KV cache with block tables, causal aligned bottom-right),
/// inputLayout BSND and BNSD (second overload), every maskType (NORM, NORM_COMPRESS, ALIBI and
/// the compressed ALiBi forms, SLIDING_WINDOW_NORM / _COMPRESS with the decoder's window and the
/// rolling SWA cache, CAUSAL_MASK), qScale, qkScale, logN (scaleType LOGN), clamp, GQA,
/// kernelType DEFAULT (fp16 score path) and HIGH_PRECISION, qkv full quantization (int8 q/k/v,
/// quantType QKV_OFFLINE / QKV_ONLINE: the SelfAttentionQuantInputs overload). ALiBi with the
/// BNSD inputs is validated (attnref::validate(SelfAttentionParams)) and then rejected as not
/// implemented yet.
///
/// Shapes (BSND; ATB's [nTokens, hidden] and [B, S, N, D] forms are the same memory):
///   query        [nTokens, headNum, headSize]   tokens of all sequences packed by seq_len
///   key, value   [nTokens, kvHeadNum, headSize(V)] the new tokens (absent with kv-bypass; the
///                MLA merged cache has no value: V = the first mlaVHeadSize elements of K);
///                PREFIX_ENCODER: the paged caches [numBlocks, blockSize, kvHeadNum * headSize(V)]
///   key_cache,   [layerNum, batch, maxSeqLen, kvHeadNum * headSize(V)] (ENCODER / DECODER /
///   value_cache   UNDEFINED): the new tokens of sequence b go to rows
///                 token_offset[b] - seq_len[b] + j of layer layer_id, then attention runs over
///                 rows [0, token_offset[b]); with kv-bypass nothing is written
///   key_cache_list, value_cache_list  kv tensorlist (DECODER + kv-bypass): one [maxSeqLen,
///                 kvHeadNum * headSize(V)] tensor per sequence, used instead of the caches
///                 (they hold the layer being run: layer_id is not used)
///   block_tables [batch, maxBlocks], kv_seq_len [batch]  PREFIX_ENCODER: key t of sequence b is
///                row t % blockSize of block block_tables[b][t / blockSize], t < kv_seq_len[b]
///   mask         NORM: [maxSeq, maxSeq] (as [1, maxSeq, maxSeq]), [batch, maxSeq, maxSeq], or
///                decoder [batch, 1, maxSeq]; sliced top-left (rows = query positions, columns =
///                key positions of the sequence); SLIDING_WINDOW_NORM the same (none with
///                DECODER). NORM_COMPRESS: the [128, 128] tile (as [1, 128, 128]), expanded as
///                in attnref/mask/norm_compress.hpp; ALIBI_COMPRESS*: the [256, 256] tile with
///                `slopes` (attnref/mask/alibi.hpp); SLIDING_WINDOW_COMPRESS: the [512, 512]
///                pattern (attnref/mask/sliding_window.hpp)
///   head_mask    ALIBI [batch or 1, headNum, maxSeq, maxSeq]; ALIBI_COMPRESS(_SQRT) [1,
///                headNum, seqLen, 128] (then no tile; slopes ignored)
///   log_n        LOGN: float, [maxSeqLen] per query position (PA_ENCODER) or [batch] (DECODER)
///   out          [nTokens, headNum, headSizeV]
/// batchRunStatus (batch_run_status_enable): a sequence with status 0 gets zero output rows and
/// no cache write, and its token offset may be 0 (below its seq_len: a dynamic batch's inactive
/// sequence) (docs/semantics.md §2.7, the choice of §10 item 4).
///
/// Per sequence b, head h, query i, key j (docs/semantics.md §2.2–2.3):
///   s = (q_i · qScale) · k_j  (fp32 accumulation)
///   s = s · logN[i] (LOGN) · qkScale
///   s = fp16(clamp(s, clampMin, clampMax))      (clampType MIN_MAX)
///   s = s + mask term                            (NORM / NORM_COMPRESS / SWA: binary (0 / 1)
///                                                 × −3e38 or additive, as the kernel the params
///                                                 select takes it: atb/mask_encoding.hpp; ALiBi:
///                                                 additive in every dtype; CAUSAL_MASK, blocks a
///                                                 compressed mask skips and keys outside a
///                                                 window get probability 0)
///   out = softmax_j(s) · V                       (fp32), rounded to the data type
/// The fp16 kernel (fp16 data with DEFAULT, or with batchRunStatus; not DECODER or
/// PREFIX_ENCODER) rounds s to fp16 after the product, after logN (a float32 factor), after
/// qkScale (rounded to fp16 first) and after the mask addition, as the NPU does, so an fp16
/// overflow gives inf / NaN exactly where the NPU does; every other kernel keeps fp32. Mask values
/// outside their encoding are rejected before anything is written. A fully masked row follows the
/// −3e38 arithmetic: a uniform average of its values, as on the NPU.
///
/// This header holds the BSND overload; the int8 (qkv-quantized) and BNSD overloads are in
/// attnref/atb/self_attention_quant.hpp and self_attention_bnsd.hpp, included here; the hooks
/// and the shared plan are in attnref/atb/detail/.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/atb/detail/self_attention_kv.hpp"
#include "attnref/atb/detail/self_attention_plan.hpp"
#include "attnref/atb/self_attention_bnsd.hpp"
#include "attnref/atb/self_attention_io.hpp"
#include "attnref/atb/self_attention_params.hpp"
#include "attnref/atb/self_attention_quant.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

namespace detail {
/// self_attention, inputLayout BSND (run) or its validation alone (!run).
template <class T>
void sa_call(const SelfAttentionParams& params, const SelfAttentionInputs<T>& in,
             const SelfAttentionOutputs<T>& out, const ExecConfig& exec, bool run) {
  detail::check_exec("self_attention", exec);
  using P = SelfAttentionParams;
  detail::sa_check_type<T>();
  constexpr const char* fn = "self_attention";
  const bool kv_list = detail::sa_check_bsnd(params, in, out);
  const bool pa = params.calc_type == P::CalcType::PaEncoder;
  const bool prefix = params.calc_type == P::CalcType::PrefixEncoder;
  const bool bypass = params.kvcache_cfg == P::KvCacheCfg::KBypassVBypass;
  const bool mla = params.mla_v_head_size > 0;

  detail::SelfAttentionPlan<T> pl;
  pl.run = run;
  pl.decoder = params.calc_type == P::CalcType::Decoder;
  pl.bottom_right = prefix;
  pl.log_n = &in.log_n;
  const std::vector<bool> active =
      detail::sa_sequences(params, in.seq_len, in.batch_run_status, -1, "");
  const std::vector<Index> cu = detail::sa_bsnd_front(pl, params, in, out);
  const Index tokens = in.query.size(0);
  ATTNREF_CHECK(pl.d <= 576 && pl.dv <= 576, std::invalid_argument, fn, "head size",
                "above ATB's limit", "<= 576", std::max(pl.d, pl.dv));
  std::vector<StridedView<const T, 4>> extra{detail::packed(in.query)};

  // K/V: new tokens (PA_ENCODER), paged caches (PREFIX_ENCODER), per-sequence tensors (kv
  // tensorlist) or one layer of the caches.
  const bool new_tokens = pa || (!bypass && !prefix);
  if (new_tokens) {
    const std::array<Index, 3> ks{tokens, pl.nkv, pl.d};
    ATTNREF_CHECK(in.key.shape() == ks, std::invalid_argument, fn, "key.shape", "mismatch",
                  detail::shape_str<3>(ks), detail::shape_str(in.key));
    detail::check_view(fn, "key", in.key);
    extra.push_back(detail::packed(in.key));
    if (!mla) {
      const std::array<Index, 3> vs{tokens, pl.nkv, pl.dv};
      ATTNREF_CHECK(in.value.shape() == vs, std::invalid_argument, fn, "value.shape", "mismatch",
                    detail::shape_str<3>(vs), detail::shape_str(in.value));
      detail::check_view(fn, "value", in.value);
      extra.push_back(detail::packed(in.value));
    }
  }
  detail::KvPages<T> list_pages;
  AttentionInputs<T>& e = pl.ein;
  e.q = detail::packed(in.query);
  e.seq.q_cu = cu;
  if (pa) {
    e.k = detail::packed(in.key);
    e.v = mla ? StridedView<const T, 4>(in.key.data(), {1, tokens, pl.nkv, pl.dv},
                                        {0, in.key.stride(0), in.key.stride(1), in.key.stride(2)})
              : detail::packed(in.value);
    e.seq.kv_cu = cu;
    pl.kv_len = in.seq_len;
  } else if (prefix) {
    detail::sa_kv_prefix(in, pl, extra);
  } else if (kv_list) {
    detail::sa_kv_list(in, pl, extra, list_pages, active);
  } else {
    detail::sa_kv_cache(params, in, out, pl, extra, active, cu);
  }
  detail::sa_finish_lengths(pl);
  const std::array<Index, 3> out_shape{tokens, pl.nh, pl.dv};
  ATTNREF_CHECK(out.out.shape() == out_shape, std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str<3>(out_shape), detail::shape_str(out.out));
  pl.o = detail::packed(out.out);

  auto write_caches = [&] {
    if (!(pa || prefix || bypass || kv_list))
      detail::sa_write_caches(params, in, out, pl, active, cu);
  };
  detail::sa_run(params, pl, exec, extra, write_caches);
}
}  // namespace detail

/// Every check of self_attention() with the BSND inputs (params, tensors, execution config),
/// without computing or writing anything (caches included).
template <class T>
void validate(const SelfAttentionParams& params, const SelfAttentionInputs<T>& in,
              const SelfAttentionOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::sa_call(params, in, out, exec, false);
}

/// ATB SelfAttention, inputLayout BSND, as validate -> plan -> run: the params (co-existence
/// table and constraints) and every input are checked before anything is written (caches
/// included). T: half or bfloat16 (the NPU's data types) or float. exec: threads and tiling
/// (core/exec.hpp); results never depend on exec.threads.
template <class T>
void self_attention(const SelfAttentionParams& params, const SelfAttentionInputs<T>& in,
                    const SelfAttentionOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::sa_call(params, in, out, exec, true);
}

}  // namespace attnref
