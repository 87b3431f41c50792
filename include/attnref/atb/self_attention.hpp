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
///   head_mask    ALIBI [batch or 1, headNum, maxSeq, maxSeq]; ALIBI_COMPRESS [1, headNum,
///                seqLen, 128] (then no tile, no slopes)
///   log_n        LOGN: float, [maxSeqLen] per query position (PA_ENCODER) or [batch] (DECODER)
///   out          [nTokens, headNum, headSizeV]
/// batchRunStatus (batch_run_status_enable): a sequence with status 0 gets zero output rows and
/// no cache write (docs/semantics.md §2.7, the choice of §10 item 4).
///
/// Per sequence b, head h, query i, key j (docs/semantics.md §2.2–2.3):
///   s = (q_i · qScale) · k_j  (fp32 accumulation)
///   s = s · logN[i] (LOGN) · qkScale
///   s = fp16(clamp(s, clampMin, clampMax))      (clampType MIN_MAX)
///   s = s + mask term                            (NORM / NORM_COMPRESS / SWA: binary mask ×
///                                                 −3e38 with HIGH_PRECISION or bf16, additive
///                                                 fp16 values with DEFAULT; ALiBi: additive in
///                                                 every dtype; CAUSAL_MASK, blocks a compressed
///                                                 mask skips and keys outside a window get
///                                                 probability 0)
///   out = softmax_j(s) · V                       (fp32), rounded to the data type
/// DEFAULT with fp16 data rounds s to fp16 after the product, after logN (a float32 factor),
/// after qkScale (rounded to fp16 first) and after the mask
/// addition, as the NPU's fp16 kernel does, so an fp16 overflow gives inf / NaN exactly where the
/// NPU does; HIGH_PRECISION (and bf16, always) keeps fp32. A fully masked row follows the −3e38
/// arithmetic: a uniform average of its values, as on the NPU.
///
/// This header holds the BSND overload; the int8 (qkv-quantized) and BNSD overloads are in
/// attnref/atb/self_attention_quant.hpp and self_attention_bnsd.hpp, included here; the hooks
/// and the shared plan are in attnref/atb/detail/.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/atb/detail/self_attention_plan.hpp"
#include "attnref/atb/self_attention_bnsd.hpp"
#include "attnref/atb/self_attention_io.hpp"
#include "attnref/atb/self_attention_params.hpp"
#include "attnref/atb/self_attention_quant.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

