#pragma once
/// The BSND SelfAttention's pieces around its plan: the checks of every view before anything
/// is written, the K/V sources the engine reads (PREFIX_ENCODER's paged caches, the kv tensor
/// list, one layer of the caches) and the cache write. Not part of the API.

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/atb/detail/self_attention_plan.hpp"
#include "attnref/atb/self_attention_io.hpp"
#include "attnref/atb/self_attention_params.hpp"
#include "attnref/attention/paged_kv.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"
#include "attnref/mask/sliding_window.hpp"

namespace attnref::detail {

/// Every view, the output against every input, the params (co-existence table included) and,
/// when the new tokens are written into the caches, the caches against the inputs and each
/// other. Returns whether the kv tensor list is in use.
template <class T>
bool sa_check_bsnd(const SelfAttentionParams& params, const SelfAttentionInputs<T>& in,
                   const SelfAttentionOutputs<T>& out) {
  using P = SelfAttentionParams;
  constexpr const char* fn = "self_attention";
  check_views(fn, "query", in.query, "key", in.key, "value", in.value, "mask", in.mask, "log_n",
              in.log_n, "head_mask", in.head_mask, "slopes", in.slopes, "block_tables",
              in.block_tables, "out", out.out, "key_cache", out.key_cache, "value_cache",
              out.value_cache);
  for (size_t i = 0; i < in.key_cache_list.size(); ++i)
    check_view(fn, "key_cache_list[" + std::to_string(i) + "]", in.key_cache_list[i]);
  for (size_t i = 0; i < in.value_cache_list.size(); ++i)
    check_view(fn, "value_cache_list[" + std::to_string(i) + "]", in.value_cache_list[i]);
  check_out_overlaps(fn, "out", out.out, "query", in.query, "key", in.key, "value", in.value,
                     "mask", in.mask, "log_n", in.log_n, "head_mask", in.head_mask, "slopes",
                     in.slopes, "block_tables", in.block_tables, "key_cache", out.key_cache,
                     "value_cache", out.value_cache);
  const bool kv_list = !in.key_cache_list.empty() || !in.value_cache_list.empty();
  validate(params, kv_list);
  ATTNREF_CHECK(params.input_layout == P::InputLayout::BSND, std::invalid_argument, fn,
                "params.input_layout", "BNSD with the BSND inputs",
                "BSND (use SelfAttentionBnsdInputs for BNSD)", "BNSD");
  sa_check_implemented(params);
  ATTNREF_CHECK(params.quant_type == P::QuantType::Unquant, std::invalid_argument, fn,
                "query/key/value", "not int8 with qkv full quantization",
                "int8 (SelfAttentionQuantInputs)", "floating-point data");
  const bool pa = params.calc_type == P::CalcType::PaEncoder;
  const bool prefix = params.calc_type == P::CalcType::PrefixEncoder;
  const bool bypass = params.kvcache_cfg == P::KvCacheCfg::KBypassVBypass;
  if (!(pa || prefix || bypass || kv_list)) {  // the new tokens are written into the caches
    for (const auto* c : {&out.key_cache, &out.value_cache})
      check_out_overlaps(fn, c == &out.key_cache ? "key_cache" : "value_cache", *c, "query",
                         in.query, "key", in.key, "value", in.value, "mask", in.mask, "log_n",
                         in.log_n, "head_mask", in.head_mask, "slopes", in.slopes);
    ATTNREF_CHECK(!overlaps(out.key_cache, out.value_cache), std::invalid_argument, fn,
                  "value_cache", "overlaps key_cache", "disjoint caches", "overlapping memory");
  }

  return kv_list;
}

/// PREFIX_ENCODER's K/V: the paged caches [numBlocks, blockSize, hidden] with block_tables and
/// kv_seq_len, validated as one PagedKvCache under the operator's names.
template <class T>
void sa_kv_prefix(const SelfAttentionInputs<T>& in, SelfAttentionPlan<T>& pl,
                  std::vector<StridedView<const T, 4>>& extra) {
  constexpr const char* fn = "self_attention";
  AttentionInputs<T>& e = pl.ein;
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
                shape_str(in.value));
  // ATB's PREFIX_ENCODER limits.
  for (Index hs : {pl.d, pl.dv})
    ATTNREF_CHECK(hs <= 128 && hs % 16 == 0, std::invalid_argument, fn, "head size",
                  "not supported by PrefixEncoder", "a multiple of 16, <= 128", hs);
  const Index block_elems =
      checked_mul(fn, "key.shape[1] (blockSize) * headSize", in.key.size(1), pl.d);
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
  const PagedKvCache<const T> cache{split_hidden(in.key, pl.nkv, pl.d),
                                    split_hidden(in.value, pl.nkv, pl.dv), in.block_tables,
                                    in.kv_seq_len};
  cache.validate(
      fn, {"key", "value", "block_tables", "kv_seq_len", "key.shape[1] (blockSize)", "blockSize"});
  e.read_kv(cache);
  pl.kv_len = in.kv_seq_len;
  extra.push_back(e.k);
  extra.push_back(e.v);
}

