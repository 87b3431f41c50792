/// DSA operators for Python: lightning_indexer, quant_lightning_indexer, sparse_flash_attention,
/// kv_quant_sparse_flash_attention and dsa_step (DeepSeek-V3.2's sparse attention).
///
/// Element types: the query's (float16, bfloat16; float32 as attnref's extension where the C++
/// operator takes it); the indexer weights are the query's type or float32.

#include <algorithm>
#include <attnref/dsa/kv_quant_sparse_flash_attention.hpp>
#include <attnref/dsa/lightning_indexer.hpp>
#include <attnref/dsa/quant_lightning_indexer.hpp>
#include <attnref/dsa/sparse_flash_attention.hpp>
#include <attnref/dsa/step.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "bind.hpp"

namespace attnref::python {

namespace {

using LIP = LightningIndexerParams;
using QLIP = QuantLightningIndexerParams;
using SFAP = SparseFlashAttentionParams;
using KVQP = KvQuantSparseFlashAttentionParams;
using STEP = DsaStepParams;

void bind_indexer_params(py::module_& m) {
  ParamsBinder<LIP> li(m, "LightningIndexerParams", "aclnnLightningIndexer's attributes");
  li.field("layout_query", &LIP::layout_query)
      .field("layout_key", &LIP::layout_key)
      .field("sparse_count", &LIP::sparse_count)
      .field("sparse_mode", &LIP::sparse_mode)
      .field("pre_tokens", &LIP::pre_tokens)
      .field("next_tokens", &LIP::next_tokens)
      .field("return_value", &LIP::return_value)
      .field("strict", &LIP::strict);
  li.finish();
  ParamsBinder<QLIP> q(m, "QuantLightningIndexerParams", "aclnnQuantLightningIndexer's attributes");
  q.field("query_quant_mode", &QLIP::query_quant_mode)
      .field("key_quant_mode", &QLIP::key_quant_mode)
      .field("layout_query", &QLIP::layout_query)
      .field("layout_key", &QLIP::layout_key)
      .field("sparse_count", &QLIP::sparse_count)
      .field("sparse_mode", &QLIP::sparse_mode)
      .field("pre_tokens", &QLIP::pre_tokens)
      .field("next_tokens", &QLIP::next_tokens)
      .field("strict", &QLIP::strict);
  q.finish();
}

void bind_attention_params(py::module_& m) {
  ParamsBinder<SFAP> s(m, "SparseFlashAttentionParams", "aclnnSparseFlashAttention's attributes");
  s.field("scale_value", &SFAP::scale_value)
      .field("sparse_block_size", &SFAP::sparse_block_size)
      .field("layout_query", &SFAP::layout_query)
      .field("layout_kv", &SFAP::layout_kv)
      .field("sparse_mode", &SFAP::sparse_mode)
      .field("pre_tokens", &SFAP::pre_tokens)
      .field("next_tokens", &SFAP::next_tokens)
      .field("attention_mode", &SFAP::attention_mode)
      .field("return_softmax_lse", &SFAP::return_softmax_lse)
      .field("strict", &SFAP::strict);
  s.finish();
  ParamsBinder<KVQP> k(m, "KvQuantSparseFlashAttentionParams",
                       "aclnnKvQuantSparseFlashAttention's attributes");
  k.field("scale_value", &KVQP::scale_value)
      .field("key_quant_mode", &KVQP::key_quant_mode)
      .field("value_quant_mode", &KVQP::value_quant_mode)
      .field("sparse_block_size", &KVQP::sparse_block_size)
      .field("layout_query", &KVQP::layout_query)
      .field("layout_kv", &KVQP::layout_kv)
      .field("sparse_mode", &KVQP::sparse_mode)
      .field("pre_tokens", &KVQP::pre_tokens)
      .field("next_tokens", &KVQP::next_tokens)
      .field("attention_mode", &KVQP::attention_mode)
      .field("quant_scale_repo_mode", &KVQP::quant_scale_repo_mode)
      .field("tile_size", &KVQP::tile_size)
      .field("rope_head_dim", &KVQP::rope_head_dim)
      .field("strict", &KVQP::strict);
  k.finish();
  ParamsBinder<STEP> d(m, "DsaStepParams", "attnref::DsaStepParams: one DSA step's settings");
  d.field("layout_query", &STEP::layout_query)
      .field("layout_kv", &STEP::layout_kv)
      .field("sparse_count", &STEP::sparse_count)
      .field("sparse_mode", &STEP::sparse_mode)
      .field("scale_value", &STEP::scale_value)
      .field("strict", &STEP::strict);
  d.finish();
}

/// The indices' shape: `q`'s with [-2] = the key heads, [-1] = count.
std::vector<Index> indices_shape(const Args& a, const char* q, const char* key, Index count) {
  if (count < 1 || count > (Index{1} << 24)) count = 0;  // rejected by the operator
  std::vector<Index> shape = extents(a, q);
  const auto k = a.has(key) ? extents(a, key) : std::vector<Index>{};
  if (shape.size() >= 2) {
    shape[shape.size() - 2] = k.size() >= 2 ? k[k.size() - 2] : 1;
    shape.back() = count;
  }
  return allocatable_shape(shape);
}

/// Calls f(Tag<T>{}, Tag<TW>{}) for the query's type T and the weights' TW (T or float).
template <class F>
py::object with_indexer_types(const Args& a, const char* q, F&& f) {
  const bool wf = a.dtype("weights") == Dtype::f32;
  return with_float(a.op(), q, a.dtype(q), [&](auto t) {
    using T = typename decltype(t)::type;
    if constexpr (std::is_same_v<T, float>)
      return f(t, t);
    else
      return wf ? f(t, Tag<float>{}) : f(t, t);
  });
}

// ---- the indexers ------------------------------------------------------------------------

template <class T, class TW>
py::object lightning_indexer_t(const LIP& p, Args& a, const ExecConfig& x) {
  LightningIndexerInputs<T, TW> in;
  a.view("query", in.query);
  a.view("key", in.key);
  a.view("weights", in.weights);
  a.index_view("block_table", in.block_table);
  a.ints("actual_seq_lengths_query", in.actual_seq_lengths_query);
  a.ints("actual_seq_lengths_key", in.actual_seq_lengths_key);
  const auto shape = indices_shape(a, "query", "key", static_cast<Index>(p.sparse_count));
  LightningIndexerOutputs<T> out;
  py::object idx = a.output("sparse_indices", out.sparse_indices, shape);
  py::object val = py::none();
  if (p.return_value)
    val = a.output("sparse_values", out.sparse_values, shape);
  else
    a.view("sparse_values", out.sparse_values);
  a.finish();
  {
    py::gil_scoped_release unlocked;
    lightning_indexer(p, in, out, x);
  }
  return py::make_tuple(idx, val);
}

py::object lightning_indexer_py(const LIP& p, const py::dict& kw, const ExecConfig& x) {
  Args a("lightning_indexer", kw);
  return with_indexer_types(a, "query", [&](auto t, auto w) {
    return lightning_indexer_t<typename decltype(t)::type, typename decltype(w)::type>(p, a, x);
  });
}

py::object quant_lightning_indexer_py(const QLIP& p, const py::dict& kw, const ExecConfig& x) {
  Args a("quant_lightning_indexer", kw);
  QuantLightningIndexerInputs in;
  a.view("query", in.query);
  a.view("key", in.key);
  a.view("weights", in.weights);
  a.view("query_dequant_scale", in.query_dequant_scale);
  a.view("key_dequant_scale", in.key_dequant_scale);
  a.index_view("block_table", in.block_table);
  a.ints("actual_seq_lengths_query", in.actual_seq_lengths_query);
  a.ints("actual_seq_lengths_key", in.actual_seq_lengths_key);
  const auto shape = indices_shape(a, "query", "key", static_cast<Index>(p.sparse_count));
  QuantLightningIndexerOutputs out;
  py::object idx = a.output("sparse_indices", out.sparse_indices, shape);
  a.finish();
  py::gil_scoped_release unlocked;
  quant_lightning_indexer(p, in, out, x);
  return idx;
}

// ---- the sparse attentions ---------------------------------------------------------------

template <class T>
py::object sparse_flash_attention_t(const SFAP& p, Args& a, const ExecConfig& x) {
  SparseFlashAttentionInputs<T> in;
  a.view("query", in.query);
  a.view("key", in.key);
  a.view("value", in.value);
  a.view("query_rope", in.query_rope);
  a.view("key_rope", in.key_rope);
  a.index_view("sparse_indices", in.sparse_indices);
  a.index_view("block_table", in.block_table);
  a.ints("actual_seq_lengths_query", in.actual_seq_lengths_query);
  a.ints("actual_seq_lengths_kv", in.actual_seq_lengths_kv);
  SparseFlashAttentionOutputs<T> out;
  py::object result = a.output("attention_out", out.attention_out, extents(a, "query"));
  a.finish();
  py::gil_scoped_release unlocked;
  sparse_flash_attention(p, in, out, x);
  return result;
}

py::object sparse_flash_attention_py(const SFAP& p, const py::dict& kw, const ExecConfig& x) {
  Args a("sparse_flash_attention", kw);
  return with_float(a.op(), "query", a.dtype("query"), [&](auto t) {
    return sparse_flash_attention_t<typename decltype(t)::type>(p, a, x);
  });
}

template <class T>
py::object kv_quant_sparse_flash_attention_t(const KVQP& p, Args& a, const ExecConfig& x) {
  KvQuantSparseFlashAttentionInputs<T> in;
  a.view("query", in.query);
  a.view("key", in.key);
  a.view("value", in.value);
  a.view("key_dequant_scale", in.key_dequant_scale);
  a.view("value_dequant_scale", in.value_dequant_scale);
  a.index_view("sparse_indices", in.sparse_indices);
  a.index_view("block_table", in.block_table);
  a.ints("actual_seq_lengths_query", in.actual_seq_lengths_query);
  a.ints("actual_seq_lengths_kv", in.actual_seq_lengths_kv);
  std::vector<Index> shape = extents(a, "query");
  const Index rope = static_cast<Index>(p.rope_head_dim);  // out of range: rejected by the operator
  if (!shape.empty()) shape.back() = rope > 0 && rope < shape.back() ? shape.back() - rope : 0;
  KvQuantSparseFlashAttentionOutputs<T> out;
  py::object result = a.output("attention_out", out.attention_out, allocatable_shape(shape));
  a.finish();
  py::gil_scoped_release unlocked;
  kv_quant_sparse_flash_attention(p, in, out, x);
  return result;
}

py::object kv_quant_sparse_flash_attention_py(const KVQP& p, const py::dict& kw,
                                              const ExecConfig& x) {
  Args a("kv_quant_sparse_flash_attention", kw);
  return with_half(a.op(), "query", a.dtype("query"), [&](auto t) {
    return kv_quant_sparse_flash_attention_t<typename decltype(t)::type>(p, a, x);
  });
}

// ---- dsa_step ----------------------------------------------------------------------------

template <class T, class TW>
py::object dsa_step_t(const STEP& p, Args& a, const ExecConfig& x) {
  DsaStepInputs<T, TW> in;
  a.view("index_query", in.index_query);
  a.view("weights", in.weights);
  a.view("index_key", in.index_key);
  a.view("query", in.query);
  a.view("query_rope", in.query_rope);
  a.view("key", in.key);
  a.view("key_rope", in.key_rope);
  a.index_view("block_table", in.block_table);
  a.ints("actual_seq_lengths_query", in.actual_seq_lengths_query);
  a.ints("actual_seq_lengths_kv", in.actual_seq_lengths_kv);
  DsaStepOutputs<T> out;
  py::object o = a.output("output", out.output, extents(a, "query"));
  std::vector<Index> shape = extents(a, "query");
  const bool count_ok = p.sparse_count >= 1 && p.sparse_count <= (std::int64_t{1} << 24);
  if (shape.size() >= 2) shape[shape.size() - 2] = 1, shape.back() = count_ok ? p.sparse_count : 0;
  py::object idx = a.output("sparse_indices", out.sparse_indices, allocatable_shape(shape));
  a.finish();
  {
    py::gil_scoped_release unlocked;
    dsa_step(p, in, out, x);
  }
  return py::make_tuple(o, idx);
}

py::object dsa_step_py(const STEP& p, const py::dict& kw, const ExecConfig& x) {
  Args a("dsa_step", kw);
  return with_indexer_types(a, "query", [&](auto t, auto w) {
    return dsa_step_t<typename decltype(t)::type, typename decltype(w)::type>(p, a, x);
  });
}

}  // namespace

void bind_dsa(py::module_& m) {
  bind_indexer_params(m);
  bind_attention_params(m);
  m.def("_lightning_indexer", &lightning_indexer_py);
  m.def("_quant_lightning_indexer", &quant_lightning_indexer_py);
  m.def("_sparse_flash_attention", &sparse_flash_attention_py);
  m.def("_kv_quant_sparse_flash_attention", &kv_quant_sparse_flash_attention_py);
  m.def("_dsa_step", &dsa_step_py);
}

}  // namespace attnref::python