/// ATB SelfAttention, inputLayout BSND. Validates the params (co-existence table and
/// constraints) and every input before writing anything (caches included). T: half or bfloat16
/// (the NPU's data types) or float. num_threads: worker threads of the engine (0 = OpenMP's
/// default); results never depend on it.
template <class T>
void self_attention(const SelfAttentionParams& params, const SelfAttentionInputs<T>& in,
                    const SelfAttentionOutputs<T>& out, int num_threads = 0) {
  using P = SelfAttentionParams;
  detail::sa_check_type<T>();
  constexpr const char* fn = "self_attention";
  detail::check_views(fn, "query", in.query, "key", in.key, "value", in.value, "mask", in.mask,
                      "log_n", in.log_n, "head_mask", in.head_mask, "slopes", in.slopes,
                      "block_tables", in.block_tables, "out", out.out, "key_cache", out.key_cache,
                      "value_cache", out.value_cache);
  for (size_t i = 0; i < in.key_cache_list.size(); ++i)
    detail::check_view(fn, "key_cache_list[" + std::to_string(i) + "]", in.key_cache_list[i]);
  for (size_t i = 0; i < in.value_cache_list.size(); ++i)
    detail::check_view(fn, "value_cache_list[" + std::to_string(i) + "]", in.value_cache_list[i]);
  detail::check_out_overlaps(fn, "out", out.out, "query", in.query, "key", in.key, "value",
                             in.value, "mask", in.mask, "log_n", in.log_n, "head_mask",
                             in.head_mask, "slopes", in.slopes, "block_tables", in.block_tables,
                             "key_cache", out.key_cache, "value_cache", out.value_cache);
  const bool kv_list = !in.key_cache_list.empty() || !in.value_cache_list.empty();
  validate(params, kv_list);
  ATTNREF_CHECK(params.input_layout == P::InputLayout::BSND, std::invalid_argument, fn,
                "params.input_layout", "BNSD with the BSND inputs",
                "BSND (use SelfAttentionBnsdInputs for BNSD)", "BNSD");
  detail::sa_check_implemented(params);
  ATTNREF_CHECK(params.quant_type == P::QuantType::Unquant, std::invalid_argument, fn,
                "query/key/value", "not int8 with qkv full quantization",
                "int8 (SelfAttentionQuantInputs)", "floating-point data");
  const bool pa = params.calc_type == P::CalcType::PaEncoder;
  const bool prefix = params.calc_type == P::CalcType::PrefixEncoder;
  const bool bypass = params.kvcache_cfg == P::KvCacheCfg::KBypassVBypass;
  const bool mla = params.mla_v_head_size > 0;
  if (!(pa || prefix || bypass || kv_list)) {  // the new tokens are written into the caches
    for (const auto* c : {&out.key_cache, &out.value_cache})
      detail::check_out_overlaps(fn, c == &out.key_cache ? "key_cache" : "value_cache", *c, "query",
                                 in.query, "key", in.key, "value", in.value, "mask", in.mask,
                                 "log_n", in.log_n, "head_mask", in.head_mask, "slopes", in.slopes);
    ATTNREF_CHECK(!detail::overlaps(out.key_cache, out.value_cache), std::invalid_argument, fn,
                  "value_cache", "overlaps key_cache", "disjoint caches", "overlapping memory");
  }

  detail::SelfAttentionPlan<T> pl;
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
    ATTNREF_CHECK(!in.key.absent() && !in.value.absent(), std::invalid_argument, fn, "key/value",
                  "missing for PrefixEncoder", "the paged caches [numBlocks, blockSize, hidden]",
                  "none");
    ATTNREF_CHECK(in.key.size(2) == pl.nkv * pl.d, std::invalid_argument, fn, "key.shape[2]",
                  "mismatch (kvHeadNum * headSize)", pl.nkv * pl.d, in.key.size(2));
    ATTNREF_CHECK(in.value.size(0) == in.key.size(0) && in.value.size(1) == in.key.size(1) &&
                      in.value.size(2) == pl.nkv * pl.dv,
                  std::invalid_argument, fn, "value.shape", "mismatch",
                  "[" + std::to_string(in.key.size(0)) + ", " + std::to_string(in.key.size(1)) +
                      ", " + std::to_string(pl.nkv * pl.dv) + "]",
                  detail::shape_str(in.value));
    // ATB's PREFIX_ENCODER limits.
    for (Index hs : {pl.d, pl.dv})
      ATTNREF_CHECK(hs <= 128 && hs % 16 == 0, std::invalid_argument, fn, "head size",
                    "not supported by PrefixEncoder", "a multiple of 16, <= 128", hs);
    const Index block_elems =
        detail::checked_mul(fn, "key.shape[1] (blockSize) * headSize", in.key.size(1), pl.d);
    ATTNREF_CHECK(block_elems <= 128 * 128, std::invalid_argument, fn,
                  "key.shape[1] (blockSize) * headSize", "above PrefixEncoder's limit", "<= 16384",
                  block_elems);
    ATTNREF_CHECK(static_cast<Index>(in.kv_seq_len.size()) == pl.batch, std::invalid_argument, fn,
                  "kv_seq_len", "size mismatch", pl.batch, in.kv_seq_len.size());
    for (Index b = 0; b < pl.batch; ++b)
      ATTNREF_CHECK(in.kv_seq_len[static_cast<size_t>(b)] >= in.seq_len[static_cast<size_t>(b)],
                    std::invalid_argument, fn, "kv_seq_len[" + std::to_string(b) + "]",
                    "smaller than seq_len",
                    ">= " + std::to_string(in.seq_len[static_cast<size_t>(b)]),
                    in.kv_seq_len[static_cast<size_t>(b)]);
    ATTNREF_CHECK(!in.block_tables.absent(), std::invalid_argument, fn, "block_tables",
                  "missing for PrefixEncoder", "[batch, maxBlocks]", "none");
    // The paged caches under PrefixEncoder's names (the engine would name its own arguments).
    const PagedKvCache<const T> cache{detail::split_hidden(in.key, pl.nkv, pl.d),
                                      detail::split_hidden(in.value, pl.nkv, pl.dv),
                                      in.block_tables, in.kv_seq_len};
    cache.validate(fn, {"key", "value", "block_tables", "kv_seq_len", "key.shape[1] (blockSize)",
                        "blockSize"});
    e.read_kv(cache);
    pl.kv_len = in.kv_seq_len;
    extra.push_back(e.k);
    extra.push_back(e.v);
  } else if (kv_list) {
    ATTNREF_CHECK(static_cast<Index>(in.key_cache_list.size()) == pl.batch &&
                      static_cast<Index>(in.value_cache_list.size()) == pl.batch,
                  std::invalid_argument, fn, "key_cache_list/value_cache_list", "size mismatch",
                  pl.batch,
                  std::to_string(in.key_cache_list.size()) + " and " +
                      std::to_string(in.value_cache_list.size()));
    const auto& k0 = in.key_cache_list[0];
    const auto& v0 = in.value_cache_list[0];
    ATTNREF_CHECK(k0.size(1) == pl.nkv * pl.d, std::invalid_argument, fn,
                  "key_cache_list[0].shape[1]", "mismatch (kvHeadNum * headSize)", pl.nkv * pl.d,
                  k0.size(1));
    ATTNREF_CHECK(v0.size(0) == k0.size(0) && v0.size(1) == pl.nkv * pl.dv, std::invalid_argument,
                  fn, "value_cache_list[0].shape", "mismatch",
                  "[" + std::to_string(k0.size(0)) + ", " + std::to_string(pl.nkv * pl.dv) + "]",
                  detail::shape_str(v0));
    for (Index b = 0; b < pl.batch; ++b) {
      const auto& kb = in.key_cache_list[static_cast<size_t>(b)];
      const auto& vb = in.value_cache_list[static_cast<size_t>(b)];
      const std::string i = "[" + std::to_string(b) + "]";
      ATTNREF_CHECK(kb.shape() == k0.shape() && kb.strides() == k0.strides(), std::invalid_argument,
                    fn, "key_cache_list" + i, "shape or strides differ from entry 0",
                    detail::shape_str(k0), detail::shape_str(kb));
      ATTNREF_CHECK(vb.shape() == v0.shape() && vb.strides() == v0.strides(), std::invalid_argument,
                    fn, "value_cache_list" + i, "shape or strides differ from entry 0",
                    detail::shape_str(v0), detail::shape_str(vb));
      detail::check_view(fn, "key_cache_list" + i, kb);
      detail::check_view(fn, "value_cache_list" + i, vb);
      for (const auto* x : {&kb, &vb})
        extra.push_back(StridedView<const T, 4>(x->data(), {1, x->size(0), 1, x->size(1)},
                                                {0, x->stride(0), 0, x->stride(1)}));
      list_pages.k.push_back(kb.data());
      list_pages.v.push_back(vb.data());
      list_pages.first.push_back(b);
    }
    list_pages.page_size = std::max<Index>(1, k0.size(0));
    pl.kv_len = detail::sa_token_offsets(in.seq_len, in.token_offset, active, k0.size(0));
    // The engine sees entry 0's shape and strides for every sequence; its pages are the list.
    e.k = StridedView<const T, 4>(k0.data(), {pl.batch, k0.size(0), pl.nkv, pl.d},
                                  {0, k0.stride(0), pl.d * k0.stride(1), k0.stride(1)});
    e.v = StridedView<const T, 4>(v0.data(), {pl.batch, v0.size(0), pl.nkv, pl.dv},
                                  {0, v0.stride(0), pl.dv * v0.stride(1), v0.stride(1)});
    e.seq.kv = pl.kv_len;
    pl.pages = &list_pages;
  } else {
    const auto& kc = out.key_cache;
    const auto& vc = out.value_cache;
    const bool rolling = params.cache_type == P::CacheType::Swa;
    const Index window = params.window_size;
    ATTNREF_CHECK(!kc.absent() && !vc.absent(), std::invalid_argument, fn, "key_cache/value_cache",
                  "missing", "[layerNum, batch, maxSeqLen, hidden]", "none");
    ATTNREF_CHECK(kc.size(1) == pl.batch && kc.size(3) == pl.nkv * pl.d, std::invalid_argument, fn,
                  "key_cache.shape", "mismatch",
                  "[layerNum, " + std::to_string(pl.batch) + ", maxSeqLen, " +
                      std::to_string(pl.nkv * pl.d) + "]",
                  detail::shape_str(kc));
    ATTNREF_CHECK(vc.size(0) == kc.size(0) && vc.size(1) == pl.batch && vc.size(2) == kc.size(2) &&
                      vc.size(3) == pl.nkv * pl.dv,
                  std::invalid_argument, fn, "value_cache.shape", "mismatch",
                  "[" + std::to_string(kc.size(0)) + ", " + std::to_string(pl.batch) + ", " +
                      std::to_string(kc.size(2)) + ", " + std::to_string(pl.nkv * pl.dv) + "]",
                  detail::shape_str(vc));
    ATTNREF_CHECK(in.layer_id >= 0 && in.layer_id < kc.size(0), std::out_of_range, fn, "layer_id",
                  "out of range", "[0, " + std::to_string(kc.size(0)) + ")", in.layer_id);
    if (!rolling) {
      pl.kv_len = detail::sa_token_offsets(in.seq_len, in.token_offset, active, kc.size(2));
    } else {
      // Rolling SWA cache: min(window, tokenOffset) slots in use, tokenOffset itself unbounded.
      pl.kv_len = detail::sa_token_offsets(in.seq_len, in.token_offset, active,
                                           std::numeric_limits<Index>::max());
      for (Index b = 0; b < pl.batch; ++b) {
        const Index off = in.token_offset[static_cast<size_t>(b)];
        const std::string arg = "token_offset[" + std::to_string(b) + "]";
        ATTNREF_CHECK(std::min(window, off) <= kc.size(2), std::invalid_argument, fn,
                      "key_cache.shape[2]", "smaller than the rolling cache's slots in use",
                      ">= " + std::to_string(std::min(window, off)), kc.size(2));
        if (pl.decoder) {
          pl.kv_len[static_cast<size_t>(b)] = std::min(window, pl.kv_len[static_cast<size_t>(b)]);
        } else {
          // A prompt into a rolling cache: attention over the new tokens themselves.
          ATTNREF_CHECK(off == in.seq_len[static_cast<size_t>(b)] && !bypass, std::invalid_argument,
                        fn, arg, "not supported with cacheType SWA outside DECODER",
                        "== seq_len[" + std::to_string(b) + "] (a whole prompt), KCacheVCache",
                        off);
        }
      }
      pl.swa_rolling = pl.decoder;
    }
    e.k = detail::cache_layer(StridedView<const T, 4>(kc), in.layer_id, pl.nkv, pl.d);
    e.v = detail::cache_layer(StridedView<const T, 4>(vc), in.layer_id, pl.nkv, pl.dv);
    e.seq.kv = pl.kv_len;
    if (rolling && !pl.decoder) {
      e.k = detail::packed(in.key);
      e.v = detail::packed(in.value);
      e.seq.kv.clear();
      e.seq.kv_cu = cu;
    }
    extra.push_back(StridedView<const T, 4>(kc));
    extra.push_back(StridedView<const T, 4>(vc));
  }
  detail::sa_finish_lengths(pl);
  const std::array<Index, 3> out_shape{tokens, pl.nh, pl.dv};
  ATTNREF_CHECK(out.out.shape() == out_shape, std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str<3>(out_shape), detail::shape_str(out.out));
  pl.o = detail::packed(out.out);

  // Cache write: rows token_offset - seq_len + j of the layer, active sequences only (rolling
  // SWA cache: slot (token_offset - seq_len + j) % window, the last window tokens only).
  auto write_caches = [&] {
    if (pa || prefix || bypass || kv_list) return;
    const bool rolling = params.cache_type == P::CacheType::Swa;
    const Index window = params.window_size;
    for (Index b = 0; b < pl.batch; ++b) {
      if (!active[static_cast<size_t>(b)]) continue;
      const Index len = in.seq_len[static_cast<size_t>(b)];
      const Index first = in.token_offset[static_cast<size_t>(b)] - len;
      for (Index j = rolling ? std::max<Index>(0, len - window) : 0; j < len; ++j) {
        const Index t = cu[static_cast<size_t>(b)] + j;
        const Index row = rolling ? swa_cache_slot(first + j, window) : first + j;
        for (Index h = 0; h < pl.nkv; ++h) {
          for (Index x = 0; x < pl.d; ++x)
            out.key_cache(in.layer_id, b, row, h * pl.d + x) = in.key(t, h, x);
          for (Index x = 0; x < pl.dv; ++x)
            out.value_cache(in.layer_id, b, row, h * pl.dv + x) = in.value(t, h, x);
        }
      }
    }
  };
  detail::sa_run(params, pl, num_threads, extra, write_caches);
}

}  // namespace attnref
