// Fuzz entry "mla_preprocess" (fp16 or bf16 by seed): every quant x cache mode, wdqkv / wuq ND
// [out, in], ND [in, out] or NZ, wuk ND or NZ, small free dims (NZ caches: block size 128, C % 16
// or 32, R % 16), random slots, sentinels (NaN, int8 -77) in all outputs and caches. Against
// ref::mla::chain with the tolerances of tests/mla/mla_preprocess_test.cpp: quantized modes exact
// but T(q_nope) (1 ulp, or the fp32 sum bound) and int8 q_nope (±1); Unquant within
// support::tolerance (int8 ±2); every element the reference does not write keeps its sentinel.

#include <attnref/attnref.hpp>
#include <cstring>
#include <limits>

#include "fuzz/fuzz.hpp"
#include "reference/mla_preprocess.hpp"
#include "support/cast.hpp"
#include "support/ulp.hpp"
#include "support/views.hpp"

namespace fuzz_mla_preprocess {

using attnref::MlaCacheMode;
using attnref::MlaQuantMode;
using attnref::StridedView;
using attnref::WeightFormat;
using attnref::WeightRef;
using fuzz::Index;
using fuzz::kHuge;
using Rng = fuzz::Rng;
using D = attnref::Dims;
using i8 = std::int8_t;
using i32 = std::int32_t;
using i64 = std::int64_t;
namespace rm = ref::mla;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr i8 kSentinel8 = -77;

using support::ulp_of;
using support::z;

template <class T>
struct Mp {
  int qm = 0, cm = 0;
  bool want_oor = false;  // the perturbation must give std::out_of_range
  Index N = 1, H0 = 1, C = 1, R = 2, Q = 1, P = 1, NH = 1, W1 = 1, W2 = 1, blocks = 1, bs = 1;
  // Inputs: the weights [out, in] (wuk [heads, P, C]) for the reference, and the copies in the
  // case's formats (_s) attnref reads; scal: quant scales 0, 1 and 3; qo: offsets 0 and 1.
  std::vector<T> input, gamma0, beta0, gamma1, beta1, gamma2, sin, cos, scal, qns;
  std::vector<T> wdqkv_f, wuq_f, wuk, wdqkv_fs, wuq_fs, wuk_s;
  std::vector<i8> wdqkv, wuq, wdqkv_s, wuq_s, qo;
  std::vector<float> ds0, ds1;
  std::vector<i64> ds0b, ds1b;
  std::vector<i32> bias0, bias1, slots;
  // Outputs and caches (sentinels), and memory for outputs a mode does not take.
  std::vector<T> q_out, q_rope, kv, ctkv, krope, spare;
  std::vector<i8> q_i8, ctkv_i8, spare8;
  attnref::MlaPreprocessParams p;
  attnref::MlaPreprocessInputs<T> in;
  attnref::MlaPreprocessOutputs<T> out;
  // The T query output and the T cache every cache mode has.
  StridedView<T>& qv() { return cm == 0 ? out.q_out : out.q_rope_out; }
  StridedView<T>& kc() { return cm == 0 ? out.caches.kv_cache : out.caches.krope; }
};

// NZ of `batch` [rows, cols] matrices, written here: element (m, n) of matrix b at
// [b][n / c0][m][n % c0] of [batch, ceil(cols / c0), ceil(rows / 16) · 16, c0], padding 0.
template <class U>
std::vector<U> nz_pack(const std::vector<U>& nd, Index batch, Index rows, Index cols) {
  const Index c0 = static_cast<Index>(32 / sizeof(U)), n1 = (cols + c0 - 1) / c0,
              mp = (rows + 15) / 16 * 16;
  std::vector<U> out(z(batch * n1 * mp * c0), U(0));
  for (Index b = 0; b < batch; ++b)
    for (Index m = 0; m < rows; ++m)
      for (Index n = 0; n < cols; ++n)
        out[z(((b * n1 + n / c0) * mp + m) * c0 + n % c0)] = nd[z((b * rows + m) * cols + n)];
  return out;
}

// The weight w [out, in] stored in format f in `keep`.
template <class U>
WeightRef<U> store(const std::vector<U>& w, Index out, Index in, WeightFormat f,
                   std::vector<U>& keep) {
  const Index c0 = static_cast<Index>(32 / sizeof(U));
  if (f == WeightFormat::Nz) {
    keep = nz_pack(w, 1, out, in);
    return {StridedView<const U>(keep.data(), {(in + c0 - 1) / c0, (out + 15) / 16 * 16, c0}), out,
            in, f};
  }
  const bool t = f == WeightFormat::NdInOut;
  keep.resize(w.size());
  for (Index o = 0; o < out; ++o)
    for (Index k = 0; k < in; ++k) keep[z(t ? k * out + o : o * in + k)] = w[z(o * in + k)];
  return {StridedView<const U>(keep.data(), t ? D{in, out} : D{out, in}), out, in, f};
}

// Dimension d (random when -1) of v, a view of buf, set to e (by default one more); buf grows to
// match, so that a wrongly accepted shape stays in bounds.
template <class U, class V>
void bump(std::vector<U>& buf, StridedView<V>& v, Rng& r, int d = -1, Index e = -1) {
  if (d < 0) d = static_cast<int>(r.range(0, v.rank() - 1));
  v = support::resized(v, d, e < 0 ? v.size(d) + 1 : e);
  buf.resize(std::max(buf.size(), z(v.numel())));
  v = support::with_data(v, buf.data());
}

template <class T>
void build(Mp<T>& c, Rng& r) {
  using CT = StridedView<const T>;
  using attnref::make_view;
  auto uni = [&](double lo, double hi) { return std::uniform_real_distribution<>(lo, hi)(r.g); };
  auto ts = [&](Index n, double sd, double mean) {
    std::vector<T> v(z(n));
    for (T& x : v) x = T(static_cast<float>(mean + sd * r.normal()));
    return v;
  };
  auto width = [&] { return r.chance(0.25) ? 32 * r.range(1, 2) : r.range(1, 40); };  // K % 32
  c.qm = static_cast<int>(r.range(0, 3)), c.cm = static_cast<int>(r.range(0, 3));
  const bool nzc = c.cm >= 2, wuk_nz = r.chance(0.4), beta = r.chance(0.7);
  c.N = r.range(1, 4), c.H0 = width(), c.Q = width(), c.P = r.range(1, 20), c.NH = r.range(1, 3);
  const Index R = c.R = nzc ? 16 : 2 * r.range(1, 5);
  const Index C = c.C = c.cm == 2 ? 32 : c.cm == 3 || wuk_nz ? 16 * r.range(1, 2) : r.range(1, 24);
  c.W1 = C + R + c.Q, c.W2 = c.NH * (c.P + R);
  c.bs = nzc ? 128 : r.chance(0.05) ? 256 : r.range(1, 8);
  c.blocks = c.N / c.bs + r.range(1, 2);  // at least one spare slot
  const Index cap = c.blocks * c.bs;
  auto& in = c.in;
  c.input = ts(c.N * c.H0, 1, 0);
  c.gamma0 = ts(c.H0, 0.1, 1), c.gamma1 = ts(c.Q, 0.1, 1), c.gamma2 = ts(C, 0.1, 1);
  if (beta) c.beta0 = ts(c.H0, 0.1, 0), c.beta1 = ts(c.Q, 0.1, 0);
  for (Index i = 0; i < c.N * R; ++i) {
    const double th = uni(-3.2, 3.2);
    c.sin.push_back(T(static_cast<float>(std::sin(th))));
    c.cos.push_back(T(static_cast<float>(std::cos(th))));
  }
  c.wuk = ts(c.NH * c.P * C, 1 / std::sqrt(double(c.P)), 0);
  c.scal = {T(0.03f), T(0.04f), T(0.05f)};
  c.qo = {static_cast<i8>(r.range(-5, 5)), static_cast<i8>(r.range(-5, 5))};
  for (Index h = 0; h < c.NH; ++h) c.qns.push_back(T(static_cast<float>(uni(8, 24))));
  auto fmt = [&] { return static_cast<WeightFormat>(r.range(0, 2)); };
  if (c.qm == 3) {
    c.wdqkv_f = ts(c.W1 * c.H0, 1 / std::sqrt(double(c.H0)), 0);
    c.wuq_f = ts(c.W2 * c.Q, 1 / std::sqrt(double(c.Q)), 0);
    in.wdqkv_float = store(c.wdqkv_f, c.W1, c.H0, fmt(), c.wdqkv_fs);
    in.wuq_float = store(c.wuq_f, c.W2, c.Q, fmt(), c.wuq_fs);
  } else {
    for (Index i = 0; i < c.W1 * c.H0; ++i) c.wdqkv.push_back(static_cast<i8>(r.range(-127, 127)));
    for (Index i = 0; i < c.W2 * c.Q; ++i) c.wuq.push_back(static_cast<i8>(r.range(-127, 127)));
    in.wdqkv = store(c.wdqkv, c.W1, c.H0, fmt(), c.wdqkv_s);
    in.wuq = store(c.wuq, c.W2, c.Q, fmt(), c.wuq_s);
    // de_scale keeping mm1 / mm2 O(1) (as the tests do), fp32 or its bits in an int64.
    auto scales = [&](Index rows, Index K, float qs, std::vector<float>& ds, std::vector<i64>& db,
                      std::vector<i32>& bias) {
      for (Index n = 0; n < rows; ++n) {
        ds.push_back(static_cast<float>((c.qm == 0 ? qs : 1.0) / (std::sqrt(double(K)) * 73.0) *
                                        uni(0.8, 1.2)));
        std::uint32_t u = 0;
        std::memcpy(&u, &ds.back(), sizeof u);  // the fp32 bits, in an int64
        db.push_back(static_cast<i64>(u)), bias.push_back(static_cast<i32>(r.range(-400, 400)));
      }
    };
    scales(c.W1, c.H0, 0.03f, c.ds0, c.ds0b, c.bias0);
    scales(c.W2, c.Q, 0.04f, c.ds1, c.ds1b, c.bias1);
    if (r.chance(0.5))
      in.de_scale0_bits = make_view(c.ds0b), in.de_scale1_bits = make_view(c.ds1b);
    else
      in.de_scale0 = make_view(c.ds0), in.de_scale1 = make_view(c.ds1);
    if (c.qm == 0) {
      in.quant_scale0 = CT(&c.scal[0], {1}), in.quant_scale1 = CT(&c.scal[1], {1});
      in.quant_offset0 = StridedView<const i8>(&c.qo[0], {1});
      in.quant_offset1 = StridedView<const i8>(&c.qo[1], {1});
      if (r.chance(0.7)) in.bias0 = make_view(c.bias0), in.bias1 = make_view(c.bias1);
    }
  }
  std::vector<i32> ids(z(cap));  // slots: distinct, some skipped (-1), some repeated
  for (Index i = 0; i < cap; ++i) ids[z(i)] = static_cast<i32>(i);
  std::shuffle(ids.begin(), ids.end(), r.g);
  for (Index t = 0; t < c.N; ++t)
    c.slots.push_back(r.chance(0.15) ? -1 : t > 0 && r.chance(0.1) ? c.slots.back() : ids[z(t)]);
  in.input = CT(c.input.data(), {c.N, c.H0});
  in.gamma0 = make_view(c.gamma0), in.gamma1 = make_view(c.gamma1), in.gamma2 = make_view(c.gamma2);
  if (beta) in.beta0 = make_view(c.beta0), in.beta1 = make_view(c.beta1);
  in.sin = CT(c.sin.data(), {c.N, R}), in.cos = CT(c.cos.data(), {c.N, R});
  c.wuk_s = wuk_nz ? nz_pack(c.wuk, c.NH, c.P, C) : c.wuk;
  in.wuk = {
      CT(c.wuk_s.data(), wuk_nz ? D{c.NH, C / 16, (c.P + 15) / 16 * 16, 16} : D{c.NH, c.P, C}),
      wuk_nz};
  in.slot_mapping = make_view(c.slots);
  const T nan(kNaN);
  auto& o = c.out;
  auto put = [&](auto& v, auto& buf, auto fill, const D& s) {  // an output of shape s
    buf.assign(z(s[0] * s[1] * s[2] * (s.size() > 3 ? s[3] : 1)), fill);
    v = std::decay_t<decltype(v)>(buf.data(), s);
  };
  if (c.cm == 0) put(o.q_out, c.q_out, nan, {c.N, c.NH, C + R});
  if (c.cm == 0) put(o.caches.kv_cache, c.kv, nan, {c.blocks, c.bs, 1, C + R});
  if (c.cm != 0) put(o.q_rope_out, c.q_rope, nan, {c.N, c.NH, R});
  if (c.cm != 0)
    put(o.caches.krope, c.krope, nan,
        nzc ? D{c.blocks, R / 16, c.bs, 16} : D{c.blocks, c.bs, 1, R});
  if (c.cm == 1 || c.cm == 3) put(o.q_out, c.q_out, nan, {c.N, c.NH, C});
  if (c.cm == 1) put(o.caches.ctkv, c.ctkv, nan, {c.blocks, c.bs, 1, C});
  if (c.cm == 3) put(o.caches.ctkv, c.ctkv, nan, {c.blocks, C / 16, c.bs, 16});
  if (c.cm == 2) {
    put(o.q_out_i8, c.q_i8, kSentinel8, {c.N, c.NH, C});
    put(o.caches.ctkv_i8, c.ctkv_i8, kSentinel8, {c.blocks, C / 32, c.bs, 32});
    in.ctkv_scale = CT(&c.scal[2], {1}), in.q_nope_scale = make_view(c.qns);
  }
  auto& p = c.p;
  p.dims = attnref::MlaDims{c.H0, C, R, c.Q, c.P};
  p.epsilon = r.chance(0.5) ? 1e-5f : 1e-6f;
  if (r.chance(0.5))  // the ATB form: 0 or the dims
    p.wdq_dim = std::uint32_t(c.Q), p.q_rope_dim = p.k_rope_dim = std::uint32_t(R);
  p.quant_mode = static_cast<MlaQuantMode>(c.qm), p.cache_mode = static_cast<MlaCacheMode>(c.cm);
}

// The expectation of one output / cache buffer: a value and an allowed deviation per element
// (the sentinel, deviation 0, where the reference writes nothing).
struct Want {
  std::vector<double> v, tol;
  Want(size_t n, double sentinel) : v(n, sentinel), tol(n, 0.0) {}
  void set(size_t i, double value, double t) { v[i] = value, tol[i] = t; }
};

template <class U>
std::string check(const char* name, const std::vector<U>& got, const Want& w) {
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<float>(got[i]), e = w.v[i];
    if (g == e || (std::isnan(g) && std::isnan(e)) || std::fabs(g - e) <= w.tol[i]) continue;
    return std::string(name) + "[" + std::to_string(i) + "]: got " + std::to_string(g) + ", want " +
           std::to_string(e) + " within " + std::to_string(w.tol[i]);
  }
  return "";
}