/// The kv tensor list: one [maxSeqLen, hidden] cache per sequence, all of entry 0's shape and
/// strides, read through one page per sequence.
template <class T>
void sa_kv_list(const SelfAttentionInputs<T>& in, SelfAttentionPlan<T>& pl,
                std::vector<StridedView<const T, 4>>& extra, KvPages<T>& list_pages,
                const std::vector<bool>& active) {
  constexpr const char* fn = "self_attention";
  AttentionInputs<T>& e = pl.ein;
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
  ATTNREF_CHECK(v0.size(0) == k0.size(0) && v0.size(1) == pl.nkv * pl.dv, std::invalid_argument, fn,
                "value_cache_list[0].shape", "mismatch",
                "[" + std::to_string(k0.size(0)) + ", " + std::to_string(pl.nkv * pl.dv) + "]",
                shape_str(v0));
  for (Index b = 0; b < pl.batch; ++b) {
    const auto& kb = in.key_cache_list[static_cast<size_t>(b)];
    const auto& vb = in.value_cache_list[static_cast<size_t>(b)];
    const std::string i = "[" + std::to_string(b) + "]";
    ATTNREF_CHECK(kb.shape() == k0.shape() && kb.strides() == k0.strides(), std::invalid_argument,
                  fn, "key_cache_list" + i, "shape or strides differ from entry 0", shape_str(k0),
                  shape_str(kb));
    ATTNREF_CHECK(vb.shape() == v0.shape() && vb.strides() == v0.strides(), std::invalid_argument,
                  fn, "value_cache_list" + i, "shape or strides differ from entry 0", shape_str(v0),
                  shape_str(vb));
    check_view(fn, "key_cache_list" + i, kb);
    check_view(fn, "value_cache_list" + i, vb);
    for (const auto* x : {&kb, &vb})
      extra.push_back(StridedView<const T, 4>(x->data(), {1, x->size(0), 1, x->size(1)},
                                              {0, x->stride(0), 0, x->stride(1)}));
    list_pages.k.push_back(kb.data());
    list_pages.v.push_back(vb.data());
    list_pages.first.push_back(b);
  }
  list_pages.page_size = std::max<Index>(1, k0.size(0));
  pl.kv_len = sa_token_offsets(in.seq_len, in.token_offset, active, k0.size(0));
  // The engine sees entry 0's shape and strides for every sequence; its pages are the list.
  e.k = StridedView<const T, 4>(k0.data(), {pl.batch, k0.size(0), pl.nkv, pl.d},
                                {0, k0.stride(0), pl.d * k0.stride(1), k0.stride(1)});
  e.v = StridedView<const T, 4>(v0.data(), {pl.batch, v0.size(0), pl.nkv, pl.dv},
                                {0, v0.stride(0), pl.dv * v0.stride(1), v0.stride(1)});
  e.seq.kv = pl.kv_len;
  pl.pages = &list_pages;
}

/// One layer of the caches [layerNum, batch, maxSeqLen, hidden] (or a rolling SWA cache).
template <class T>
void sa_kv_cache(const SelfAttentionParams& params, const SelfAttentionInputs<T>& in,
                 const SelfAttentionOutputs<T>& out, SelfAttentionPlan<T>& pl,
                 std::vector<StridedView<const T, 4>>& extra, const std::vector<bool>& active,
                 const std::vector<Index>& cu) {
  using P = SelfAttentionParams;
  constexpr const char* fn = "self_attention";
  AttentionInputs<T>& e = pl.ein;
  const bool bypass = params.kvcache_cfg == P::KvCacheCfg::KBypassVBypass;
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
                shape_str(kc));
  ATTNREF_CHECK(vc.size(0) == kc.size(0) && vc.size(1) == pl.batch && vc.size(2) == kc.size(2) &&
                    vc.size(3) == pl.nkv * pl.dv,
                std::invalid_argument, fn, "value_cache.shape", "mismatch",
                "[" + std::to_string(kc.size(0)) + ", " + std::to_string(pl.batch) + ", " +
                    std::to_string(kc.size(2)) + ", " + std::to_string(pl.nkv * pl.dv) + "]",
                shape_str(vc));
  ATTNREF_CHECK(in.layer_id >= 0 && in.layer_id < kc.size(0), std::out_of_range, fn, "layer_id",
                "out of range", "[0, " + std::to_string(kc.size(0)) + ")", in.layer_id);
  if (!rolling) {
    pl.kv_len = sa_token_offsets(in.seq_len, in.token_offset, active, kc.size(2));
  } else {
    // Rolling SWA cache: min(window, tokenOffset) slots in use, tokenOffset itself unbounded.
    pl.kv_len =
        sa_token_offsets(in.seq_len, in.token_offset, active, std::numeric_limits<Index>::max());
    for (Index b = 0; b < pl.batch; ++b) {
      if (!active[static_cast<size_t>(b)]) continue;  // reads and writes nothing
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
                      "== seq_len[" + std::to_string(b) + "] (a whole prompt), KCacheVCache", off);
      }
    }
    pl.swa_rolling = pl.decoder;
  }
  e.k = cache_layer(StridedView<const T, 4>(kc), in.layer_id, pl.nkv, pl.d);
  e.v = cache_layer(StridedView<const T, 4>(vc), in.layer_id, pl.nkv, pl.dv);
  e.seq.kv = pl.kv_len;
  if (rolling && !pl.decoder) {
    e.k = packed(in.key);
    e.v = packed(in.value);
    e.seq.kv.clear();
    e.seq.kv_cu = cu;
  }
  extra.push_back(StridedView<const T, 4>(kc));
  extra.push_back(StridedView<const T, 4>(vc));
}

/// The cache write: rows token_offset - seq_len + j of the layer, active sequences only (rolling
/// SWA cache: slot (token_offset - seq_len + j) % window, the last window tokens only).
template <class T>
void sa_write_caches(const SelfAttentionParams& params, const SelfAttentionInputs<T>& in,
                     const SelfAttentionOutputs<T>& out, const SelfAttentionPlan<T>& pl,
                     const std::vector<bool>& active, const std::vector<Index>& cu) {
  using P = SelfAttentionParams;
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
}

}  // namespace attnref::detail
