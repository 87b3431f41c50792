/// NSA operators for Python: nsa_compress, nsa_compress_with_cache, nsa_update_compressed_cache,
/// nsa_compress_attention_infer, nsa_selected_attention_infer, nsa_sliding_window_attention,
/// nsa_gated_sum, nsa_decode_step (see atb.cpp for the pattern). Every operator takes float16,
/// bfloat16 (the vendor's types) and float32 (attnref's extension).

#include <algorithm>
#include <attnref/nsa/compress.hpp>
#include <attnref/nsa/compress_attention.hpp>
#include <attnref/nsa/compress_with_cache.hpp>
#include <attnref/nsa/decode_step.hpp>
#include <attnref/nsa/importance.hpp>
#include <attnref/nsa/select_attention.hpp>
#include <cctype>

#include "bind.hpp"

namespace attnref::python {

namespace {

using CP = NsaCompressParams;
using CWP = NsaCompressWithCacheParams;
using CAP = NsaCompressAttentionInferParams;
using SAP = NsaSelectedAttentionInferParams;
using DP = NsaDecodeParams;

// ---- Params -------------------------------------------------------------------------------------

void bind_compress_params(py::module_& m) {
  ParamsBinder<CP> b(m, "NsaCompressParams", "aclnnNsaCompress's attributes, field for field");
  b.field("compress_block_size", &CP::compress_block_size)
      .field("compress_stride", &CP::compress_stride)
      .field("layout", &CP::layout)
      .field("act_seq_len_type", &CP::act_seq_len_type)
      .field("strict", &CP::strict);
  b.finish();
  ParamsBinder<CWP> c(m, "NsaCompressWithCacheParams",
                      "aclnnNsaCompressWithCache's attributes, field for field");
  c.field("compress_block_size", &CWP::compress_block_size)
      .field("compress_stride", &CWP::compress_stride)
      .field("act_seq_len_type", &CWP::act_seq_len_type)
      .field("page_block_size", &CWP::page_block_size)
      .field("layout", &CWP::layout)
      .field("strict", &CWP::strict);
  c.finish();
}

void bind_attention_params(py::module_& m) {
  ParamsBinder<CAP> b(m, "NsaCompressAttentionInferParams",
                      "aclnnNsaCompressAttentionInfer's attributes, field for field");
  b.field("num_heads", &CAP::num_heads)
      .field("num_key_value_heads", &CAP::num_key_value_heads)
      .field("select_block_size", &CAP::select_block_size)
      .field("select_block_count", &CAP::select_block_count)
      .field("compress_block_size", &CAP::compress_block_size)
      .field("compress_block_stride", &CAP::compress_block_stride)
      .field("scale_value", &CAP::scale_value)
      .field("layout", &CAP::layout)
      .field("page_block_size", &CAP::page_block_size)
      .field("sparse_mode", &CAP::sparse_mode)
      .field("strict", &CAP::strict);
  b.finish();
  ParamsBinder<SAP> s(m, "NsaSelectedAttentionInferParams",
                      "aclnnNsaSelectedAttentionInfer's attributes, field for field");
  s.field("num_heads", &SAP::num_heads)
      .field("num_key_value_heads", &SAP::num_key_value_heads)
      .field("select_block_size", &SAP::select_block_size)
      .field("select_block_count", &SAP::select_block_count)
      .field("page_block_size", &SAP::page_block_size)
      .field("scale_value", &SAP::scale_value)
      .field("layout", &SAP::layout)
      .field("sparse_mode", &SAP::sparse_mode)
      .field("strict", &SAP::strict);
  s.finish();
  ParamsBinder<DP> d(m, "NsaDecodeParams",
                     "One NSA decode step (nsa_decode_step, its window branch and "
                     "nsa_update_compressed_cache)");
  d.field("num_heads", &DP::num_heads)
      .field("num_key_value_heads", &DP::num_key_value_heads)
      .field("compress_block_size", &DP::compress_block_size)
      .field("compress_block_stride", &DP::compress_block_stride)
      .field("select_block_size", &DP::select_block_size)
      .field("select_block_count", &DP::select_block_count)
      .field("window_size", &DP::window_size)
      .field("page_block_size", &DP::page_block_size)
      .field("cmp_page_block_size", &DP::cmp_page_block_size)
      .field("scale_value", &DP::scale_value)
      .field("layout", &DP::layout)
      .field("strict", &DP::strict);
  d.finish();
}

// ---- Shapes of the allocated outputs (the operators check them) ---------------------------------

/// `shape` with its last extent replaced by `last` (and, when heads >= 0, the one before by
/// `heads`); extents never negative, so that a bad parameter reaches the operator's check.
std::vector<Index> with_tail(std::vector<Index> shape, Index last, Index heads = -1) {
  if (shape.empty()) shape.push_back(0);
  shape.back() = std::max<Index>(0, last);
  if (heads >= 0 && shape.size() >= 2) shape[shape.size() - 2] = heads;
  return shape;
}

/// Dv of a value cache [.., KV_N·Dv] (or [.., KV_N, Dv] when 4-d).
Index value_head_size(const Args& a, const char* name, std::int64_t kv_heads) {
  if (!a.has(name)) return 0;
  const std::vector<Index> v = extents(a, name);
  if (v.size() == 4) return v.back();
  return v.back() / std::max<std::int64_t>(1, kv_heads);
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// ---- nsa_compress, nsa_compress_with_cache, nsa_update_compressed_cache -------------------------

template <class T>
py::object compress_t(const CP& p, Args& a) {
  StridedView<const T> input, weight;
  std::vector<std::int64_t> act_seq_len;
  a.view("input", input);
  a.view("weight", weight);
  a.ints("act_seq_len", act_seq_len);
  const std::vector<Index> x = extents(a, "input");
  Index total = 0, prev = 0;
  if (p.compress_stride >= 1 && p.compress_block_size >= p.compress_stride)
    for (std::int64_t c : act_seq_len)
      total += nsa_compressed_count(c - prev, p.compress_block_size, p.compress_stride), prev = c;
  std::vector<Index> shape = x;
  shape[0] = total;
  StridedView<T> output;
  py::object result = a.output("output", output, shape);
  a.finish();
  py::gil_scoped_release unlocked;
  nsa_compress<T>(p, input, weight, act_seq_len, output);
  return result;
}

template <class T>
py::object compress_with_cache_t(const CWP& p, Args& a, const ExecConfig& x) {
  NsaCompressWithCacheInputs<T> in;
  a.view("input", in.input);
  a.view("weight", in.weight);
  a.index_view("slot_mapping", in.slot_mapping);
  a.ints("act_seq_len", in.act_seq_len);
  a.index_view("block_table", in.block_table);
  NsaCompressWithCacheOutputs<T> out;
  py::object result = a.array("output_cache");  // written in place: required
  a.view("output_cache", out.output_cache);
  a.finish();
  py::gil_scoped_release unlocked;
  nsa_compress_with_cache(p, in, out, x);
  return result;
}

template <class T>
void update_compressed_cache_t(const DP& p, Args& a, const ExecConfig& x) {
  NsaCacheUpdateInputs<T> in;
  a.view("key", in.key);
  a.view("value", in.value);
  a.index_view("block_table", in.block_table);
  a.view("key_weight", in.key_weight);
  a.view("value_weight", in.value_weight);
  a.index_view("cmp_block_table", in.cmp_block_table);
  a.ints("actual_sel_kv_seq_len", in.actual_sel_kv_seq_len);
  a.ints("actual_new_kv_len", in.actual_new_kv_len);
  NsaCacheUpdateOutputs<T> out;
  (void)a.array("cmp_key"),
      (void)a.array("cmp_value");  // written in place: required
  a.view("cmp_key", out.cmp_key);
  a.view("cmp_value", out.cmp_value);
  a.finish();
  py::gil_scoped_release unlocked;
  nsa_update_compressed_cache(p, in, out, x);
}

// ---- nsa_compress_attention_infer, nsa_selected_attention_infer ---------------------------------

template <class T>
py::object compress_attention_t(const CAP& p, Args& a, const ExecConfig& x) {
  NsaCompressAttentionInferInputs<T> in;
  a.view("query", in.query);
  a.view("key", in.key);
  a.view("value", in.value);
  a.view("atten_mask", in.atten_mask);
  a.index_view("block_table", in.block_table);
  a.ints("actual_q_seq_len", in.actual_q_seq_len);
  a.ints("actual_cmp_kv_seq_len", in.actual_cmp_kv_seq_len);
  a.ints("actual_sel_kv_seq_len", in.actual_sel_kv_seq_len);
  const std::vector<Index> q = extents(a, "query");
  const Index kvn = std::max<Index>(1, p.num_key_value_heads);
  NsaCompressAttentionInferOutputs<T> out;
  py::object o = a.output("output", out.output,
                          with_tail(q, value_head_size(a, "value", p.num_key_value_heads)));
  py::object t = a.output("topk", out.topk, with_tail(q, p.select_block_count, kvn));
  a.view("probs", out.probs);
  a.view("head_scores", out.head_scores);
  a.view("group_scores", out.group_scores);
  a.finish();
  {
    py::gil_scoped_release unlocked;
    nsa_compress_attention_infer(p, in, out, x);
  }
  return py::make_tuple(o, t);
}

template <class T>
py::object selected_attention_t(const SAP& p, Args& a, const ExecConfig& x) {
  NsaSelectedAttentionInferInputs<T> in;
  a.view("query", in.query);
  a.view("key", in.key);
  a.view("value", in.value);
  a.index_view("topk_indices", in.topk_indices);
  a.index_view("block_table", in.block_table);
  a.ints("actual_q_seq_len", in.actual_q_seq_len);
  a.ints("actual_sel_kv_seq_len", in.actual_sel_kv_seq_len);
  const Index dv = value_head_size(a, "value", p.num_key_value_heads);
  const Index last = upper(p.layout) == "BSH" ? std::max<Index>(0, p.num_heads) * dv : dv;
  NsaSelectedAttentionInferOutputs<T> out;
  py::object result = a.output("output", out.output, with_tail(extents(a, "query"), last));
  a.finish();
  py::gil_scoped_release unlocked;
  nsa_selected_attention_infer(p, in, out, x);
  return result;
}

// ---- nsa_sliding_window_attention, nsa_decode_step, nsa_gated_sum -------------------------------

template <class T>
void decode_inputs(Args& a, NsaDecodeInputs<T>& in) {
  a.view("query", in.query);
  a.view("key", in.key);
  a.view("value", in.value);
  a.index_view("block_table", in.block_table);
  a.view("cmp_key", in.cmp_key);
  a.view("cmp_value", in.cmp_value);
  a.index_view("cmp_block_table", in.cmp_block_table);
  a.view("gates", in.gates);
  a.ints("actual_q_seq_len", in.actual_q_seq_len);
  a.ints("actual_sel_kv_seq_len", in.actual_sel_kv_seq_len);
}

template <class T>
py::object sliding_window_t(const DP& p, Args& a, const ExecConfig& x) {
  NsaDecodeInputs<T> in;
  decode_inputs(a, in);
  NsaSlidingWindowAttentionOutputs<T> out;
  py::object result =
      a.output("output", out.output,
               with_tail(extents(a, "query"), value_head_size(a, "value", p.num_key_value_heads)));
  a.finish();
  py::gil_scoped_release unlocked;
  nsa_sliding_window_attention(p, in, out, x);
  return result;
}

template <class T>
py::object decode_step_t(const DP& p, Args& a, const ExecConfig& x) {
  NsaDecodeInputs<T> in;
  decode_inputs(a, in);
  NsaDecodeOutputs<T> out;
  py::object result =
      a.output("output", out.output,
               with_tail(extents(a, "query"), value_head_size(a, "value", p.num_key_value_heads)));
  a.view("topk", out.topk);
  a.view("cmp_out", out.cmp_out);
  a.view("sel_out", out.sel_out);
  a.view("win_out", out.win_out);
  a.finish();
  py::gil_scoped_release unlocked;
  nsa_decode_step(p, in, out, x);
  return result;
}

template <class T>
py::object gated_sum_t(Args& a) {
  StridedView<const float> gates;
  StridedView<const T> o_cmp, o_sel, o_win;
  a.view("gates", gates);
  a.view("o_cmp", o_cmp);
  a.view("o_sel", o_sel);
  a.view("o_win", o_win);
  StridedView<T> out;
  py::object result = a.output("out", out, extents(a, "o_cmp"));
  a.finish();
  py::gil_scoped_release unlocked;
  nsa_gated_sum<T>(gates, o_cmp, o_sel, o_win, out);
  return result;
}

/// Runs f(Tag<T>{}, args) with T the float type of the array `arg` (required).
template <class F>
py::object dispatch(const char* op, const char* arg, const py::dict& kw, F&& f) {
  Args a(op, kw);
  if (!a.has(arg)) (void)a.array(arg);  // TypeError: required
  return with_float(a.op(), arg, a.dtype(arg), [&](auto t) -> py::object { return f(t, a); });
}

template <class Tag>
using T_of = typename Tag::type;

py::object nsa_compress_py(const CP& p, const py::dict& kw, const ExecConfig&) {
  return dispatch("nsa_compress", "input", kw,
                  [&](auto t, Args& a) { return compress_t<T_of<decltype(t)>>(p, a); });
}

py::object nsa_compress_with_cache_py(const CWP& p, const py::dict& kw, const ExecConfig& x) {
  return dispatch("nsa_compress_with_cache", "input", kw, [&](auto t, Args& a) {
    return compress_with_cache_t<T_of<decltype(t)>>(p, a, x);
  });
}

py::object nsa_update_compressed_cache_py(const DP& p, const py::dict& kw, const ExecConfig& x) {
  return dispatch("nsa_update_compressed_cache", "key", kw, [&](auto t, Args& a) {
    update_compressed_cache_t<T_of<decltype(t)>>(p, a, x);
    return py::object(py::none());
  });
}

py::object nsa_compress_attention_infer_py(const CAP& p, const py::dict& kw, const ExecConfig& x) {
  return dispatch("nsa_compress_attention_infer", "query", kw, [&](auto t, Args& a) {
    return compress_attention_t<T_of<decltype(t)>>(p, a, x);
  });
}

py::object nsa_selected_attention_infer_py(const SAP& p, const py::dict& kw, const ExecConfig& x) {
  return dispatch("nsa_selected_attention_infer", "query", kw, [&](auto t, Args& a) {
    return selected_attention_t<T_of<decltype(t)>>(p, a, x);
  });
}

py::object nsa_sliding_window_attention_py(const DP& p, const py::dict& kw, const ExecConfig& x) {
  return dispatch("nsa_sliding_window_attention", "query", kw,
                  [&](auto t, Args& a) { return sliding_window_t<T_of<decltype(t)>>(p, a, x); });
}

py::object nsa_decode_step_py(const DP& p, const py::dict& kw, const ExecConfig& x) {
  return dispatch("nsa_decode_step", "query", kw,
                  [&](auto t, Args& a) { return decode_step_t<T_of<decltype(t)>>(p, a, x); });
}

py::object nsa_gated_sum_py(const py::dict& kw) {
  return dispatch("nsa_gated_sum", "o_cmp", kw,
                  [&](auto t, Args& a) { return gated_sum_t<T_of<decltype(t)>>(a); });
}

}  // namespace

void bind_nsa(py::module_& m) {
  bind_compress_params(m);
  bind_attention_params(m);
  m.def("_nsa_compress", &nsa_compress_py);
  m.def("_nsa_compress_with_cache", &nsa_compress_with_cache_py);
  m.def("_nsa_update_compressed_cache", &nsa_update_compressed_cache_py);
  m.def("_nsa_compress_attention_infer", &nsa_compress_attention_infer_py);
  m.def("_nsa_selected_attention_infer", &nsa_selected_attention_infer_py);
  m.def("_nsa_sliding_window_attention", &nsa_sliding_window_attention_py);
  m.def("_nsa_decode_step", &nsa_decode_step_py);
  m.def("_nsa_gated_sum", &nsa_gated_sum_py);
  m.def(
      "nsa_compressed_count",
      [](Index len, Index l, Index d) {
        if (d < 1) throw py::value_error("attnref.nsa_compressed_count: d must be >= 1");
        return nsa_compressed_count(len, l, d);
      },
      py::arg("len"), py::arg("compress_block_size"), py::arg("compress_stride"),
      "Compressed tokens of `len` raw tokens: floor((len - l) / d) + 1, 0 when "
      "len < l.");
  m.def(
      "nsa_select_block_count",
      [](Index cmp_len, Index l, Index d, Index ls) {
        if (ls < 1) throw py::value_error("attnref.nsa_select_block_count: l' must be >= 1");
        return nsa_select_block_count(cmp_len, l, d, ls);
      },
      py::arg("cmp_len"), py::arg("compress_block_size"), py::arg("compress_block_stride"),
      py::arg("select_block_size"),
      "Select blocks of cmp_len compressed keys: ceil(((cmp_len - 1) d + l) / "
      "l'), 0 without keys.");
}

}  // namespace attnref::python