template <class T>
std::string verify(const Mp<T>& c) {
  constexpr bool f16 = std::is_same_v<T, attnref::half>;
  auto fl = [](const std::vector<T>& v) {
    std::vector<float> f;
    for (T x : v) f.push_back(static_cast<float>(x));
    return f;
  };
  rm::ChainIn ci;
  ci.input = fl(c.input), ci.gamma0 = fl(c.gamma0), ci.beta0 = fl(c.beta0);
  ci.gamma1 = fl(c.gamma1), ci.beta1 = fl(c.beta1), ci.gamma2 = fl(c.gamma2);
  ci.quant_scale0 = static_cast<float>(c.scal[0]), ci.quant_offset0 = c.qo[0];
  ci.quant_scale1 = static_cast<float>(c.scal[1]), ci.quant_offset1 = c.qo[1];
  ci.wdqkv = c.wdqkv, ci.wuq = c.wuq, ci.wdqkv_f = fl(c.wdqkv_f), ci.wuq_f = fl(c.wuq_f);
  if (!c.in.bias0.absent()) ci.bias0 = c.bias0, ci.bias1 = c.bias1;
  ci.descale0 = c.ds0, ci.descale1 = c.ds1;
  ci.sin = fl(c.sin), ci.cos = fl(c.cos), ci.wuk = fl(c.wuk);
  ci.quant_scale3 = static_cast<float>(c.scal[2]), ci.q_nope_scale = fl(c.qns);
  const Index C = c.C, R = c.R, P = c.P, NH = c.NH, W2 = c.W2;
  const rm::Dims d{int(c.H0), int(C), int(R), int(c.Q), int(P), int(NH)};
  const rm::ChainOut r = rm::chain(d, c.qm, c.cm, ci, static_cast<int>(c.N), c.p.epsilon,
                                   f16 ? rm::Dt::F16 : rm::Dt::BF16);
  const bool uq = c.qm == 3;
  const double tt = f16 ? 1e-3 : 8e-3;  // support::tolerance(F16 / BF16): atol = rtol
  auto tol = [&](double v) { return uq ? tt * (1 + std::fabs(v)) : 0.0; };
  Want qo(c.q_out.size(), kNaN), qr(c.q_rope.size(), kNaN), q8(c.q_i8.size(), kSentinel8);
  Want kv(c.kv.size(), kNaN), ct(c.ctkv.size(), kNaN), kr(c.krope.size(), kNaN),
      c8(c.ctkv_i8.size(), kSentinel8);
  for (Index th = 0; th < c.N * NH; ++th) {
    const Index t = th / NH, h = th % NH, qw = c.cm == 0 ? C + R : C;
    for (Index j = 0; j < C; ++j) {
      const double v = r.q_nope_T[z(th * C + j)];
      double a = 0.0;  // quantized: an fp32 sum vs a double one, 1 ulp or the fp32 bound
      for (Index k = 0; k < P && !uq; ++k)
        a += std::fabs(double(r.mm2[z(t * W2 + h * (P + R) + k)]) *
                       static_cast<float>(c.wuk[z((h * P + k) * C + j)]));
      if (c.cm == 2) q8.set(z(th * C + j), r.q_nope_i8[z(th * C + j)], uq ? 2 : 1);
      if (c.cm != 2) qo.set(z(th * qw + j), v, uq ? tol(v) : (P + 2) * 0x1p-24 * a + ulp_of<T>(v));
    }
    for (Index j = 0; j < R; ++j) {
      const double v = r.q_rope[z(th * R + j)];
      (c.cm == 0 ? qo : qr).set(z(c.cm == 0 ? th * (C + R) + C + j : th * R + j), v, tol(v));
    }
  }
  for (Index t = 0; t < c.N; ++t) {  // the caches, in token order (a later token wins)
    const i32 s = c.slots[z(t)];
    if (s < 0) continue;
    const int blk = int(s / c.bs), off = int(s % c.bs), ic = int(C), ir = int(R), ib = int(c.bs);
    for (int j = 0; j < ic; ++j) {
      const double v = r.k_nope[z(t * C + j)];
      if (c.cm == 0) kv.set(z(s * (C + R) + j), v, tol(v));
      if (c.cm == 1) ct.set(z(s * C + j), v, tol(v));
      if (c.cm == 2)
        c8.set(rm::nz_cache_index(blk, off, j, ic, ib, 32), r.k_nope_i8[z(t * C + j)], uq ? 2 : 0);
      if (c.cm == 3) ct.set(rm::nz_cache_index(blk, off, j, ic, ib, 16), v, tol(v));
    }
    for (int j = 0; j < ir; ++j) {
      const double v = r.k_rope[z(t * R + j)];
      if (c.cm == 0) kv.set(z(s * (C + R) + C + j), v, tol(v));
      if (c.cm == 1) kr.set(z(s * R + j), v, tol(v));
      if (c.cm >= 2) kr.set(rm::nz_cache_index(blk, off, j, ir, ib, 16), v, tol(v));
    }
  }
  for (const std::string& e :
       {check("q_out", c.q_out, qo), check("q_rope_out", c.q_rope, qr),
        check("q_out_i8", c.q_i8, q8), check("kv_cache", c.kv, kv), check("ctkv", c.ctkv, ct),
        check("krope", c.krope, kr), check("ctkv_i8", c.ctkv_i8, c8)})
    if (!e.empty()) return e;
  return "";
}

