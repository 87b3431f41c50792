/// CANN operators for Python: PromptFlashAttention, IncreFlashAttention,
/// FusedInferAttentionScore.
///
/// Instantiated element types (compile time is kept within the CI budget; the others are
/// rejected with TypeError naming the argument): float16 and bfloat16 query / key / value /
/// output in this unit; float32 (attnref extension) and int8 key / value with a float16 or
/// bfloat16 query (antiquant; IFA and FIA) in cann_quant.cpp. The int8 query path, int8 output,
/// int4 (int32) key / value and MLA's full quantization are not instantiated. Masks are read as
/// uint8 (bool and int8 masks are viewed as uint8, not copied: nonzero = masked).

#include <attnref/cann/fused_infer_attention_score.hpp>
#include <attnref/cann/incre_flash_attention.hpp>
#include <attnref/cann/prompt_flash_attention.hpp>

#include "bind.hpp"

// The combinations cann_quant.cpp instantiates, declared here so as not to instantiate them
// again.
#define ATTNREF_CANN_EXTERN extern
#include "cann_instances.hpp"

namespace attnref::python {

namespace {

using PFA = PromptFlashAttentionParams;
using IFA = IncreFlashAttentionParams;
using FIA = FusedInferAttentionScoreParams;

void bind_cann_params(py::module_& m) {
  bind_enum<PseOrder>(
      m, "PseOrder",
      {{"ScaleThenAdd", PseOrder::ScaleThenAdd}, {"AddThenScale", PseOrder::AddThenScale}});
  ParamsBinder<PFA> p(m, "PromptFlashAttentionParams",
                      "aclnnPromptFlashAttentionV3's attributes, field for field");
  p.field("num_heads", &PFA::num_heads)
      .field("scale_value", &PFA::scale_value)
      .field("pre_tokens", &PFA::pre_tokens)
      .field("next_tokens", &PFA::next_tokens)
      .field("input_layout", &PFA::input_layout)
      .field("num_key_value_heads", &PFA::num_key_value_heads)
      .field("sparse_mode", &PFA::sparse_mode)
      .field("inner_precise", &PFA::inner_precise)
      .field("pse_order", &PFA::pse_order)
      .field("quant_block_size", &PFA::quant_block_size);
  p.cls().attr("PseOrder") = m.attr("PseOrder");
  p.finish();
  ParamsBinder<IFA> i(m, "IncreFlashAttentionParams",
                      "aclnnIncreFlashAttentionV4's attributes, field for field");
  i.field("num_heads", &IFA::num_heads)
      .field("scale_value", &IFA::scale_value)
      .field("input_layout", &IFA::input_layout)
      .field("num_key_value_heads", &IFA::num_key_value_heads)
      .field("block_size", &IFA::block_size)
      .field("inner_precise", &IFA::inner_precise)
      .field("pse_order", &IFA::pse_order)
      .field("antiquant_mode", &IFA::antiquant_mode);
  i.cls().attr("PseOrder") = m.attr("PseOrder");
  i.finish();
  ParamsBinder<FIA> f(m, "FusedInferAttentionScoreParams",
                      "aclnnFusedInferAttentionScore's attributes (V1-V4), field for field");
  f.field("num_heads", &FIA::num_heads)
      .field("scale_value", &FIA::scale_value)
      .field("pre_tokens", &FIA::pre_tokens)
      .field("next_tokens", &FIA::next_tokens)
      .field("input_layout", &FIA::input_layout)
      .field("num_key_value_heads", &FIA::num_key_value_heads)
      .field("sparse_mode", &FIA::sparse_mode)
      .field("inner_precise", &FIA::inner_precise)
      .field("block_size", &FIA::block_size)
      .field("antiquant_mode", &FIA::antiquant_mode)
      .field("softmax_lse_flag", &FIA::softmax_lse_flag)
      .field("key_antiquant_mode", &FIA::key_antiquant_mode)
      .field("value_antiquant_mode", &FIA::value_antiquant_mode)
      .field("query_quant_mode", &FIA::query_quant_mode)
      .field("pse_order", &FIA::pse_order)
      .field("quant_block_size", &FIA::quant_block_size);
  f.cls().attr("PseOrder") = m.attr("PseOrder");
  f.finish();
}

// ---- Arguments ----------------------------------------------------------------------------------

/// atten_mask read as uint8: a bool or int8 mask is viewed as uint8 (same bytes, nonzero =
/// masked), another element type raises TypeError.
void mask_as_u8(const std::string& op, py::dict& kw) {
  if (!kw.contains("atten_mask") || !py::isinstance<py::array>(kw["atten_mask"])) return;
  py::array m = py::reinterpret_borrow<py::array>(kw["atten_mask"]);
  const char kind = m.dtype().kind();
  if (m.itemsize() == 1 && (kind == 'b' || kind == 'i'))
    kw["atten_mask"] = m.attr("view")("uint8");
  else if (m.itemsize() != 1 || kind != 'u')
    type_error(op, "atten_mask",
               "must hold bool, int8 or uint8, got " + std::string(py::str(m.dtype())));
}

/// A single array `name` as a list of one (the key / value tensor lists).
void as_list(py::dict& kw, const char* name) {
  if (kw.contains(name) && py::isinstance<py::array>(kw[name])) kw[name] = py::make_tuple(kw[name]);
}

/// The array `name`, or the first array of a list `name` (None otherwise).
py::object first_array(const Args& a, const char* name) {
  py::object o = a.get(name);
  if (py::isinstance<py::array>(o)) return o;
  if (py::isinstance<py::sequence>(o) && !py::isinstance<py::str>(o) && py::len(o) > 0 &&
      py::isinstance<py::array>(o[py::int_(0)]))
    return o[py::int_(0)];
  return py::none();
}

/// The element type of the array (or first array of the list) `name`; other when absent.
Dtype dtype_of_first(const Args& a, const char* name) {
  py::object o = first_array(a, name);
  return o.is_none() ? Dtype::other : dtype_of(py::reinterpret_borrow<py::array>(o));
}

std::vector<Index> shape_of(const py::object& o) {
  if (o.is_none()) return {};
  py::array x = py::reinterpret_borrow<py::array>(o);
  return std::vector<Index>(x.shape(), x.shape() + x.ndim());
}

Index kv_heads(std::int64_t n, std::int64_t kvn) { return Index(kvn > 0 ? kvn : n); }

/// The value's head size: a paged 3-D cache or a BSH tensor holds KV_N·Dv per row.
Index value_head(const std::string& layout, const std::vector<Index>& v, bool paged, Index kvn,
                 Index fallback) {
  if (v.empty()) return fallback;
  const bool merged = paged ? v.size() == 3 : layout.rfind("BSH", 0) == 0;
  return merged && kvn > 0 ? v.back() / kvn : v.back();
}

/// attention_out's shape: the query's layout with head size dv (BNSD_BSND: BSND; NTD_TND: TND;
/// MLA's head-major forms: [N, B, S, D] / [N, T, D]). A rank that does not fit the layout keeps
/// the query's shape (the operator then names the mismatch).
std::vector<Index> out_shape(const std::string& l, const std::vector<Index>& q, Index n, Index dv) {
  if (q.size() == 3) {
    if (l == "BSH") return {q[0], q[1], n * dv};
    if (l == "TND") return {q[0], q[1], dv};
    if (l == "NTD_TND") return {q[1], q[0], dv};
    if (l == "BSH_NBSD") return {n, q[0], q[1], dv};
    if (l == "TND_NTD") return {q[1], q[0], dv};
  } else if (q.size() == 4) {
    if (l == "BSND" || l == "BNSD") return {q[0], q[1], q[2], dv};
    if (l == "BNSD_BSND") return {q[0], q[2], q[1], dv};
    if (l == "BSND_NBSD") return {q[2], q[0], q[1], dv};
    if (l == "BNSD_NBSD") return {q[1], q[0], q[2], dv};
  }
  return q;
}

/// softmax_lse's shape: [B, N, Q_S, 1], TND [T, N, 1].
std::vector<Index> lse_shape(const std::string& l, const std::vector<Index>& q, Index n) {
  if (q.size() < 3) return {0};
  if (l == "TND") return {q[0], n, 1};
  if (l == "NTD_TND") return {q[1], n, 1};
  const bool bnsd = l == "BNSD" || l == "BNSD_BSND";
  return {q[0], n, q.size() == 4 && bnsd ? q[2] : q[1], 1};
}

// ---- PromptFlashAttention -----------------------------------------------------------------------

template <class T>
py::object pfa_t(const PFA& p, Args& a, const ExecConfig& x) {
  PromptFlashAttentionInputs<T, std::uint8_t, T> in;
  a.view("query", in.query);
  a.view("key", in.key);
  a.view("value", in.value);
  a.view("pse_shift", in.pse_shift);
  a.view("atten_mask", in.atten_mask);
  a.ints("actual_seq_lengths", in.actual_seq_lengths);
  a.ints("actual_seq_lengths_kv", in.actual_seq_lengths_kv);
  a.view("deq_scale1", in.deq_scale1);
  a.view("quant_scale1", in.quant_scale1);
  a.view("deq_scale2", in.deq_scale2);
  a.view("quant_scale2", in.quant_scale2);
  a.view("quant_offset2", in.quant_offset2);
  const std::vector<Index> q = extents(a, "query");
  const Index kvn = kv_heads(p.num_heads, p.num_key_value_heads);
  const Index dv = value_head(p.input_layout, shape_of(first_array(a, "value")), false, kvn,
                              q.empty() ? 0 : q.back());
  PromptFlashAttentionOutputs<T> out;
  py::object result = a.output("attention_out", out.attention_out,
                               out_shape(p.input_layout, q, Index(p.num_heads), dv));
  a.finish();
  py::gil_scoped_release unlocked;
  prompt_flash_attention(p, in, out, x);
  return result;
}

py::object pfa_py(const PFA& p, py::dict kw, const ExecConfig& x) {
  mask_as_u8("prompt_flash_attention", kw);
  Args a("prompt_flash_attention", kw);
  return with_float(a.op(), "query", a.dtype("query"),
                    [&](auto t) { return pfa_t<typename decltype(t)::type>(p, a, x); });
}

// ---- IncreFlashAttention ------------------------------------------------------------------------

template <class T, class TKV>
py::object ifa_t(const IFA& p, Args& a, const ExecConfig& x) {
  IncreFlashAttentionInputs<T, TKV> in;
  a.view("query", in.query);
  a.view_list("key", in.key);
  a.view_list("value", in.value);
  a.view("pse_shift", in.pse_shift);
  a.view("atten_mask", in.atten_mask);
  a.ints("actual_seq_lengths", in.actual_seq_lengths);
  a.view("antiquant_scale", in.antiquant_scale);
  a.view("antiquant_offset", in.antiquant_offset);
  a.view("antiquant_scale_per_token", in.antiquant_scale_per_token);
  a.view("antiquant_offset_per_token", in.antiquant_offset_per_token);
  a.view("kv_padding_size", in.kv_padding_size);
  a.index_view("block_table", in.block_table);
  a.view("quant_scale2", in.quant_scale2);
  a.view("quant_offset2", in.quant_offset2);
  IncreFlashAttentionOutputs<T> out;
  py::object result = a.output("attention_out", out.attention_out, extents(a, "query"));
  a.finish();
  py::gil_scoped_release unlocked;
  incre_flash_attention(p, in, out, x);
  return result;
}

/// The key / value element type: the query's (float16, bfloat16, float32), or int8 with a float16
/// or bfloat16 query (antiquant). Calls f(Tag<T>, Tag<TKV>).
template <class F>
py::object with_q_kv(Args& a, F&& f) {
  const Dtype kv = dtype_of_first(a, "key");
  return with_float(a.op(), "query", a.dtype("query"), [&](auto t) -> py::object {
    using T = typename decltype(t)::type;
    if (kv == Dtype::i32)
      type_error(a.op(), "key",
                 "holds int32 (int4 packed): not instantiated in attnref's Python "
                 "module (C++ only)");
    if (kv != Dtype::i8) return f(t, t);
    if constexpr (std::is_same_v<T, float>)
      type_error(a.op(), "key", "holds int8: antiquant takes a float16 or bfloat16 query here");
    else
      return f(t, Tag<std::int8_t>{});
  });
}

py::object ifa_py(const IFA& p, py::dict kw, const ExecConfig& x) {
  mask_as_u8("incre_flash_attention", kw);
  as_list(kw, "key");
  as_list(kw, "value");
  Args a("incre_flash_attention", kw);
  return with_q_kv(a, [&](auto t, auto kv) {
    return ifa_t<typename decltype(t)::type, typename decltype(kv)::type>(p, a, x);
  });
}

// ---- FusedInferAttentionScore -------------------------------------------------------------------

template <class T, class TKV>
void fia_inputs(Args& a, FusedInferAttentionScoreInputs<T, TKV>& in) {
  a.view("query", in.query);
  a.view_list("key", in.key);
  a.view_list("value", in.value);
  a.view("pse_shift", in.pse_shift);
  a.view("atten_mask", in.atten_mask);
  a.ints("actual_seq_lengths", in.actual_seq_lengths);
  a.ints("actual_seq_lengths_kv", in.actual_seq_lengths_kv);
  a.view("deq_scale1", in.deq_scale1);
  a.view("quant_scale1", in.quant_scale1);
  a.view("deq_scale2", in.deq_scale2);
  a.view("quant_scale2", in.quant_scale2);
  a.view("quant_offset2", in.quant_offset2);
  a.view("antiquant_scale", in.antiquant_scale);
  a.view("antiquant_offset", in.antiquant_offset);
  a.view("antiquant_scale_per_token", in.antiquant_scale_per_token);
  a.view("antiquant_offset_per_token", in.antiquant_offset_per_token);
  a.view("key_antiquant_scale", in.key_antiquant_scale);
  a.view("key_antiquant_offset", in.key_antiquant_offset);
  a.view("value_antiquant_scale", in.value_antiquant_scale);
  a.view("value_antiquant_offset", in.value_antiquant_offset);
  a.view("key_shared_prefix", in.key_shared_prefix);
  a.view("value_shared_prefix", in.value_shared_prefix);
  a.ints("actual_shared_prefix_len", in.actual_shared_prefix_len);
  a.index_view("block_table", in.block_table);
  a.view("query_padding_size", in.query_padding_size);
  a.view("kv_padding_size", in.kv_padding_size);
  a.view("learnable_sink", in.learnable_sink);
  a.view("query_rope", in.query_rope);
  a.view("key_rope", in.key_rope);
  a.view("key_rope_antiquant_scale", in.key_rope_antiquant_scale);
  a.view("dequant_scale_query", in.dequant_scale_query);
}

template <class T, class TKV>
py::object fia_t(const FIA& p, Args& a, const ExecConfig& x) {
  FusedInferAttentionScoreInputs<T, TKV> in;
  fia_inputs(a, in);
  const std::vector<Index> q = extents(a, "query");
  const Index n = Index(p.num_heads), kvn = kv_heads(p.num_heads, p.num_key_value_heads);
  const Index dv = value_head(p.input_layout, shape_of(first_array(a, "value")),
                              a.has("block_table"), kvn, q.empty() ? 0 : q.back());
  FusedInferAttentionScoreOutputs<T> out;
  py::object o = a.output("attention_out", out.attention_out, out_shape(p.input_layout, q, n, dv));
  py::object lse;
  if (p.softmax_lse_flag) {
    lse = a.output("softmax_lse", out.softmax_lse, lse_shape(p.input_layout, q, n));
  } else {  // neither checked nor written: returned as given, or empty (op-plugin's [0])
    a.take("softmax_lse");
    lse = a.has("softmax_lse") ? a.get("softmax_lse") : py::object(new_array<float>({0}));
  }
  a.finish();
  {
    py::gil_scoped_release unlocked;
    fused_infer_attention_score(p, in, out, x);
  }
  return py::make_tuple(o, lse);
}

py::object fia_py(const FIA& p, py::dict kw, const ExecConfig& x) {
  mask_as_u8("fused_infer_attention_score", kw);
  as_list(kw, "key");
  as_list(kw, "value");
  Args a("fused_infer_attention_score", kw);
  return with_q_kv(a, [&](auto t, auto kv) {
    return fia_t<typename decltype(t)::type, typename decltype(kv)::type>(p, a, x);
  });
}

}  // namespace

void bind_cann(py::module_& m) {
  bind_cann_params(m);
  m.def("_prompt_flash_attention", &pfa_py);
  m.def("_incre_flash_attention", &ifa_py);
  m.def("_fused_infer_attention_score", &fia_py);
}

}  // namespace attnref::python
