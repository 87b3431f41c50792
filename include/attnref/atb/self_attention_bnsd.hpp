#pragma once
/// attnref::self_attention with inputLayout BNSD: the overload taking SelfAttentionBnsdInputs.
/// Included by attnref/atb/self_attention.hpp.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/atb/detail/self_attention_plan.hpp"
#include "attnref/atb/self_attention_io.hpp"
#include "attnref/atb/self_attention_params.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

namespace detail {
/// self_attention, inputLayout BNSD (run) or its validation alone (!run).
template <class T>
void sa_call(const SelfAttentionParams& params, const SelfAttentionBnsdInputs<T>& in,
             const SelfAttentionBnsdOutputs<T>& out, const ExecConfig& exec, bool run) {
  detail::check_exec("self_attention", exec);
  using P = SelfAttentionParams;
  detail::sa_check_type<T>();
  constexpr const char* fn = "self_attention";
  detail::check_views(fn, "query", in.query, "key", in.key, "value", in.value, "mask", in.mask,
                      "out", out.out, "key_cache", out.key_cache, "value_cache", out.value_cache);
  detail::check_out_overlaps(fn, "out", out.out, "query", in.query, "key", in.key, "value",
                             in.value, "mask", in.mask, "key_cache", out.key_cache, "value_cache",
                             out.value_cache);
  validate(params);
  ATTNREF_CHECK(params.input_layout == P::InputLayout::BNSD, std::invalid_argument, fn,
                "params.input_layout", "BSND with the BNSD inputs",
                "BNSD (use SelfAttentionInputs for BSND)", "BSND");
  detail::sa_check_implemented(params);
  const bool pa = params.calc_type == P::CalcType::PaEncoder;

  detail::SelfAttentionPlan<T> pl;
  pl.run = run;
  pl.decoder = params.calc_type == P::CalcType::Decoder;
  pl.mask = &in.mask;
  pl.batch = in.query.size(0);
  pl.nh = in.query.size(1);
  pl.d = in.query.size(3);
  pl.nkv = params.num_kv_heads > 0 ? params.num_kv_heads : params.num_heads;
  pl.dv = out.out.size(3);
  const Index S = in.query.size(2);
  ATTNREF_CHECK(pl.nh == params.num_heads, std::invalid_argument, fn, "query.shape[1]",
                "mismatch with params.num_heads", params.num_heads, pl.nh);
  ATTNREF_CHECK(static_cast<Index>(in.seq_len.size()) == pl.batch, std::invalid_argument, fn,
                "seq_len", "size mismatch with query.shape[0]", pl.batch, in.seq_len.size());
  const std::vector<bool> active =
      detail::sa_sequences(params, in.seq_len, in.batch_run_status, S, "query.shape[2]");
  ATTNREF_CHECK(pl.d <= 256 && pl.dv <= 256, std::invalid_argument, fn, "head size",
                "above ATB's BNSD limit", "<= 256", std::max(pl.d, pl.dv));
  pl.q_len = in.seq_len;
  std::vector<StridedView<const T, 4>> extra{in.query};
  AttentionInputs<T>& e = pl.ein;
  e.q = detail::bnsd_to_engine(in.query);
  e.seq.q = in.seq_len;
  if (pa) {
    const std::array<Index, 4> ks{pl.batch, pl.nkv, S, pl.d}, vs{pl.batch, pl.nkv, S, pl.dv};
    ATTNREF_CHECK(in.key.shape() == ks, std::invalid_argument, fn, "key.shape", "mismatch",
                  detail::shape_str<4>(ks), detail::shape_str(in.key));
    ATTNREF_CHECK(in.value.shape() == vs, std::invalid_argument, fn, "value.shape", "mismatch",
                  detail::shape_str<4>(vs), detail::shape_str(in.value));
    detail::check_view(fn, "key", in.key);
    detail::check_view(fn, "value", in.value);
    e.k = detail::bnsd_to_engine(in.key);
    e.v = detail::bnsd_to_engine(in.value);
    pl.kv_len = in.seq_len;
    extra.push_back(in.key);
    extra.push_back(in.value);
  } else {
    const auto& kc = out.key_cache;
    const auto& vc = out.value_cache;
    ATTNREF_CHECK(!kc.absent() && !vc.absent(), std::invalid_argument, fn, "key_cache/value_cache",
                  "missing", "[layerNum, batch, kvHeadNum, maxSeqLen, headSize]", "none");
    ATTNREF_CHECK(kc.size(1) == pl.batch && kc.size(2) == pl.nkv && kc.size(4) == pl.d,
                  std::invalid_argument, fn, "key_cache.shape", "mismatch",
                  "[layerNum, " + std::to_string(pl.batch) + ", " + std::to_string(pl.nkv) +
                      ", maxSeqLen, " + std::to_string(pl.d) + "]",
                  detail::shape_str(kc));
    ATTNREF_CHECK(vc.size(0) == kc.size(0) && vc.size(1) == pl.batch && vc.size(2) == pl.nkv &&
                      vc.size(3) == kc.size(3) && vc.size(4) == pl.dv,
                  std::invalid_argument, fn, "value_cache.shape", "mismatch",
                  "[" + std::to_string(kc.size(0)) + ", " + std::to_string(pl.batch) + ", " +
                      std::to_string(pl.nkv) + ", " + std::to_string(kc.size(3)) + ", " +
                      std::to_string(pl.dv) + "]",
                  detail::shape_str(vc));
    ATTNREF_CHECK(in.layer_id >= 0 && in.layer_id < kc.size(0), std::out_of_range, fn, "layer_id",
                  "out of range", "[0, " + std::to_string(kc.size(0)) + ")", in.layer_id);
    pl.kv_len = detail::sa_token_offsets(in.seq_len, in.token_offset, active, kc.size(3));
    e.k = detail::bnsd_cache_layer(kc, in.layer_id);
    e.v = detail::bnsd_cache_layer(vc, in.layer_id);
    extra.push_back(e.k);
    extra.push_back(e.v);
  }
  e.seq.kv = pl.kv_len;
  detail::sa_finish_lengths(pl);
  const std::array<Index, 4> out_shape{pl.batch, pl.nh, S, pl.dv};
  ATTNREF_CHECK(out.out.shape() == out_shape, std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str<4>(out_shape), detail::shape_str(out.out));
  pl.o = detail::bnsd_to_engine(out.out);
  auto zero_padding = [&] {
    for (Index b = 0; b < pl.batch; ++b)
      for (Index h = 0; h < pl.nh; ++h)
        for (Index i = in.seq_len[static_cast<size_t>(b)]; i < S; ++i)
          for (Index x = 0; x < pl.dv; ++x) out.out(b, h, i, x) = T(0.0f);
  };
  detail::sa_run(params, pl, exec, extra, zero_padding);
}
}  // namespace detail

/// Every check of self_attention() with the BNSD inputs (params, tensors, execution config),
/// without computing or writing anything.
template <class T>
void validate(const SelfAttentionParams& params, const SelfAttentionBnsdInputs<T>& in,
              const SelfAttentionBnsdOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::sa_call(params, in, out, exec, false);
}

/// ATB SelfAttention, inputLayout BNSD (docs/semantics.md §2.10): ENCODER / DECODER / UNDEFINED
/// with kv-bypass over BNSD caches, or PA_ENCODER over BNSD q / k / v. The output has the query's
/// layout; its rows past seq_len[b] (and the rows of inactive sequences) are set to 0.
template <class T>
void self_attention(const SelfAttentionParams& params, const SelfAttentionBnsdInputs<T>& in,
                    const SelfAttentionBnsdOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::sa_call(params, in, out, exec, true);
}

}  // namespace attnref
