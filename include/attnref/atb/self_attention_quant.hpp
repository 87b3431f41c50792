#pragma once
/// attnref::self_attention with qkv full quantization (int8 q, k, v): the overload taking
/// SelfAttentionQuantInputs. Included by attnref/atb/self_attention.hpp.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/atb/detail/self_attention_plan.hpp"
#include "attnref/atb/self_attention_io.hpp"
#include "attnref/atb/self_attention_params.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/quant.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

namespace detail {
/// self_attention with qkv full quantization (run) or its validation alone (!run).
template <class TO>
void sa_call(const SelfAttentionParams& params, const SelfAttentionQuantInputs<TO>& in,
             const SelfAttentionOutputs<TO>& out, const ExecConfig& exec, bool run) {
  detail::check_exec("self_attention", exec);
  using P = SelfAttentionParams;
  static_assert(std::is_same_v<TO, half> || std::is_same_v<TO, bfloat16>,
                "qkv-quantized self_attention output: half or bfloat16");
  constexpr const char* fn = "self_attention";
  detail::check_views(fn, "query", in.query, "key", in.key, "value", in.value, "mask", in.mask,
                      "head_mask", in.head_mask, "slopes", in.slopes, "qk_descale", in.qk_descale,
                      "vpv_descale", in.vpv_descale, "p_scale", in.p_scale, "qk_offset",
                      in.qk_offset, "vpv_offset", in.vpv_offset, "out", out.out, "key_cache",
                      out.key_cache, "value_cache", out.value_cache);
  detail::check_out_overlaps(
      fn, "out", out.out, "query", in.query, "key", in.key, "value", in.value, "mask", in.mask,
      "head_mask", in.head_mask, "slopes", in.slopes, "qk_descale", in.qk_descale, "vpv_descale",
      in.vpv_descale, "p_scale", in.p_scale, "qk_offset", in.qk_offset, "vpv_offset", in.vpv_offset,
      "key_cache", out.key_cache, "value_cache", out.value_cache);
  validate(params);
  const bool online = params.quant_type == P::QuantType::QkvOnline;
  ATTNREF_CHECK(online || params.quant_type == P::QuantType::QkvOffline, std::invalid_argument, fn,
                "params.quant_type", "not a qkv quantization with int8 inputs",
                "QkvOffline or QkvOnline", static_cast<int>(params.quant_type));
  const P::OutDataType want_out =
      std::is_same_v<TO, half> ? P::OutDataType::Float16 : P::OutDataType::BFloat16;
  ATTNREF_CHECK(params.out_data_type == want_out, std::invalid_argument, fn, "params.out_data_type",
                "mismatch with the output type", static_cast<int>(want_out),
                static_cast<int>(params.out_data_type));
  detail::sa_check_implemented(params);
  const bool mla = params.mla_v_head_size > 0;

  detail::SelfAttentionPlan<TO, std::int8_t> pl;
  pl.run = run;
  detail::sa_sequences(params, in.seq_len, {}, -1, "");
  const std::vector<Index> cu = detail::sa_bsnd_front(pl, params, in, out);
  const Index tokens = in.query.size(0);
  const Index max_head = mla ? 576 : 256;
  for (Index hs : {pl.d, pl.dv})
    ATTNREF_CHECK(hs > 0 && hs % 32 == 0 && hs <= max_head, std::invalid_argument, fn, "head size",
                  "not supported by qkv full quantization",
                  "a multiple of 32, <= " + std::to_string(max_head), hs);
  const std::array<Index, 3> ks{tokens, pl.nkv, pl.d};
  ATTNREF_CHECK(in.key.shape() == ks, std::invalid_argument, fn, "key.shape", "mismatch",
                detail::shape_str<3>(ks), detail::shape_str(in.key));
  detail::check_view(fn, "key", in.key);
  std::vector<StridedView<const std::int8_t, 4>> extra{detail::packed(in.query),
                                                       detail::packed(in.key)};
  if (!mla) {
    const std::array<Index, 3> vs{tokens, pl.nkv, pl.dv};
    ATTNREF_CHECK(in.value.shape() == vs, std::invalid_argument, fn, "value.shape", "mismatch",
                  detail::shape_str<3>(vs), detail::shape_str(in.value));
    detail::check_view(fn, "value", in.value);
    extra.push_back(detail::packed(in.value));
  }
  // Per-head scales.
  auto check_scale = [&](const StridedView<const float, 1>& s, const char* name, bool positive) {
    ATTNREF_CHECK(!s.absent(), std::invalid_argument, fn, name, "missing for qkv full quantization",
                  "[headNum] float", "none");
    ATTNREF_CHECK(s.size(0) == pl.nh, std::invalid_argument, fn, std::string(name) + ".shape[0]",
                  "mismatch with the number of heads", pl.nh, s.size(0));
    detail::check_finite(fn, name, s, positive);
  };
  check_scale(in.qk_descale, "qk_descale", false);
  check_scale(in.vpv_descale, "vpv_descale", false);
  if (online)
    ATTNREF_CHECK(in.p_scale.absent(), std::invalid_argument, fn, "p_scale",
                  "given with QkvOnline (the P scale comes from the data)", "absent",
                  detail::shape_str(in.p_scale));
  else
    check_scale(in.p_scale, "p_scale", true);

  AttentionInputs<std::int8_t>& e = pl.ein;
  e.q = detail::packed(in.query);
  e.k = detail::packed(in.key);
  e.v = mla ? StridedView<const std::int8_t, 4>(
                  in.key.data(), {1, tokens, pl.nkv, pl.dv},
                  {0, in.key.stride(0), in.key.stride(1), in.key.stride(2)})
            : detail::packed(in.value);
  e.seq.q_cu = cu;
  e.seq.kv_cu = cu;
  pl.kv_len = in.seq_len;
  detail::sa_finish_lengths(pl);
  const std::array<Index, 3> out_shape{tokens, pl.nh, pl.dv};
  ATTNREF_CHECK(out.out.shape() == out_shape, std::invalid_argument, fn, "out.shape", "mismatch",
                detail::shape_str<3>(out_shape), detail::shape_str(out.out));
  pl.o = detail::packed(out.out);

  detail::SaQuant quant;
  quant.qk_descale = in.qk_descale;
  quant.p_stage.form = detail::PQuantStep::Form::SelfAttention;
  quant.p_stage.online = online;
  quant.p_stage.v_descale = in.vpv_descale;
  quant.p_stage.p_scale = in.p_scale;
  quant.block = params.quant_block_size;
  detail::sa_run(
      params, pl, exec, extra, [] {}, &quant);
}
}  // namespace detail

