#pragma once
// The shared scaffolding of the MLA preprocessing tests (mla_preprocess_stages_test.cpp,
// mla_preprocess_test.cpp, mla_preprocess_rejects_test.cpp): dtype helpers, a seeded generator,
// weights in every format, the poisoned caches of each cache mode and the Problem that owns every
// buffer of one mla_preprocess configuration.

#include <gtest/gtest.h>

#include <array>
#include <attnref/core/nz.hpp>
#include <attnref/core/quant.hpp>
#include <attnref/mla/mla_preprocess.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "reference/mla_preprocess.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/random.hpp"
#include "support/ulp.hpp"

namespace mla_preprocess_support {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::MlaCacheMode;
using attnref::MlaQuantMode;
using attnref::StridedView;
using attnref::WeightFormat;
using attnref::WeightRef;
using i8 = std::int8_t;
using i32 = std::int32_t;
using i64 = std::int64_t;
using support::as_doubles;
using support::as_floats;
using support::dbl;
using support::ulp_of;
using support::z;
namespace rm = ref::mla;

constexpr i8 kPoison8 = -77;  // int8 has no NaN: untouched int8 slots keep this sentinel
constexpr float kEps = 1e-5f;

// ---------------------------------------------------------------------------------------------
// Helpers.

template <class T>
constexpr rm::Dt dt_of() {
  return std::is_same_v<T, half> ? rm::Dt::F16 : rm::Dt::BF16;
}
template <class T>
std::string tname() {
  return std::is_same_v<T, half> ? "f16" : "bf16";
}
template <class T>
T tpoison() {
  return T(std::numeric_limits<float>::quiet_NaN());
}

template <class T>
std::vector<T> to_t(const std::vector<float>& v) {
  std::vector<T> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = T(v[i]);
  return r;
}
/// got (T) exactly equal to the reference's T values (floats).
template <class T>
::testing::AssertionResult equal_ref(const std::vector<T>& got, const std::vector<float>& want) {
  return support::bitwise_equal(got, to_t<T>(want));
}

template <class T>
int ulps(T a, T b) {
  auto key = [](T x) {
    std::uint16_t u = 0;
    std::memcpy(&u, &x, sizeof u);
    return (u & 0x8000u) ? -static_cast<int>(u & 0x7fffu) : static_cast<int>(u & 0x7fffu);
  };
  return std::abs(key(a) - key(b));
}

struct Rng {
  std::mt19937 g;
  explicit Rng(unsigned seed) : g(seed) {}
  template <class T>
  std::vector<T> normal(Index n, double sd = 1.0, double mean = 0.0) {
    std::normal_distribution<double> d(mean, sd);
    std::vector<T> v(z(n));
    for (T& x : v) x = T(static_cast<float>(d(g)));
    return v;
  }
  std::vector<i8> ints(Index n, int lo, int hi) { return support::rand_i8(z(n), g, lo, hi); }
  double uni(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(g); }
};

template <class U>
struct Nz {
  std::vector<U> data;
  std::array<Index, 4> shape{};
};

/// NZ of a batch of [rows, cols] matrices (nd_to_nz).
template <class U>
Nz<U> to_nz(const std::vector<U>& nd, Index batch, Index rows, Index cols) {
  Nz<U> r;
  r.shape = attnref::nz_shape<U>(batch, rows, cols);
  r.data.assign(z(r.shape[0] * r.shape[1] * r.shape[2] * r.shape[3]), U(0));
  attnref::nd_to_nz<U>(StridedView<const U, 3>(nd.data(), {batch, rows, cols}),
                       StridedView<U, 4>(r.data.data(), r.shape));
  return r;
}
/// [rows, cols] -> [cols, rows].
template <class U>
std::vector<U> transpose(const std::vector<U>& w, Index rows, Index cols) {
  std::vector<U> t(w.size());
  for (Index r = 0; r < rows; ++r)
    for (Index c = 0; c < cols; ++c) t[z(c * rows + r)] = w[z(r * cols + c)];
  return t;
}

/// A weight [out, in] in format `fmt`; `keep` owns the transposed / NZ copy.
template <class U>
WeightRef<U> weight(const std::vector<U>& w, Index out, Index in, WeightFormat fmt,
                    std::vector<U>& keep) {
  switch (fmt) {
    case WeightFormat::NdInOut:
      keep = transpose(w, out, in);
      return {StridedView<const U>(keep.data(), {in, out}), out, in, fmt};
    case WeightFormat::Nz: {
      Nz<U> n = to_nz(w, 1, out, in);
      keep = std::move(n.data);
      return {StridedView<const U>(keep.data(), {n.shape[1], n.shape[2], n.shape[3]}), out, in,
              fmt};
    }
    default:
      return {StridedView<const U>(w.data(), {out, in}), out, in, fmt};
  }
}

inline const char* fmt_name(WeightFormat f) {
  return f == WeightFormat::NdOutIn ? "NdOutIn" : f == WeightFormat::NdInOut ? "NdInOut" : "Nz";
}

// ---------------------------------------------------------------------------------------------
// Rope tables and caches.

template <class T>
std::pair<std::vector<T>, std::vector<T>> sin_cos(Rng& g, Index N, Index R) {
  std::vector<T> s(z(N * R)), c(z(N * R));
  for (size_t i = 0; i < s.size(); ++i) {
    const double th = g.uni(-3.2, 3.2);
    s[i] = T(static_cast<float>(std::sin(th)));
    c[i] = T(static_cast<float>(std::cos(th)));
  }
  return {s, c};
}

/// The caches of one cache mode (others empty), poisoned.
template <class T>
struct Caches {
  std::vector<T> kv, ctkv, krope;
  std::vector<i8> ctkv_i8;
  Index blocks = 0, bs = 0;
  int cm = 0;