template <class T>
const std::vector<fuzz::Perturbation<Mp<T>>>& perturbations() {
  using M = Mp<T>;
  using CT = StridedView<const T>;
  using V = StridedView<T>;
  using E = void (*)(M&, Rng&);
  // must(name)(edit): attnref must reject; fine(name, ok)(edit): defined (applicable when ok).
  auto must = [](const char* n) { return [n](E e) { return fuzz::edit<M>(n, true, nullptr, e); }; };
  auto fine = [](const char* n, bool (*ok)(const M&) = nullptr) {
    return [n, ok](E e) { return fuzz::edit<M>(n, false, ok, e); };
  };
  static const std::vector<fuzz::Perturbation<M>> list{
      must("required input null")([](M& c, Rng& r) {
        CT* v[] = {&c.in.input, &c.in.gamma0, &c.in.gamma1,    &c.in.gamma2,
                   &c.in.sin,   &c.in.cos,    &c.in.wuk.tensor};
        CT& x = *v[r.range(0, 6)];
        if (r.chance(0.85)) x = support::with_data(x, nullptr);
        if (x.data()) c.in.slot_mapping = support::with_data(c.in.slot_mapping, nullptr);
      }),
      must("extent negative, or extents whose product overflows 64 bits")([](M& c, Rng& r) {
        const Index w = r.range(0, 5);
        if (w == 0) c.in.input = support::resized(c.in.input, 0, -r.range(1, 4));
        if (w == 1) c.in.sin = support::resized(c.in.sin, 1, -2);
        if (w == 2) c.kc() = support::resized(c.kc(), 0, -1);
        if (w == 3) c.in.input = support::reshaped(c.in.input, {kHuge, kHuge});
        if (w == 4) c.in.wuk.tensor = support::reshaped(c.in.wuk.tensor, {kHuge, 1, kHuge});
        if (w == 5) c.kc() = support::reshaped(c.kc(), {kHuge, kHuge, 1, 16});
      }),
      must("input, gamma, beta, sin, cos or slot_mapping shape wrong")([](M& c, Rng& r) {
        std::vector<T>* b[] = {&c.input, &c.gamma0, &c.gamma1, &c.gamma2,
                               &c.sin,   &c.cos,    &c.beta0,  &c.beta1};
        CT* v[] = {&c.in.input, &c.in.gamma0, &c.in.gamma1, &c.in.gamma2,
                   &c.in.sin,   &c.in.cos,    &c.in.beta0,  &c.in.beta1};
        const Index n = c.beta0.empty() ? 6 : 8, w = r.range(0, n);  // n: slot_mapping
        w < n ? bump(*b[w], *v[w], r) : bump(c.slots, c.in.slot_mapping, r);
      }),
      must("wdqkv, wuq or wuk shape or format wrong")([](M& c, Rng& r) {
        auto edit = [&](auto& w, auto& buf) {
          const Index k = r.range(0, 2);
          if (k == 0) w.out += 1;
          if (k == 1) w.in -= 1;
          if (k == 2) bump(buf, w.tensor, r);
        };
        const Index w = r.range(0, 4);
        if (w == 0) c.qm == 3 ? edit(c.in.wdqkv_float, c.wdqkv_fs) : edit(c.in.wdqkv, c.wdqkv_s);
        if (w == 1) c.qm == 3 ? edit(c.in.wuq_float, c.wuq_fs) : edit(c.in.wuq, c.wuq_s);
        if (w == 2) c.in.wuk.nz = !c.in.wuk.nz;
        if (w >= 3) bump(c.wuk_s, c.in.wuk.tensor, r);
      }),
      must("slot_mapping entry past the cache")([](M& c, Rng& r) {
        c.slots[z(r.range(0, c.N - 1))] =
            r.chance(0.2) ? std::numeric_limits<i32>::max() : i32(c.blocks * c.bs + r.range(0, 3));
        c.want_oor = true;
      }),
      must("q_out, q_out_i8 or q_rope_out shape wrong or missing")([](M& c, Rng& r) {
        const bool rope = c.cm != 0 && r.chance(0.5), gone = r.chance(0.2);
        if (c.cm == 2 && !rope)
          return gone ? void(c.out.q_out_i8 = {}) : bump(c.q_i8, c.out.q_out_i8, r);
        V& v = rope ? c.out.q_rope_out : c.out.q_out;
        gone ? void(v = {}) : bump(rope ? c.q_rope : c.q_out, v, r);
      }),
      must("cache shape or block size wrong")([](M& c, Rng& r) {
        auto& k = c.out.caches;
        const Index w = c.cm == 0 ? r.range(0, 1) : r.range(0, 2);
        const int d = static_cast<int>(r.range(0, 1));
        if (w == 0 && c.cm == 0) bump(c.kv, k.kv_cache, r, 2 + d);  // the '1' or the width
        if (w == 0 && c.cm == 1) bump(c.ctkv, k.ctkv, r, 2 + d);
        if (w == 0 && c.cm == 2) bump(c.ctkv_i8, k.ctkv_i8, r, 1 + 2 * d);  // width or C0
        if (w == 0 && c.cm == 3) bump(c.ctkv, k.ctkv, r, 1 + 2 * d);
        if (w == 2) bump(c.krope, k.krope, r);
        if (w != 1) return;  // a block size ATB rejects: NZ not 128, ND 129 to 255 or > 256
        const Index bs = c.cm >= 2 ? 16 * r.range(1, 7) : r.range(129, 255) + 128 * r.range(0, 1);
        auto set = [&](auto& v, auto& buf) {  // one block of bs rows
          if (!v.absent()) bump(buf, v, r, 0, 1), bump(buf, v, r, c.cm >= 2 ? 2 : 1, bs);
        };
        set(k.kv_cache, c.kv), set(k.ctkv, c.ctkv), set(k.ctkv_i8, c.ctkv_i8),
            set(k.krope, c.krope);
      }),
      must("an output or cache the mode does not take")([](M& c, Rng& r) {
        const Index N = c.N, NH = c.NH, B = c.blocks, bs = c.bs, C = c.C, R = c.R;
        c.spare.assign(z((B * bs + N * NH) * (C + R)), T(kNaN));
        c.spare8.assign(c.spare.size(), kSentinel8);
        T* t = c.spare.data();
        i8* e = c.spare8.data();
        auto& o = c.out;
        const bool q = r.chance(0.5), a = r.chance(0.5);
        if (q && c.cm == 0 && a) o.q_rope_out = V(t, {N, NH, R});
        if (q && c.cm != 2 && !(c.cm == 0 && a)) o.q_out_i8 = StridedView<i8>(e, {N, NH, C});
        if (q && c.cm == 2) o.q_out = V(t, {N, NH, C});
        if (!q && c.cm == 0) o.caches.krope = V(t, {B, bs, 1, R});
        if (!q && c.cm != 0 && a) o.caches.kv_cache = V(t, {B, bs, 1, C + R});
        if (!q && c.cm == 2 && !a) o.caches.ctkv = V(t, {B, C / 16, bs, 16});
        if (!q && c.cm % 2 && !a) o.caches.ctkv_i8 = StridedView<i8>(e, {B, C, bs, 1});
      }),
      // The memory grown to the output's size: in bounds even if accepted.
      must("an output overlapping an input or another output")([](M& c, Rng& r) {
        const Index w = r.range(0, 3);
        V& v = (w == 3 || r.chance(0.5)) ? c.qv() : c.kc();
        CT* src[] = {&c.in.input, &c.in.sin, &c.in.wuk.tensor};
        std::vector<T>* buf[] = {&c.input, &c.sin, &c.wuk_s, c.cm == 0 ? &c.kv : &c.krope};
        buf[w]->resize(std::max(buf[w]->size(), z(v.numel())));
        if (w < 3) *src[w] = support::with_data(*src[w], buf[w]->data());
        if (w == 3) c.kc() = support::with_data(c.kc(), buf[w]->data());  // q on the cache
        v = support::with_data(v, buf[w]->data());
      }),
      must("epsilon negative, NaN or infinite")([](M& c, Rng& r) {
        const float inf = std::numeric_limits<float>::infinity();
        c.p.epsilon = std::vector<float>{-1e-6f, -1.0f, kNaN, inf, -inf}[z(r.range(0, 4))];
      }),
      must("quant_mode or cache_mode out of range, or other params unsupported")([](M& c, Rng& r) {
        auto& p = c.p;
        const Index w = r.range(0, 8);
        if (w == 0) p.quant_mode = static_cast<MlaQuantMode>(r.range(4, 65535));
        if (w == 1) p.cache_mode = static_cast<MlaCacheMode>(r.range(4, 255));
        if (w == 2) (r.chance(0.5) ? p.q_rotary_coeff : p.k_rotary_coeff) = r.chance(0.5) ? 1 : 4;
        if (w == 3) p.transpose_wuk = false;
        if (w == 4) p.wdq_dim = static_cast<std::uint32_t>(c.Q + 1);
        if (w == 5) (r.chance(0.5) ? p.q_rope_dim : p.k_rope_dim) = std::uint32_t(c.R + 2);
        if (w == 6) p.dims.rope_dim = c.R + 1;
        if (w >= 7) (r.chance(0.5) ? p.dims.nope_dim : p.dims.hidden_size) = -r.range(0, 2);
      }),
      must("quant scale, de_scale, bias or Int8NzCache scale wrong for the mode")([](M& c, Rng& r) {
        auto& in = c.in;
        const T bad[] = {T(0.0f), T(kNaN), T(std::numeric_limits<float>::infinity())};
        const Index w = r.range(0, 3), b = r.range(0, 2);
        const bool a = r.chance(0.5);
        if (w == 0 && c.qm == 0 && a) c.scal[z(r.range(0, 1))] = bad[b];  // unusable
        if (w == 0 && c.qm == 0 && !a) b ? void(in.quant_scale1 = {}) : void(in.quant_offset0 = {});
        if (w == 0 && c.qm != 0) in.quant_scale0 = CT(&c.scal[0], {1});          // not taken
        if (w == 1 && c.qm != 3 && a) in.de_scale1 = attnref::make_view(c.ds1);  // both forms
        if (w == 1 && c.qm != 3 && a) in.de_scale1_bits = attnref::make_view(c.ds1b);
        if (w == 1 && c.qm != 3 && !a) in.de_scale0 = {}, in.de_scale0_bits = {};  // neither
        if ((w == 1 && c.qm == 3) || (w == 2 && c.qm != 0)) in.bias0 = attnref::make_view(c.slots);
        if (w == 2 && c.qm == 0) in.bias1 = StridedView<const i32>(c.bias1.data(), {c.W2 - 1});
        if (w == 3 && c.cm == 2) a ? void(c.scal[2] = bad[b]) : bump(c.qns, in.q_nope_scale, r);
        if (w == 3 && c.cm != 2) in.q_nope_scale = attnref::make_view(c.qns);  // not taken
      }),
      // Unusual but defined.
      fine("epsilon 0")([](M& c, Rng&) { c.p.epsilon = 0.0f; }),
      fine("a zero input row")([](M& c, Rng& r) {
        std::fill_n(c.input.begin() + r.range(0, c.N - 1) * c.H0, c.H0, T(0.0f));
      }),
      fine("every slot negative (caches of 0 blocks), or every token on one slot")(
          [](M& c, Rng& r) {
            const i32 one = static_cast<i32>(r.range(0, c.blocks * c.bs - 1));
            const bool neg = r.chance(0.5), empty = neg && r.chance(0.3);
            for (i32& s : c.slots) s = neg ? -i32(r.range(1, 9)) - (r.chance(0.3) << 30) : one;
            auto zero = [&](auto& v) { v = empty && !v.absent() ? support::resized(v, 0, 0) : v; };
            zero(c.out.caches.kv_cache), zero(c.out.caches.ctkv), zero(c.out.caches.ctkv_i8),
                zero(c.out.caches.krope);
          }),
      fine("ctkv_scale tiny: int8 cache values saturate", [](const M& c) { return c.cm == 2; })(
          [](M& c, Rng& r) { c.scal[2] = T(r.chance(0.5) ? 1e-3f : -1e-3f); }),
  };
  return list;
}

