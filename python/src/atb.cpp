/// ATB operators for Python: SelfAttention, PagedAttention, ReshapeAndCache (ND and NZ).

#include <attnref/atb/paged_attention.hpp>
#include <attnref/atb/reshape_and_cache.hpp>
#include <attnref/atb/self_attention.hpp>
#include <attnref/atb/self_attention_bnsd.hpp>
#include <attnref/atb/self_attention_quant.hpp>

#include "bind.hpp"

namespace attnref::python {

namespace {

using PA = PagedAttentionParams;
using SA = SelfAttentionParams;

void bind_paged_attention_params(py::module_& m) {
  ParamsBinder<PA> b(m, "PagedAttentionParams", "atb::infer::PagedAttentionParam, field for field");
  auto& c = b.cls();
  bind_enum<PA::MaskType>(c, "MaskType",
                          {{"Undefined", PA::MaskType::Undefined},
                           {"Norm", PA::MaskType::Norm},
                           {"Alibi", PA::MaskType::Alibi},
                           {"Spec", PA::MaskType::Spec},
                           {"MaskFree", PA::MaskType::MaskFree},
                           {"NormCompress", PA::MaskType::NormCompress}});
  bind_enum<PA::QuantType>(c, "QuantType",
                           {{"Unquant", PA::QuantType::Unquant},
                            {"DequantFusion", PA::QuantType::DequantFusion},
                            {"QkvOffline", PA::QuantType::QkvOffline},
                            {"QkvOnline", PA::QuantType::QkvOnline}});
  bind_enum<PA::OutDataType>(c, "OutDataType",
                             {{"Undefined", PA::OutDataType::Undefined},
                              {"Float16", PA::OutDataType::Float16},
                              {"BFloat16", PA::OutDataType::BFloat16}});
  bind_enum<PA::CompressType>(c, "CompressType",
                              {{"Undefined", PA::CompressType::Undefined},
                               {"KvHead", PA::CompressType::KvHead},
                               {"KvHeadRope", PA::CompressType::KvHeadRope}});
  bind_enum<PA::CalcType>(c, "CalcType",
                          {{"Undefined", PA::CalcType::Undefined}, {"Spec", PA::CalcType::Spec}});
  bind_enum<PA::ScaleType>(c, "ScaleType",
                           {{"Tor", PA::ScaleType::Tor}, {"LogN", PA::ScaleType::LogN}});
  bind_enum<PA::InputLayout>(c, "InputLayout",
                             {{"BSND", PA::InputLayout::BSND}, {"BNSD", PA::InputLayout::BNSD}});
  b.field("num_heads", &PA::num_heads)
      .field("qk_scale", &PA::qk_scale)
      .field("num_kv_heads", &PA::num_kv_heads)
      .field("mask_type", &PA::mask_type)
      .field("batch_run_status_enable", &PA::batch_run_status_enable)
      .field("quant_type", &PA::quant_type)
      .field("out_data_type", &PA::out_data_type)
      .field("has_quant_offset", &PA::has_quant_offset)
      .field("compress_type", &PA::compress_type)
      .field("calc_type", &PA::calc_type)
      .field("scale_type", &PA::scale_type)
      .field("input_layout", &PA::input_layout)
      .field("mla_v_head_size", &PA::mla_v_head_size)
      .field("q_scale", &PA::q_scale)
      .field("quant_block_size", &PA::quant_block_size);
  b.finish();
}

void bind_self_attention_params(py::module_& m) {
  ParamsBinder<SA> b(m, "SelfAttentionParams", "atb::infer::SelfAttentionParam, field for field");
  auto& c = b.cls();
  bind_enum<SA::CalcType>(c, "CalcType",
                          {{"Undefined", SA::CalcType::Undefined},
                           {"Encoder", SA::CalcType::Encoder},
                           {"Decoder", SA::CalcType::Decoder},
                           {"PaEncoder", SA::CalcType::PaEncoder},
                           {"PrefixEncoder", SA::CalcType::PrefixEncoder}});
  bind_enum<SA::KernelType>(
      c, "KernelType",
      {{"Default", SA::KernelType::Default}, {"HighPrecision", SA::KernelType::HighPrecision}});
  bind_enum<SA::ClampType>(
      c, "ClampType", {{"Undefined", SA::ClampType::Undefined}, {"MinMax", SA::ClampType::MinMax}});
  bind_enum<SA::MaskType>(c, "MaskType",
                          {{"Undefined", SA::MaskType::Undefined},
                           {"Norm", SA::MaskType::Norm},
                           {"Alibi", SA::MaskType::Alibi},
                           {"NormCompress", SA::MaskType::NormCompress},
                           {"AlibiCompress", SA::MaskType::AlibiCompress},
                           {"AlibiCompressSqrt", SA::MaskType::AlibiCompressSqrt},
                           {"AlibiCompressLeftAlign", SA::MaskType::AlibiCompressLeftAlign},
                           {"SlidingWindowNorm", SA::MaskType::SlidingWindowNorm},
                           {"SlidingWindowCompress", SA::MaskType::SlidingWindowCompress},
                           {"CausalMask", SA::MaskType::CausalMask}});
  bind_enum<SA::KvCacheCfg>(c, "KvCacheCfg",
                            {{"KCacheVCache", SA::KvCacheCfg::KCacheVCache},
                             {"KBypassVBypass", SA::KvCacheCfg::KBypassVBypass}});
  bind_enum<SA::ScaleType>(c, "ScaleType",
                           {{"Tor", SA::ScaleType::Tor}, {"LogN", SA::ScaleType::LogN}});
  bind_enum<SA::QuantType>(c, "QuantType",
                           {{"Unquant", SA::QuantType::Unquant},
                            {"DequantFusion", SA::QuantType::DequantFusion},
                            {"QkvOffline", SA::QuantType::QkvOffline},
                            {"QkvOnline", SA::QuantType::QkvOnline}});
  bind_enum<SA::OutDataType>(c, "OutDataType",
                             {{"Undefined", SA::OutDataType::Undefined},
                              {"Float16", SA::OutDataType::Float16},
                              {"BFloat16", SA::OutDataType::BFloat16}});
  bind_enum<SA::InputLayout>(c, "InputLayout",
                             {{"BSND", SA::InputLayout::BSND}, {"BNSD", SA::InputLayout::BNSD}});
  bind_enum<SA::CacheType>(c, "CacheType",
                           {{"Norm", SA::CacheType::Norm}, {"Swa", SA::CacheType::Swa}});
  b.field("num_heads", &SA::num_heads)
      .field("num_kv_heads", &SA::num_kv_heads)
      .field("q_scale", &SA::q_scale)
      .field("qk_scale", &SA::qk_scale)
      .field("batch_run_status_enable", &SA::batch_run_status_enable)
      .field("is_triu_mask", &SA::is_triu_mask)
      .field("calc_type", &SA::calc_type)
      .field("kernel_type", &SA::kernel_type)
      .field("clamp_type", &SA::clamp_type)
      .field("clamp_min", &SA::clamp_min)
      .field("clamp_max", &SA::clamp_max)
      .field("mask_type", &SA::mask_type)
      .field("kvcache_cfg", &SA::kvcache_cfg)
      .field("scale_type", &SA::scale_type)
      .field("quant_type", &SA::quant_type)
      .field("out_data_type", &SA::out_data_type)
      .field("input_layout", &SA::input_layout)
      .field("mla_v_head_size", &SA::mla_v_head_size)
      .field("cache_type", &SA::cache_type)
      .field("window_size", &SA::window_size)
      .field("quant_block_size", &SA::quant_block_size);
  b.finish();
}

// ---- PagedAttention ----------------------------------------------------------------------

template <class TQ, class TKV, class TM, class TO>
py::object paged_attention_t(const PA& p, Args& a, const ExecConfig& x, int repeats) {
  PagedAttentionInputs<TQ, TKV, TM> in;
  a.view("query", in.query);
  a.view("key_cache", in.key_cache);
  a.view("value_cache", in.value_cache);
  a.index_view("block_tables", in.block_tables);
  a.ints("context_lens", in.context_lens);
  a.ints("q_seq_lens", in.q_seq_lens);
  a.view("mask", in.mask);
  a.view("spec_mask", in.spec_mask);
  a.view("alibi_mask", in.alibi_mask);
  a.view("log_n", in.log_n);
  a.ints("batch_run_status", in.batch_run_status);
  a.view("k_descale", in.k_descale);
  a.view("v_descale", in.v_descale);
  a.view("k_offset", in.k_offset);
  a.view("v_offset", in.v_offset);
  a.view("p_scale", in.p_scale);
  a.view("razor_offset", in.razor_offset);
  std::vector<Index> shape = extents(a, "query");
  if (shape.size() == 3)
    shape[2] = p.mla_v_head_size > 0 ? Index(p.mla_v_head_size) : last_extent(a, "value_cache");
  PagedAttentionOutputs<TO> out;
  py::object result = a.output("out", out.out, shape);
  a.finish();
  return run_kernel(repeats, result, [&] { paged_attention(p, in, out, x); });
}

py::object paged_attention_py(const PA& p, const py::dict& kw, const ExecConfig& x, int repeats) {
  Args a("paged_attention", kw);
  const Dtype q = a.dtype("query"), kv = a.dtype("key_cache");
  if (q == Dtype::i8) {
    const bool bf = p.out_data_type == PA::OutDataType::BFloat16;
    const Dtype out = a.dtype("out", bf ? Dtype::bf16 : Dtype::f16);
    return with_half(a.op(), "out", out, [&](auto o) {
      using TO = typename decltype(o)::type;
      return with_half(a.op(), "mask", a.dtype("mask", dtype_v<TO>()), [&](auto mk) {
        using TM = typename decltype(mk)::type;
        return paged_attention_t<std::int8_t, std::int8_t, TM, TO>(p, a, x, repeats);
      });
    });
  }
  return with_float(a.op(), "query", q, [&](auto t) {
    using T = typename decltype(t)::type;
    if (kv == Dtype::i8) return paged_attention_t<T, std::int8_t, T, T>(p, a, x, repeats);
    return paged_attention_t<T, T, T, T>(p, a, x, repeats);
  });
}

// ---- SelfAttention -----------------------------------------------------------------------

/// The fields SelfAttentionInputs and SelfAttentionQuantInputs share.
template <class In>
void sa_common(Args& a, In& in) {
  a.view("query", in.query);
  a.view("key", in.key);
  a.view("value", in.value);
  a.ints("seq_len", in.seq_len);
  a.view("mask", in.mask);
  a.view("head_mask", in.head_mask);
  a.view("slopes", in.slopes);
}

std::vector<Index> sa_out_shape(const SA& p, const Args& a) {
  std::vector<Index> shape = extents(a, "query");
  const Index dv = p.mla_v_head_size > 0  ? Index(p.mla_v_head_size)
                   : a.has("value")       ? last_extent(a, "value")
                   : a.has("value_cache") ? last_extent(a, "value_cache")
                                          : shape.back();
  shape.back() = dv;
  return shape;
}

template <class T>
py::object self_attention_t(const SA& p, Args& a, const ExecConfig& x, int repeats) {
  SelfAttentionInputs<T> in;
  sa_common(a, in);
  a.view("log_n", in.log_n);
  a.ints("token_offset", in.token_offset);
  std::vector<Index> layer;
  a.ints("layer_id", layer);
  if (!layer.empty()) in.layer_id = layer[0];
  a.ints("batch_run_status", in.batch_run_status);
  a.ints("kv_seq_len", in.kv_seq_len);
  a.index_view("block_tables", in.block_tables);
  a.view_list("key_cache_list", in.key_cache_list);
  a.view_list("value_cache_list", in.value_cache_list);
  SelfAttentionOutputs<T> out;
  a.view("key_cache", out.key_cache);
  a.view("value_cache", out.value_cache);
  py::object result = a.output("out", out.out, sa_out_shape(p, a));
  a.finish();
  return run_kernel(repeats, result, [&] { self_attention(p, in, out, x); });
}

template <class T>
py::object self_attention_bnsd_t(const SA& p, Args& a, const ExecConfig& x) {
  SelfAttentionBnsdInputs<T> in;
  a.view("query", in.query);
  a.view("key", in.key);
  a.view("value", in.value);
  a.ints("seq_len", in.seq_len);
  a.view("mask", in.mask);
  a.ints("token_offset", in.token_offset);
  std::vector<Index> layer;
  a.ints("layer_id", layer);
  if (!layer.empty()) in.layer_id = layer[0];
  a.ints("batch_run_status", in.batch_run_status);
  SelfAttentionBnsdOutputs<T> out;
  a.view("key_cache", out.key_cache);
  a.view("value_cache", out.value_cache);
  py::object result = a.output("out", out.out, sa_out_shape(p, a));
  a.finish();
  return run_kernel(0, result, [&] { self_attention(p, in, out, x); });
}

template <class TO>
py::object self_attention_quant_t(const SA& p, Args& a, const ExecConfig& x) {
  SelfAttentionQuantInputs<TO> in;
  sa_common(a, in);
  a.view("qk_descale", in.qk_descale);
  a.view("vpv_descale", in.vpv_descale);
  a.view("p_scale", in.p_scale);
  a.view("qk_offset", in.qk_offset);
  a.view("vpv_offset", in.vpv_offset);
  SelfAttentionOutputs<TO> out;
  a.view("key_cache", out.key_cache);
  a.view("value_cache", out.value_cache);
  py::object result = a.output("out", out.out, sa_out_shape(p, a));
  a.finish();
  return run_kernel(0, result, [&] { self_attention(p, in, out, x); });
}

py::object self_attention_py(const SA& p, const py::dict& kw, const ExecConfig& x, int repeats) {
  Args a("self_attention", kw);
  const Dtype q = a.dtype("query");
  if (q == Dtype::i8) {
    const bool bf = p.out_data_type == SA::OutDataType::BFloat16;
    return with_half(a.op(), "out", a.dtype("out", bf ? Dtype::bf16 : Dtype::f16), [&](auto o) {
      return self_attention_quant_t<typename decltype(o)::type>(p, a, x);
    });
  }
  return with_float(a.op(), "query", q, [&](auto t) {
    using T = typename decltype(t)::type;
    if (p.input_layout == SA::InputLayout::BNSD) return self_attention_bnsd_t<T>(p, a, x);
    return self_attention_t<T>(p, a, x, repeats);
  });
}

// ---- ReshapeAndCache ---------------------------------------------------------------------

template <class T>
void reshape_and_cache_t(Args& a, bool nz) {
  ReshapeAndCacheInputs<T> in;
  a.view("key", in.key);
  a.view("value", in.value);
  a.index_view("slot_mapping", in.slot_mapping);
  StridedView<T, 4> kc, vc;
  a.view("key_cache", kc);
  a.view("value_cache", vc);
  a.finish();
  py::gil_scoped_release unlocked;
  if (nz)
    reshape_and_cache_nz(in, kc, vc);
  else
    reshape_and_cache(in, kc, vc);
}

void reshape_and_cache_py(const py::dict& kw, bool nz) {
  Args a(nz ? "reshape_and_cache_nz" : "reshape_and_cache", kw);
  const Dtype d = a.dtype("key");
  switch (d) {
    case Dtype::f32:
      return reshape_and_cache_t<float>(a, nz);
    case Dtype::f16:
      return reshape_and_cache_t<half>(a, nz);
    case Dtype::bf16:
      return reshape_and_cache_t<bfloat16>(a, nz);
    case Dtype::i8:
      return reshape_and_cache_t<std::int8_t>(a, nz);
    default:
      type_error(
          a.op(), "key",
          std::string("must hold float32, float16, bfloat16 or int8, got ") + dtype_label(d));
  }
}

}  // namespace

void bind_atb(py::module_& m) {
  bind_paged_attention_params(m);
  bind_self_attention_params(m);
  // repeats > 0 (the binding benchmark, bench/python): the kernel runs that many times on the
  // converted arguments and the mean seconds per run are returned instead of the output.
  m.def("_paged_attention", &paged_attention_py, py::arg("params"), py::arg("tensors"),
        py::arg("exec"), py::arg("repeats") = 0);
  m.def("_self_attention", &self_attention_py, py::arg("params"), py::arg("tensors"),
        py::arg("exec"), py::arg("repeats") = 0);
  m.def("_reshape_and_cache", [](const py::dict& kw) { reshape_and_cache_py(kw, false); });
  m.def("_reshape_and_cache_nz", [](const py::dict& kw) { reshape_and_cache_py(kw, true); });
}

}  // namespace attnref::python