  Caches(int mode, Index nblocks, Index block_size, Index C, Index R)
      : blocks(nblocks), bs(block_size), cm(mode) {
    const size_t rows = z(blocks * bs);
    if (cm == 0) kv.assign(rows * z(C + R), tpoison<T>());
    if (cm == 1 || cm == 3) ctkv.assign(rows * z(C), tpoison<T>());
    if (cm == 2) ctkv_i8.assign(rows * z(C), kPoison8);
    if (cm != 0) krope.assign(rows * z(R), tpoison<T>());
  }
  attnref::MlaCaches<T> refs(Index C, Index R) {
    attnref::MlaCaches<T> c;
    switch (cm) {
      case 0:
        c.kv_cache = StridedView<T>(kv.data(), {blocks, bs, 1, C + R});
        break;
      case 1:
        c.ctkv = StridedView<T>(ctkv.data(), {blocks, bs, 1, C});
        c.krope = StridedView<T>(krope.data(), {blocks, bs, 1, R});
        break;
      case 2:
        c.ctkv_i8 = StridedView<i8>(ctkv_i8.data(), {blocks, C / 32, bs, 32});
        c.krope = StridedView<T>(krope.data(), {blocks, R / 16, bs, 16});
        break;
      default:
        c.ctkv = StridedView<T>(ctkv.data(), {blocks, C / 16, bs, 16});
        c.krope = StridedView<T>(krope.data(), {blocks, R / 16, bs, 16});
    }
    return c;
  }
  /// Writes the reference's rows (k_nope / k_rope T values, k8 for Int8NzCache) in token order.
  void write_expected(const std::vector<i32>& slots, const std::vector<float>& kn,
                      const std::vector<float>& kr, const std::vector<i8>& k8, Index C, Index R) {
    const int ic = static_cast<int>(C), ir = static_cast<int>(R), ib = static_cast<int>(bs);
    for (size_t t = 0; t < slots.size(); ++t) {
      const i32 s = slots[t];
      if (s < 0) continue;
      const int block = s / ib, off = s % ib;
      const size_t row = z(Index{block} * bs + off);
      for (int j = 0; j < ic; ++j) {
        const float v = kn[t * z(C) + z(j)];
        if (cm == 0) kv[row * z(C + R) + z(j)] = T(v);
        if (cm == 1) ctkv[row * z(C) + z(j)] = T(v);
        if (cm == 2) ctkv_i8[rm::nz_cache_index(block, off, j, ic, ib, 32)] = k8[t * z(C) + z(j)];
        if (cm == 3) ctkv[rm::nz_cache_index(block, off, j, ic, ib, 16)] = T(v);
      }
      for (int j = 0; j < ir; ++j) {
        const T v(kr[t * z(R) + z(j)]);
        if (cm == 0) kv[row * z(C + R) + z(C + j)] = v;
        if (cm == 1) krope[row * z(R) + z(j)] = v;
        if (cm >= 2) krope[rm::nz_cache_index(block, off, j, ir, ib, 16)] = v;
      }
    }
  }
};

template <class T>
::testing::AssertionResult same_caches(const Caches<T>& a, const Caches<T>& b) {
  for (auto r : {support::bitwise_equal(a.kv, b.kv), support::bitwise_equal(a.ctkv, b.ctkv),
                 support::bitwise_equal(a.krope, b.krope)})
    if (!r) return r;
  return support::bitwise_equal(a.ctkv_i8, b.ctkv_i8);
}

/// Slots of N tokens into `cap` slots: distinct, then token 1 skipped (-1), token 2 on the last
/// slot, the last token on token 0's slot (the later write wins).
inline std::vector<i32> make_slots(Index N, Index cap) {
  std::vector<i32> s(z(N));
  for (Index t = 0; t < N; ++t) s[z(t)] = static_cast<i32>((t * 37 + 11) % cap);
  if (N >= 3) {
    s[1] = -1;
    s[z(N - 1)] = s[0];
  }
  if (N >= 4) s[2] = static_cast<i32>(cap - 1);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Stage 7: mla_preprocess. A Problem owns every buffer of one configuration and builds the
// library's inputs / outputs and the reference's inputs from them. The data depend only on
// (dims, heads, N, quant mode, block size, seed), so problems differing in cache mode, weight
// format, de_scale form or thread count see the same numbers.

struct Cfg {
  attnref::MlaDims dims{96, 64, 16, 48, 16};
  Index heads = 3, N = 5;
  int qm = 0, cm = 0;
  bool nz = false;    // NZ wdqkv / wuq (int8, or T in Unquant) and NZ wuk
  bool bits = false;  // de_scale as int64 bits
  bool beta = true;   // beta0 / beta1 given
  bool bias = true;   // bias0 / bias1 given (per-tensor mode only)
  Index bs = 128;     // cache block size
  int threads = 1;
  unsigned seed = 1;

  std::string str() const {
    return "qm " + std::to_string(qm) + " cm " + std::to_string(cm) + " N " + std::to_string(N) +
           (nz ? " NZ" : " ND") + (bits ? " bits" : "") + (beta ? "" : " no-beta") +
           (bias ? "" : " no-bias") + " bs " + std::to_string(bs) + " threads " +
           std::to_string(threads);
  }
};

/// The outputs of mla_preprocess (q_out, q_out_i8, q_rope) and the caches.
template <class T>
struct Outs {
  std::vector<T> q_out, q_rope;
  std::vector<i8> q_out_i8;
  Caches<T> caches;
};

template <class T>
::testing::AssertionResult same_outs(const Outs<T>& a, const Outs<T>& b) {
  for (auto r :
       {support::bitwise_equal(a.q_out, b.q_out), support::bitwise_equal(a.q_rope, b.q_rope)})
    if (!r) return r;
  if (auto r = support::bitwise_equal(a.q_out_i8, b.q_out_i8); !r) return r;
  return same_caches(a.caches, b.caches);
}

template <class T>
struct Problem {
  Cfg c;
  Index H0, C, R, Q, P, NH, N, W1, W2, blocks;
  std::vector<T> input, gamma0, beta0, gamma1, beta1, gamma2, sin, cos, wuk, qns;
  std::vector<T> wdqkv_f, wuq_f;  // Unquant
  std::vector<i8> wdqkv, wuq;
  std::vector<float> ds0, ds1;
  std::vector<i64> ds0b, ds1b;
  std::vector<i32> bias0, bias1, slots;
  T qs0, qs1, qs3;
  i8 qo0 = 3, qo1 = -2;
  // NZ copies
  std::vector<i8> wdqkv_nz, wuq_nz;
  std::vector<T> wdqkv_fnz, wuq_fnz, wuk_nz;
  std::vector<Index> s_wdqkv, s_wuq, s_wuk;
  Outs<T> o;

  explicit Problem(const Cfg& cfg)
      : c(cfg),
        H0(cfg.dims.hidden_size),
        C(cfg.dims.kv_lora_rank),
        R(cfg.dims.rope_dim),
        Q(cfg.dims.q_lora_rank),
        P(cfg.dims.nope_dim),
        NH(cfg.heads),
        N(cfg.N),
        W1(C + R + Q),
        W2(NH * (P + R)),
        blocks(cfg.bs == 128 ? 2 : 3),
        qs0(0.03f),
        qs1(0.04f),
        qs3(0.05f),
        o{{}, {}, {}, Caches<T>(cfg.cm, cfg.bs == 128 ? 2 : 3, cfg.bs, C, R)} {
    Rng g(cfg.seed);
    input = g.normal<T>(N * H0);
    gamma0 = g.normal<T>(H0, 0.1, 1.0);
    beta0 = g.normal<T>(H0, 0.1);
    gamma1 = g.normal<T>(Q, 0.1, 1.0);
    beta1 = g.normal<T>(Q, 0.1);
    gamma2 = g.normal<T>(C, 0.1, 1.0);
    std::tie(sin, cos) = sin_cos<T>(g, N, R);
    wuk = g.normal<T>(NH * P * C, 1.0 / std::sqrt(double(P)));
    for (Index h = 0; h < NH; ++h) qns.push_back(T(16.0f + 2.5f * static_cast<float>(h % 3)));
    wdqkv = g.ints(W1 * H0, -127, 127);
    wuq = g.ints(W2 * Q, -127, 127);
    // de_scale so that mm1 / mm2 are O(1): acc ≈ Σ (y / qs) · w (per tensor), Σ y · w / d.
    auto scales = [&](Index rows, Index K, float qs, std::vector<float>& ds, std::vector<i64>& dsb,
                      std::vector<i32>& bias) {
      const double base = (c.qm == 0 ? double(qs) : 1.0) / (std::sqrt(double(K)) * 73.0);
      for (Index n = 0; n < rows; ++n) {
        ds.push_back(static_cast<float>(base * g.uni(0.8, 1.2)));
        dsb.push_back(static_cast<i64>(attnref::scale_to_bits(ds.back())));
        bias.push_back(static_cast<i32>(g.uni(-400, 400)));
      }
    };
    scales(W1, H0, static_cast<float>(qs0), ds0, ds0b, bias0);
    scales(W2, Q, static_cast<float>(qs1), ds1, ds1b, bias1);
    if (c.qm == 3) {
      wdqkv_f = g.normal<T>(W1 * H0, 1.0 / std::sqrt(double(H0)));
      wuq_f = g.normal<T>(W2 * Q, 1.0 / std::sqrt(double(Q)));
    }
    slots = make_slots(N, blocks * c.bs);
    if (c.nz) {
      auto put = [](auto nz, auto& data, std::vector<Index>& shape, int rank) {
        data = std::move(nz.data);
        shape.assign(nz.shape.begin() + (4 - rank), nz.shape.end());
      };
      if (c.qm == 3) {
        put(to_nz(wdqkv_f, 1, W1, H0), wdqkv_fnz, s_wdqkv, 3);
        put(to_nz(wuq_f, 1, W2, Q), wuq_fnz, s_wuq, 3);
      } else {
        put(to_nz(wdqkv, 1, W1, H0), wdqkv_nz, s_wdqkv, 3);
        put(to_nz(wuq, 1, W2, Q), wuq_nz, s_wuq, 3);
      }
      put(to_nz(wuk, NH, P, C), wuk_nz, s_wuk, 4);
    }
    const size_t nh = z(N * NH);
    if (c.cm == 0) o.q_out.assign(nh * z(C + R), tpoison<T>());
    if (c.cm == 1 || c.cm == 3) o.q_out.assign(nh * z(C), tpoison<T>());
    if (c.cm == 2) o.q_out_i8.assign(nh * z(C), kPoison8);
    if (c.cm != 0) o.q_rope.assign(nh * z(R), tpoison<T>());
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  attnref::MlaPreprocessParams params() const {
    attnref::MlaPreprocessParams p;
    p.dims = c.dims;
    p.epsilon = kEps;
    p.quant_mode = static_cast<MlaQuantMode>(c.qm);
    p.cache_mode = static_cast<MlaCacheMode>(c.cm);
    return p;
  }

  attnref::MlaPreprocessInputs<T> inputs() const {
    attnref::MlaPreprocessInputs<T> in;
    using CT = StridedView<const T>;
    in.input = CT(input.data(), {N, H0});
    in.gamma0 = CT(gamma0.data(), {H0});
    in.gamma1 = CT(gamma1.data(), {Q});
    in.gamma2 = CT(gamma2.data(), {C});
    if (c.beta) {
      in.beta0 = CT(beta0.data(), {H0});
      in.beta1 = CT(beta1.data(), {Q});
    }
    in.sin = CT(sin.data(), {N, R});
    in.cos = CT(cos.data(), {N, R});
    in.wuk = c.nz ? attnref::WukRef<T>{CT(wuk_nz.data(), s_wuk), true}
                  : attnref::WukRef<T>{CT(wuk.data(), {NH, P, C}), false};
    in.slot_mapping = StridedView<const i32>(slots.data(), {N});
    if (c.qm == 3) {
      in.wdqkv_float = c.nz ? WeightRef<T>{CT(wdqkv_fnz.data(), s_wdqkv), W1, H0, WeightFormat::Nz}
                            : WeightRef<T>{CT(wdqkv_f.data(), {W1, H0}), W1, H0};
      in.wuq_float = c.nz ? WeightRef<T>{CT(wuq_fnz.data(), s_wuq), W2, Q, WeightFormat::Nz}
                          : WeightRef<T>{CT(wuq_f.data(), {W2, Q}), W2, Q};
    } else {
      using CI = StridedView<const i8>;
      in.wdqkv = c.nz ? WeightRef<i8>{CI(wdqkv_nz.data(), s_wdqkv), W1, H0, WeightFormat::Nz}
                      : WeightRef<i8>{CI(wdqkv.data(), {W1, H0}), W1, H0};
      in.wuq = c.nz ? WeightRef<i8>{CI(wuq_nz.data(), s_wuq), W2, Q, WeightFormat::Nz}
                    : WeightRef<i8>{CI(wuq.data(), {W2, Q}), W2, Q};
      if (c.bits) {
        in.de_scale0_bits = StridedView<const i64>(ds0b.data(), {W1});
        in.de_scale1_bits = StridedView<const i64>(ds1b.data(), {W2});
      } else {
        in.de_scale0 = StridedView<const float>(ds0.data(), {W1});
        in.de_scale1 = StridedView<const float>(ds1.data(), {W2});
      }
      if (c.qm == 0) {
        in.quant_scale0 = CT(&qs0, {1});
        in.quant_offset0 = CI(&qo0, {1});
        in.quant_scale1 = CT(&qs1, {1});
        in.quant_offset1 = CI(&qo1, {1});
        if (c.bias) {
          in.bias0 = StridedView<const i32>(bias0.data(), {W1});
          in.bias1 = StridedView<const i32>(bias1.data(), {W2});
        }
      }
    }
    if (c.cm == 2) {
      in.ctkv_scale = CT(&qs3, {1});
      in.q_nope_scale = CT(qns.data(), {NH});
    }
    return in;
  }

  attnref::MlaPreprocessOutputs<T> outputs() {
    attnref::MlaPreprocessOutputs<T> out;
    if (c.cm == 0) out.q_out = StridedView<T>(o.q_out.data(), {N, NH, C + R});
    if (c.cm == 1 || c.cm == 3) out.q_out = StridedView<T>(o.q_out.data(), {N, NH, C});
    if (c.cm == 2) out.q_out_i8 = StridedView<i8>(o.q_out_i8.data(), {N, NH, C});
    if (c.cm != 0) out.q_rope_out = StridedView<T>(o.q_rope.data(), {N, NH, R});
    out.caches = o.caches.refs(C, R);
    return out;
  }

  void run() { attnref::mla_preprocess<T>(params(), inputs(), outputs(), {c.threads}); }

  rm::ChainOut reference() const {
    rm::ChainIn ci;
    ci.input = as_floats(input);
    ci.gamma0 = as_floats(gamma0);
    ci.gamma1 = as_floats(gamma1);
    ci.gamma2 = as_floats(gamma2);
    if (c.beta) {
      ci.beta0 = as_floats(beta0);
      ci.beta1 = as_floats(beta1);
    }
    ci.quant_scale0 = static_cast<float>(qs0);
    ci.quant_offset0 = qo0;
    ci.quant_scale1 = static_cast<float>(qs1);
    ci.quant_offset1 = qo1;
    ci.wdqkv = wdqkv;
    ci.wuq = wuq;
    ci.wdqkv_f = as_floats(wdqkv_f);
    ci.wuq_f = as_floats(wuq_f);
    if (c.qm == 0 && c.bias) {
      ci.bias0 = bias0;
      ci.bias1 = bias1;
    }
    ci.descale0 = ds0;
    ci.descale1 = ds1;
    ci.sin = as_floats(sin);
    ci.cos = as_floats(cos);
    ci.wuk = as_floats(wuk);
    ci.slots.assign(slots.begin(), slots.end());
    ci.quant_scale3 = static_cast<float>(qs3);
    ci.q_nope_scale = as_floats(qns);
    rm::Dims d;
    d.hidden = static_cast<int>(H0);
    d.kv_lora = static_cast<int>(C);
    d.rope = static_cast<int>(R);
    d.q_lora = static_cast<int>(Q);
    d.nope = static_cast<int>(P);
    d.heads = static_cast<int>(NH);
    return rm::chain(d, c.qm, c.cm, ci, static_cast<int>(N), kEps, dt_of<T>());
  }

  /// The outputs and caches the reference gives (the untouched parts poisoned as here).
  Outs<T> expected(const rm::ChainOut& r) const {
    Outs<T> e{{}, {}, {}, Caches<T>(c.cm, blocks, c.bs, C, R)};
    e.q_out.assign(o.q_out.size(), tpoison<T>());
    e.q_rope.assign(o.q_rope.size(), tpoison<T>());
    e.q_out_i8.assign(o.q_out_i8.size(), kPoison8);
    for (Index th = 0; th < N * NH; ++th) {
      for (Index j = 0; j < C; ++j) {
        const float v = r.q_nope_T[z(th * C + j)];
        if (c.cm == 0) e.q_out[z(th * (C + R) + j)] = T(v);
        if (c.cm == 1 || c.cm == 3) e.q_out[z(th * C + j)] = T(v);
        if (c.cm == 2) e.q_out_i8[z(th * C + j)] = r.q_nope_i8[z(th * C + j)];
      }
      for (Index j = 0; j < R; ++j) {
        const T v(r.q_rope[z(th * R + j)]);
        if (c.cm == 0)
          e.q_out[z(th * (C + R) + C + j)] = v;
        else
          e.q_rope[z(th * R + j)] = v;
      }
    }
    e.caches.write_expected(slots, r.k_nope, r.k_rope, r.k_nope_i8, C, R);
    return e;
  }

  /// The fp32 accumulation bound of each q_nope · wuk element: P · 2^-24 · Σ|q · w|.
  std::vector<double> nope_slack(const rm::ChainOut& r) const {
    std::vector<double> s(z(N * NH * C));
    for (Index t = 0; t < N; ++t)
      for (Index h = 0; h < NH; ++h)
        for (Index j = 0; j < C; ++j) {
          double a = 0.0;
          for (Index k = 0; k < P; ++k)
            a += std::fabs(double(r.mm2[z(t * W2 + h * (P + R) + k)]) *
                           dbl(wuk[z((h * P + k) * C + j)]));
          s[z((t * NH + h) * C + j)] = double(P + 2) * 0x1p-24 * a;
        }
    return s;
  }
};

}  // namespace mla_preprocess_support