template <class T>
void restride_inputs(Mp<T>& c, support::Restrider& r) {
  c.in.for_each_view(r);
}

template <class T>
void validate_only(Mp<T>& c) {
  attnref::validate(c.p, c.in, c.out);
}

template <class T>
void run_t(fuzz::Run& run, std::uint64_t seed) {
  using M = Mp<T>;
  fuzz::run_case(
      run, seed, perturbations<T>(), build<T>, fuzz::Named{"mla_preprocess"},
      [seed](M& c) {
        try {
          attnref::mla_preprocess<T>(c.p, c.in, c.out, {static_cast<int>(seed % 2 + 1)});
        } catch (const std::invalid_argument& e) {
          if (!c.want_oor) throw;
          throw std::runtime_error(std::string("not std::out_of_range: ") + e.what());
        }
      },
      verify<T>, &M::input, &M::gamma0, &M::beta0, &M::gamma1, &M::beta1, &M::gamma2, &M::sin,
      &M::cos, &M::scal, &M::qns, &M::wdqkv_fs, &M::wuq_fs, &M::wuk_s, &M::wdqkv_s, &M::wuq_s,
      &M::qo, &M::ds0, &M::ds1, &M::ds0b, &M::ds1b, &M::bias0, &M::bias1, &M::slots, &M::q_out,
      &M::q_rope, &M::kv, &M::ctkv, &M::krope, &M::spare, &M::q_i8, &M::ctkv_i8, &M::spare8);
}

void run_mla_preprocess(fuzz::Run& run, std::uint64_t seed) {
  if (seed / 2 % 2 == 0)
    run_t<attnref::half>(run, seed);
  else
    run_t<attnref::bfloat16>(run, seed);
}

const fuzz::Register reg_mla_preprocess("mla_preprocess", run_mla_preprocess);

}  // namespace fuzz_mla_preprocess