/// Every check of the qkv-quantized self_attention() (params, tensors, execution config),
/// without computing or writing anything.
template <class TO>
void validate(const SelfAttentionParams& params, const SelfAttentionQuantInputs<TO>& in,
              const SelfAttentionOutputs<TO>& out, const ExecConfig& exec = {}) {
  detail::sa_call(params, in, out, exec, false);
}

/// ATB SelfAttention with qkv full quantization (quantType QkvOffline / QkvOnline),
/// docs/semantics.md §2.8. Per sequence b, head h (kv head h / G), query i, key j:
///   s = fp16(fp16(int32(q_i · k_j) · qkDescale[h]) · fp16(qkScale)), clamp (fp16), + mask (fp16)
/// then the online softmax over blocks of params.quant_block_size keys (128) with P quantized to
/// int8 per block (detail/hooks/quant_p.hpp): online with the running row amax / 127, offline
/// with pScale[h]; P8 · V8 exact; dequantized by vpvDescale[h] times the P scale; out = O / l,
/// rounded to TO. The scores are fp16 whatever the output type and kernel type (the vendor's
/// golden); masks follow the usual encodings of TO (fp16 DEFAULT: additive; bf16 or
/// HIGH_PRECISION: binary x -3e38). MLA (mla_v_head_size > 0): V = the first mlaVHeadSize
/// elements of each K head, no value input. Head sizes: multiples of 32, <= 256 (<= 576 with
/// MLA). qScale must be 1 (fold it into qkDescale). Everything is checked before `out` is written.
template <class TO>
void self_attention(const SelfAttentionParams& params, const SelfAttentionQuantInputs<TO>& in,
                    const SelfAttentionOutputs<TO>& out, const ExecConfig& exec = {}) {
  detail::sa_call(params, in, out, exec, true);
}

}  // namespace attnref
