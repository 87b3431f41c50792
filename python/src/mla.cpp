/// MLA operators for Python: MlaPreprocess, its public stages (rms_norm, rms_norm_quant,
/// int8_matmul, float_matmul, rope_rotate_half, q_nope_absorb, mla_reshape_and_cache) and the
/// latent decode attention (mla_decode, mla_decode_unabsorbed).
///
/// Weights: a WeightRef's format follows the array's rank (3-D: NZ; 2-D: [out, in], or [in, out]
/// when params.transpose_wdq / transpose_wuq is false, or the stages' w_format); a 4-D wuk is NZ.
/// Scalars of the stages (epsilon, mode, heads, rotary_coeff, w_format, dtype) arrive as plain
/// Python values in the keyword dict.

#include <algorithm>
#include <attnref/mla/mla_attention.hpp>
#include <attnref/mla/mla_preprocess.hpp>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "bind.hpp"

namespace attnref::python {

namespace {

using MP = MlaPreprocessParams;

void bind_mla_params(py::module_& m) {
  bind_enum<MlaQuantMode>(m, "MlaQuantMode",
                          {{"PerTensorAsymm", MlaQuantMode::PerTensorAsymm},
                           {"PerTokenSymm", MlaQuantMode::PerTokenSymm},
                           {"PerTokenAsymm", MlaQuantMode::PerTokenAsymm},
                           {"Unquant", MlaQuantMode::Unquant}});
  bind_enum<MlaCacheMode>(m, "MlaCacheMode",
                          {{"KvCache", MlaCacheMode::KvCache},
                           {"KRopeCtkv", MlaCacheMode::KRopeCtkv},
                           {"Int8NzCache", MlaCacheMode::Int8NzCache},
                           {"NzCache", MlaCacheMode::NzCache}});
  bind_enum<WeightFormat>(m, "WeightFormat",
                          {{"NdOutIn", WeightFormat::NdOutIn},
                           {"NdInOut", WeightFormat::NdInOut},
                           {"Nz", WeightFormat::Nz}});
  ParamsBinder<MlaDims> d(m, "MlaDims", "attnref::MlaDims: the MLA model dimensions");
  d.field("hidden_size", &MlaDims::hidden_size)
      .field("kv_lora_rank", &MlaDims::kv_lora_rank)
      .field("rope_dim", &MlaDims::rope_dim)
      .field("q_lora_rank", &MlaDims::q_lora_rank)
      .field("nope_dim", &MlaDims::nope_dim);
  d.finish();
  ParamsBinder<MP> b(m, "MlaPreprocessParams", "atb::infer::MlaPreprocessParam, field for field");
  b.field("dims", &MP::dims)
      .field("wdq_dim", &MP::wdq_dim)
      .field("q_rope_dim", &MP::q_rope_dim)
      .field("k_rope_dim", &MP::k_rope_dim)
      .field("epsilon", &MP::epsilon)
      .field("q_rotary_coeff", &MP::q_rotary_coeff)
      .field("k_rotary_coeff", &MP::k_rotary_coeff)
      .field("transpose_wdq", &MP::transpose_wdq)
      .field("transpose_wuq", &MP::transpose_wuq)
      .field("transpose_wuk", &MP::transpose_wuk)
      .field("cache_mode", &MP::cache_mode)
      .field("quant_mode", &MP::quant_mode);
  b.finish();
}

// ---- scalars -----------------------------------------------------------------------------

/// The plain Python value `name` as V (`fallback` when absent); TypeError naming it otherwise.
template <class V>
V scalar(Args& a, const char* name, V fallback) {
  a.take(name);
  py::object o = a.get(name);
  if (o.is_none()) return fallback;
  if constexpr (std::is_enum_v<V>) {
    if (py::isinstance<V>(o)) return o.cast<V>();
    if (!py::isinstance<py::int_>(o)) type_error(a.op(), name, "must be its enum or an int");
  }
  using C = std::conditional_t<std::is_enum_v<V>, long long, V>;
  C v{};
  try {
    v = o.cast<C>();
  } catch (const py::cast_error&) {
    if (py::isinstance<py::int_>(o)) value_error(a.op(), name, "is out of range");
    type_error(
        a.op(), name,
        std::string(std::is_floating_point_v<C> ? "must be a number" : "must be an integer") +
            ", got " + std::string(py::str(o.get_type().attr("__name__"))));
  }
  if constexpr (std::is_enum_v<V>) {
    using U = std::underlying_type_t<V>;
    if (v < static_cast<C>(std::numeric_limits<U>::min()) ||
        v > static_cast<C>(std::numeric_limits<U>::max()))
      value_error(a.op(), name, "is out of range: " + std::to_string(v));
  }
  return static_cast<V>(v);
}

/// The weight `name` with logical shape [out, in]: 3-D is NZ, 2-D [out, in] (or [in, out]).
template <class W>
void weight(Args& a, const char* name, WeightRef<W>& w, Index out, Index in, bool out_in) {
  a.view(name, w.tensor);
  w.out = out;
  w.in = in;
  if (w.tensor.rank() == 3)
    w.format = WeightFormat::Nz;
  else
    w.format = out_in ? WeightFormat::NdOutIn : WeightFormat::NdInOut;
}

/// A params dimension, or 0 outside [0, 2^31) (the operator rejects it; no overflow meanwhile).
Index dim(Index v) { return v >= 0 && v < (Index{1} << 31) ? v : Index{0}; }

/// The first extent of array `name` (0 when absent or 0-D).
Index first_extent(const Args& a, const char* name) {
  if (!a.has(name)) return 0;
  const auto e = extents(a, name);
  return e.empty() ? 0 : e[0];
}

// ---- MlaPreprocess -----------------------------------------------------------------------

template <class T>
void mla_pre_inputs(const MP& p, Args& a, MlaPreprocessInputs<T>& in) {
  const MlaDims& d = p.dims;
  const Index heads = first_extent(a, "wuk");
  const Index W1 = dim(d.kv_lora_rank) + dim(d.rope_dim) + dim(d.q_lora_rank);
  const Index W2 = heads * (dim(d.nope_dim) + dim(d.rope_dim));
  a.view("input", in.input);
  a.view("gamma0", in.gamma0);
  a.view("beta0", in.beta0);
  a.view("quant_scale0", in.quant_scale0);
  a.view("quant_offset0", in.quant_offset0);
  weight(a, "wdqkv", in.wdqkv, W1, d.hidden_size, p.transpose_wdq);
  weight(a, "wdqkv_float", in.wdqkv_float, W1, d.hidden_size, p.transpose_wdq);
  a.view("de_scale0", in.de_scale0);
  a.view("de_scale0_bits", in.de_scale0_bits);
  a.view("bias0", in.bias0);
  a.view("gamma1", in.gamma1);
  a.view("beta1", in.beta1);
  a.view("quant_scale1", in.quant_scale1);
  a.view("quant_offset1", in.quant_offset1);
  weight(a, "wuq", in.wuq, W2, d.q_lora_rank, p.transpose_wuq);
  weight(a, "wuq_float", in.wuq_float, W2, d.q_lora_rank, p.transpose_wuq);
  a.view("de_scale1", in.de_scale1);
  a.view("de_scale1_bits", in.de_scale1_bits);
  a.view("bias1", in.bias1);
  a.view("gamma2", in.gamma2);
  a.view("cos", in.cos);
  a.view("sin", in.sin);
  a.view("wuk", in.wuk.tensor);
  in.wuk.nz = in.wuk.tensor.rank() == 4;
  a.index_view("slot_mapping", in.slot_mapping);
  a.view("ctkv_scale", in.ctkv_scale);
  a.view("q_nope_scale", in.q_nope_scale);
}

template <class T>
py::object mla_preprocess_t(const MP& p, Args& a, const ExecConfig& x) {
  MlaPreprocessInputs<T> in;
  mla_pre_inputs(p, a, in);
  const Index N = first_extent(a, "input"), H = first_extent(a, "wuk");
  const Index C = dim(p.dims.kv_lora_rank), R = dim(p.dims.rope_dim);
  MlaPreprocessOutputs<T> out;
  py::object q = py::none(), q8 = py::none(), qr = py::none();
  const MlaCacheMode cm = p.cache_mode;
  if (cm == MlaCacheMode::KvCache)
    q = a.output("q_out", out.q_out, allocatable_shape({N, H, C + R}));
  else if (cm == MlaCacheMode::Int8NzCache)
    q8 = a.output("q_out_i8", out.q_out_i8, allocatable_shape({N, H, C}));
  else
    q = a.output("q_out", out.q_out, allocatable_shape({N, H, C}));
  if (cm != MlaCacheMode::KvCache)
    qr = a.output("q_rope_out", out.q_rope_out, allocatable_shape({N, H, R}));
  // The outputs another mode writes: rejected by the operator when given.
  if (q.is_none()) a.view("q_out", out.q_out);
  if (q8.is_none()) a.view("q_out_i8", out.q_out_i8);
  if (qr.is_none()) a.view("q_rope_out", out.q_rope_out);
  a.view("kv_cache", out.caches.kv_cache);
  a.view("ctkv", out.caches.ctkv);
  a.view("ctkv_i8", out.caches.ctkv_i8);
  a.view("krope", out.caches.krope);
  a.finish();
  {
    py::gil_scoped_release unlocked;
    mla_preprocess(p, in, out, x);
  }
  return py::make_tuple(q, q8, qr);
}

py::object mla_preprocess_py(const MP& p, const py::dict& kw, const ExecConfig& x) {
  Args a("mla_preprocess", kw);
  return with_half(a.op(), "input", a.dtype("input"),
                   [&](auto t) { return mla_preprocess_t<typename decltype(t)::type>(p, a, x); });
}

// ---- mla_reshape_and_cache ---------------------------------------------------------------

template <class T>
void mla_reshape_and_cache_t(Args& a) {
  const MlaCacheMode mode = scalar(a, "mode", MlaCacheMode::KvCache);
  StridedView<const T> k_nope, k_rope, quant_scale3;
  StridedView<const std::int32_t> slot_mapping;
  MlaCaches<T> caches;
  a.view("k_nope", k_nope);
  a.view("k_rope", k_rope);
  a.index_view("slot_mapping", slot_mapping);
  a.view("quant_scale3", quant_scale3);
  a.view("kv_cache", caches.kv_cache);
  a.view("ctkv", caches.ctkv);
  a.view("ctkv_i8", caches.ctkv_i8);
  a.view("krope", caches.krope);
  a.finish();
  py::gil_scoped_release unlocked;
  mla_reshape_and_cache(mode, k_nope, k_rope, slot_mapping, quant_scale3, caches);
}

void mla_reshape_and_cache_py(const py::dict& kw) {
  Args a("mla_reshape_and_cache", kw);
  with_half(a.op(), "k_nope", a.dtype("k_nope"),
            [&](auto t) { mla_reshape_and_cache_t<typename decltype(t)::type>(a); });
}

// ---- the stages --------------------------------------------------------------------------

template <class T>
py::object rms_norm_t(Args& a) {
  const float eps = scalar(a, "epsilon", 1e-5f);
  StridedView<const T> x, gamma;
  a.view("x", x);
  a.view("gamma", gamma);
  StridedView<T> out;
  py::object result = a.output("out", out, extents(a, "x"));
  a.finish();
  py::gil_scoped_release unlocked;
  rms_norm<T>(x, gamma, eps, out);
  return result;
}

template <class T>
py::object rms_norm_quant_t(Args& a) {
  const MlaQuantMode mode = scalar(a, "mode", MlaQuantMode::PerTensorAsymm);
  const float eps = scalar(a, "epsilon", 1e-5f);
  RmsNormQuantInputs<T> in;
  a.view("x", in.x);
  a.view("gamma", in.gamma);
  a.view("beta", in.beta);
  a.view("quant_scale", in.quant_scale);
  a.view("quant_offset", in.quant_offset);
  const std::vector<Index> shape = extents(a, "x");
  const std::vector<Index> rows{shape.empty() ? 0 : shape[0]};
  RmsNormQuantOutputs<T> out;
  py::object q = py::none(), ds = py::none(), zp = py::none(), uq = py::none();
  const bool per_token = mode == MlaQuantMode::PerTokenSymm || mode == MlaQuantMode::PerTokenAsymm;
  if (mode == MlaQuantMode::Unquant)
    uq = a.output("unquant", out.unquant, shape);
  else
    q = a.output("q", out.q, shape);
  if (per_token) ds = a.output("descale", out.descale, rows);
  if (mode == MlaQuantMode::PerTokenAsymm) zp = a.output("zero_point", out.zero_point, rows);
  if (uq.is_none()) a.view("unquant", out.unquant);
  if (q.is_none()) a.view("q", out.q);
  if (ds.is_none()) a.view("descale", out.descale);
  if (zp.is_none()) a.view("zero_point", out.zero_point);
  a.finish();
  {
    py::gil_scoped_release unlocked;
    rms_norm_quant<T>(mode, eps, in, out);
  }
  return py::make_tuple(q, ds, zp, uq);
}

/// The weight `w` of a stage ([out, in] logically; w_format, default NdOutIn); `n`: out.
template <class W>
void stage_weight(Args& a, WeightRef<W>& w, Index n, Index k) {
  const WeightFormat f = scalar(a, "w_format", WeightFormat::NdOutIn);
  a.view("w", w.tensor);
  w.out = n, w.in = k, w.format = f;
}

/// The output channels of the stage weight `w` (format f): out's last extent when given.
Index stage_channels(Args& a, WeightFormat f) {
  if (a.has("out")) return last_extent(a, "out");
  if (!a.has("w")) return 0;
  const auto e = extents(a, "w");
  if (e.size() < 2) return 0;
  return f == WeightFormat::NdInOut ? e[1] : f == WeightFormat::Nz ? e[1] : e[0];
}

template <class T>
py::object int8_matmul_t(Args& a, const ExecConfig& x) {
  Int8MatmulInputs in;
  a.view("a", in.a);
  a.view("bias", in.bias);
  a.view("de_scale", in.de_scale);
  a.view("de_scale_bits", in.de_scale_bits);
  a.view("token_scale", in.token_scale);
  a.view("zero_point", in.zero_point);
  const WeightFormat f = scalar(a, "w_format", WeightFormat::NdOutIn);
  Index n = !in.de_scale.absent()        ? in.de_scale.numel()
            : !in.de_scale_bits.absent() ? in.de_scale_bits.numel()
                                         : stage_channels(a, f);
  const Index m = first_extent(a, "a"), k = last_extent(a, "a");
  stage_weight(a, in.w, n, k);
  StridedView<T> out;
  py::object result = a.output("out", out, allocatable_shape({m, n}));
  a.take("dtype");
  a.finish();
  py::gil_scoped_release unlocked;
  int8_matmul<T>(in, out, x);
  return result;
}

/// The output type of int8_matmul: out's, else `dtype` ("float16", "bfloat16", "float32").
Dtype matmul_dtype(const Args& a) {
  if (a.has("out")) return a.dtype("out");
  if (!a.has("dtype")) return Dtype::f16;
  const std::string s = py::str(a.get("dtype"));
  if (s == "float16") return Dtype::f16;
  if (s == "bfloat16") return Dtype::bf16;
  if (s == "float32") return Dtype::f32;
  value_error(a.op(), "dtype", "must be float16, bfloat16 or float32, got " + s);
}

template <class T>
py::object float_matmul_t(Args& a, const ExecConfig& x) {
  StridedView<const T> lhs;
  a.view("a", lhs);
  const WeightFormat f = scalar(a, "w_format", WeightFormat::NdOutIn);
  const Index m = first_extent(a, "a"), k = last_extent(a, "a"), n = stage_channels(a, f);
  WeightRef<T> w;
  stage_weight(a, w, n, k);
  StridedView<T> out;
  py::object result = a.output("out", out, allocatable_shape({m, n}));
  a.finish();
  py::gil_scoped_release unlocked;
  float_matmul<T>(lhs, w, out, x);
  return result;
}

template <class T>
py::object rope_rotate_half_t(Args& a) {
  // heads: x's second extent when 3-D, else its width over R (sin's width).
  const std::vector<Index> xs = a.has("x") ? extents(a, "x") : std::vector<Index>{};
  const Index r = last_extent(a, "sin");
  const Index guess = xs.size() == 3                              ? xs[1]
                      : xs.size() == 2 && r > 0 && xs[1] % r == 0 ? xs[1] / r
                                                                  : 1;
  const Index heads = scalar<Index>(a, "heads", guess);
  const int coeff = scalar(a, "rotary_coeff", 2);
  StridedView<const T> x, sin, cos;
  a.view("x", x);
  a.view("sin", sin);
  a.view("cos", cos);
  StridedView<T> out;
  py::object result = a.output("out", out, extents(a, "x"));
  a.finish();
  py::gil_scoped_release unlocked;
  rope_rotate_half<T>(x, sin, cos, heads, out, coeff);
  return result;
}

template <class T>
py::object q_nope_absorb_t(Args& a, const ExecConfig& x) {
  StridedView<const T> q;
  WukRef<T> wuk;
  a.view("q", q);
  a.view("wuk", wuk.tensor);
  wuk.nz = wuk.tensor.rank() == 4;
  std::vector<Index> shape = extents(a, "q");
  const auto w = extents(a, "wuk");
  if (shape.size() == 3 && w.size() >= 3) shape[2] = wuk.nz ? w[1] * w[3] : w[2];
  StridedView<float> out;
  py::object result = a.output("out", out, shape);
  a.finish();
  py::gil_scoped_release unlocked;
  q_nope_absorb<T>(q, wuk, out, x);
  return result;
}

/// Calls f(Tag<T>{}) for the stage's element type (float32, float16, bfloat16) in `arg`.
template <class F>
py::object stage(const char* op, const char* arg, const py::dict& kw, F&& f) {
  Args a(op, kw);
  const Dtype d = std::string(op) == "int8_matmul" ? matmul_dtype(a) : a.dtype(arg);
  return with_float(a.op(), arg, d, [&](auto t) { return f(t, a); });
}

void bind_stages(py::module_& m) {
  m.def("_rms_norm", [](const py::dict& kw) {
    return stage("rms_norm", "x", kw,
                 [](auto t, Args& a) { return rms_norm_t<typename decltype(t)::type>(a); });
  });
  m.def("_rms_norm_quant", [](const py::dict& kw) {
    return stage("rms_norm_quant", "x", kw,
                 [](auto t, Args& a) { return rms_norm_quant_t<typename decltype(t)::type>(a); });
  });
  m.def("_int8_matmul", [](const py::dict& kw, const ExecConfig& x) {
    return stage("int8_matmul", "out", kw,
                 [&](auto t, Args& a) { return int8_matmul_t<typename decltype(t)::type>(a, x); });
  });
  m.def("_float_matmul", [](const py::dict& kw, const ExecConfig& x) {
    return stage("float_matmul", "a", kw,
                 [&](auto t, Args& a) { return float_matmul_t<typename decltype(t)::type>(a, x); });
  });
  m.def("_rope_rotate_half", [](const py::dict& kw) {
    return stage("rope_rotate_half", "x", kw,
                 [](auto t, Args& a) { return rope_rotate_half_t<typename decltype(t)::type>(a); });
  });
  m.def("_q_nope_absorb", [](const py::dict& kw, const ExecConfig& x) {
    return stage("q_nope_absorb", "q", kw, [&](auto t, Args& a) {
      return q_nope_absorb_t<typename decltype(t)::type>(a, x);
    });
  });
}

// ---- MLA decode ------------------------------------------------------------------------

using MD = MlaDecodeParams;

void bind_mla_decode_params(py::module_& m) {
  ParamsBinder<MD> b(m, "MlaDecodeParams", "attnref::MlaDecodeParams: latent widths and scale");
  b.field("kv_lora_rank", &MD::kv_lora_rank)
      .field("rope_dim", &MD::rope_dim)
      .field("scale", &MD::scale);
  b.finish();
}

/// out [B, heads, C] from the query `q` ([B, heads, ..]) and params.kv_lora_rank.
std::vector<Index> decode_out_shape(const MD& p, const Args& a, const char* q) {
  std::vector<Index> shape = extents(a, q);
  if (shape.size() == 3) shape[2] = dim(p.kv_lora_rank);
  return allocatable_shape(shape);
}

template <class T>
py::object mla_decode_t(const MD& p, Args& a, const ExecConfig& x) {
  MlaDecodeInputs<T> in;
  a.view("q", in.q);
  a.view("kv_cache", in.kv_cache);
  a.index_view("block_table", in.block_table);
  a.ints("context_lens", in.context_lens);
  MlaDecodeOutputs<T> out;
  py::object result = a.output("out", out.out, decode_out_shape(p, a, "q"));
  a.finish();
  py::gil_scoped_release unlocked;
  mla_decode(p, in, out, x);
  return result;
}

template <class T>
py::object mla_decode_unabsorbed_t(const MD& p, Args& a, const ExecConfig& x) {
  MlaUnabsorbedInputs<T> in;
  a.view("q_nope", in.q_nope);
  a.view("q_rope", in.q_rope);
  a.view("wuk", in.wuk);
  a.view("kv_cache", in.kv_cache);
  a.index_view("block_table", in.block_table);
  a.ints("context_lens", in.context_lens);
  MlaDecodeOutputs<T> out;
  py::object result = a.output("out", out.out, decode_out_shape(p, a, "q_nope"));
  a.finish();
  py::gil_scoped_release unlocked;
  mla_decode_unabsorbed(p, in, out, x);
  return result;
}

py::object mla_decode_py(const MD& p, const py::dict& kw, const ExecConfig& x) {
  Args a("mla_decode", kw);
  return with_float(a.op(), "q", a.dtype("q"),
                    [&](auto t) { return mla_decode_t<typename decltype(t)::type>(p, a, x); });
}

py::object mla_decode_unabsorbed_py(const MD& p, const py::dict& kw, const ExecConfig& x) {
  Args a("mla_decode_unabsorbed", kw);
  return with_float(a.op(), "q_nope", a.dtype("q_nope"), [&](auto t) {
    return mla_decode_unabsorbed_t<typename decltype(t)::type>(p, a, x);
  });
}

}  // namespace

void bind_mla(py::module_& m) {
  bind_mla_params(m);
  m.def("_mla_preprocess", &mla_preprocess_py);
  m.def("_mla_reshape_and_cache", &mla_reshape_and_cache_py);
  bind_stages(m);
  bind_mla_decode_params(m);
  m.def("_mla_decode", &mla_decode_py);
  m.def("_mla_decode_unabsorbed", &mla_decode_unabsorbed_py);
}

}  // namespace attnref::python
