// The definitions of reference/mla_preprocess.hpp (documented there), compiled once into the
// attnref_test_reference library, with -O2 in every preset (see the top-level CMakeLists.txt).

#include "reference/mla_preprocess.hpp"

namespace ref {
namespace mla {

float f32_odd(double x) {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) == x || !std::isfinite(f)) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);  // trunc
  std::uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 1u) == 0u) f = std::nextafter(f, x > 0 ? INFINITY : -INFINITY);  // the odd one
  return f;
}

std::vector<float> rms_norm(const std::vector<float>& x, int rows, int n,
                            const std::vector<float>& gamma, float eps) {
  need(x.size() == ix(rows, n, 0) && gamma.size() == static_cast<size_t>(n), "rms_norm: sizes");
  std::vector<float> y(x.size());
  for (int i = 0; i < rows; ++i) {
    double sum = 0.0;
    for (int j = 0; j < n; ++j) sum += static_cast<double>(x[ix(i, n, j)]) * x[ix(i, n, j)];
    const float ss = f32(sum);
    const float ms = dvd(ss, static_cast<float>(n));
    const float r = dvd(1.0f, f32(std::sqrt(static_cast<double>(add(ms, eps)))));
    for (int j = 0; j < n; ++j) y[ix(i, n, j)] = mul(mul(x[ix(i, n, j)], r), gamma[j]);
  }
  return y;
}

Quantized rms_norm_quant(int mode, const std::vector<float>& x, int rows, int n,
                         const std::vector<float>& gamma, const std::vector<float>& beta,
                         float quant_scale, int quant_offset, float eps, Dt dt) {
  need(mode >= 0 && mode <= 3, "rms_norm_quant: mode");
  need(beta.empty() || beta.size() == static_cast<size_t>(n), "rms_norm_quant: beta size");
  std::vector<float> yb = rms_norm(x, rows, n, gamma, eps);
  if (!beta.empty())
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < n; ++j) yb[ix(i, n, j)] = add(yb[ix(i, n, j)], beta[j]);

  Quantized out;
  if (mode == 3) {
    out.unquant.resize(yb.size());
    for (size_t k = 0; k < yb.size(); ++k) out.unquant[k] = rnd(yb[k], dt);
    return out;
  }
  out.q.resize(yb.size());
  if (mode == 0) {
    const float inv = f32(1.0 / static_cast<double>(quant_scale));
    const float o = static_cast<float>(quant_offset);
    for (size_t k = 0; k < yb.size(); ++k)
      out.q[k] = static_cast<std::int8_t>(sat8_rne(add(mul(yb[k], inv), o)));
    return out;
  }
  out.descale.resize(static_cast<size_t>(rows));
  if (mode == 2) out.zero_point.resize(static_cast<size_t>(rows));
  std::vector<float> h(static_cast<size_t>(n));
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < n; ++j) h[j] = rnd(yb[ix(i, n, j)], dt);  // T(yb), yb is fp32
    std::int8_t* q = &out.q[ix(i, n, 0)];
    if (mode == 1) {
      float a = 0.0f;
      for (float v : h) a = std::max(a, std::fabs(v));
      if (a == 0.0f) {
        std::fill(q, q + n, std::int8_t{0});
        out.descale[i] = 0.0f;
        continue;
      }
      const float s = dvd(127.0f, a);
      for (int j = 0; j < n; ++j) q[j] = static_cast<std::int8_t>(sat8_rne(mul(h[j], s)));
      out.descale[i] = dvd(1.0f, s);
    } else {
      const float lo = *std::min_element(h.begin(), h.end());
      const float hi = *std::max_element(h.begin(), h.end());
      const float s = hi == lo ? 1.0f : dvd(sub(hi, lo), 255.0f);
      const float zp = sub(-128.0f, dvd(lo, s));
      for (int j = 0; j < n; ++j) q[j] = static_cast<std::int8_t>(sat8_rne(add(dvd(h[j], s), zp)));
      out.descale[i] = s;
      out.zero_point[i] = zp;
    }
  }
  return out;
}

std::vector<float> int8_matmul(int mode, const std::vector<std::int8_t>& a, int M, int K,
                               const std::vector<std::int8_t>& w, int Nout,
                               const std::vector<std::int32_t>& bias,
                               const std::vector<float>& descale, const std::vector<float>& d,
                               const std::vector<float>& zp, Dt dt) {
  need(mode >= 0 && mode <= 2, "int8_matmul: mode");
  need(a.size() == ix(M, K, 0) && w.size() == ix(Nout, K, 0), "int8_matmul: sizes");
  need(descale.size() == static_cast<size_t>(Nout), "int8_matmul: descale size");
  need(bias.empty() || (mode == 0 && bias.size() == static_cast<size_t>(Nout)),
       "int8_matmul: bias (mode 0 only, [Nout])");
  need(mode == 0 || d.size() == static_cast<size_t>(M), "int8_matmul: d size");
  need(mode != 2 || zp.size() == static_cast<size_t>(M), "int8_matmul: zp size");
  std::vector<float> out(ix(M, Nout, 0));
  for (int n = 0; n < Nout; ++n) {
    std::int64_t colsum = 0;
    for (int k = 0; k < K; ++k) colsum += w[ix(n, K, k)];
    for (int m = 0; m < M; ++m) {
      std::int64_t acc = 0;
      for (int k = 0; k < K; ++k) acc += static_cast<std::int64_t>(a[ix(m, K, k)]) * w[ix(n, K, k)];
      float v = 0.0f;
      if (mode == 0) {
        const std::int64_t b = bias.empty() ? 0 : bias[n];
        v = mul(f32(static_cast<double>(acc + b)), descale[n]);
      } else if (mode == 1) {
        v = mul(mul(f32(static_cast<double>(acc)), descale[n]), d[m]);
      } else {
        const float corr = mul(zp[m], f32(static_cast<double>(colsum)));
        v = mul(mul(sub(f32(static_cast<double>(acc)), corr), descale[n]), d[m]);
      }
      out[ix(m, Nout, n)] = rnd(v, dt);
    }
  }
  return out;
}

std::vector<float> float_matmul(const std::vector<float>& a, int M, int K,
                                const std::vector<float>& w, int Nout, Dt dt) {
  need(a.size() == ix(M, K, 0) && w.size() == ix(Nout, K, 0), "float_matmul: sizes");
  std::vector<float> out(ix(M, Nout, 0));
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < Nout; ++n) {
      double sum = 0.0;
      for (int k = 0; k < K; ++k) sum += static_cast<double>(a[ix(m, K, k)]) * w[ix(n, K, k)];
      out[ix(m, Nout, n)] = rnd(f32(sum), dt);
    }
  return out;
}

std::vector<float> rope(const std::vector<float>& x, int N, int heads, int R,
                        const std::vector<float>& sin, const std::vector<float>& cos, Dt dt) {
  need(R % 2 == 0, "rope: R must be even");
  need(x.size() == ix(N, heads * R, 0) && sin.size() == ix(N, R, 0) && cos.size() == sin.size(),
       "rope: sizes");
  const int half = R / 2;
  std::vector<float> out(x.size());
  for (int t = 0; t < N; ++t)
    for (int h = 0; h < heads; ++h) {
      const float* xr = &x[ix(t, heads * R, h * R)];
      for (int j = 0; j < R; ++j) {
        const float rot = j < half ? -xr[j + half] : xr[j - half];
        const float a = rnd(static_cast<double>(xr[j]) * cos[ix(t, R, j)], dt);
        const float b = rnd(static_cast<double>(rot) * sin[ix(t, R, j)], dt);
        out[ix(t, heads * R, h * R + j)] = rnd(add(a, b), dt);
      }
    }
  return out;
}

std::vector<float> q_wuk(const std::vector<float>& qn, int N, int Nh, int P,
                         const std::vector<float>& wuk, int C) {
  need(qn.size() == ix(N * Nh, P, 0) && wuk.size() == ix(Nh * P, C, 0), "q_wuk: sizes");
  std::vector<float> out(ix(N * Nh, C, 0));
  for (int t = 0; t < N; ++t)
    for (int h = 0; h < Nh; ++h)
      for (int c = 0; c < C; ++c) {
        double sum = 0.0;
        for (int k = 0; k < P; ++k)
          sum += static_cast<double>(qn[ix(t * Nh + h, P, k)]) * wuk[ix(h * P + k, C, c)];
        out[ix(t * Nh + h, C, c)] = f32(sum);
      }
  return out;
}

std::vector<float> norm_matmul(int quant_mode, const std::vector<float>& x, int N, int K,
                               const std::vector<float>& gamma, const std::vector<float>& beta,
                               float qs, int qo, const std::vector<std::int8_t>& w,
                               const std::vector<float>& w_f, int Nout,
                               const std::vector<std::int32_t>& bias,
                               const std::vector<float>& descale, float eps, Dt dt) {
  const Quantized xq = rms_norm_quant(quant_mode, x, N, K, gamma, beta, qs, qo, eps, dt);
  if (quant_mode == 3) return float_matmul(xq.unquant, N, K, w_f, Nout, dt);
  return int8_matmul(quant_mode, xq.q, N, K, w, Nout, bias, descale, xq.descale, xq.zero_point, dt);
}

ChainOut chain(const Dims& d, int quant_mode, int cache_mode, const ChainIn& in, int N, float eps,
               Dt dt) {
  need(cache_mode >= 0 && cache_mode <= 3, "chain: cache_mode");
  const int C = d.kv_lora, R = d.rope, Q = d.q_lora, P = d.nope, Nh = d.heads;
  const int W1 = C + R + Q, W2 = Nh * (P + R);
  ChainOut o;

  // Steps 1-2: mm1 = [kv (C + R) | ql (Q)].
  o.mm1 = norm_matmul(quant_mode, in.input, N, d.hidden, in.gamma0, in.beta0, in.quant_scale0,
                      in.quant_offset0, in.wdqkv, in.wdqkv_f, W1, in.bias0, in.descale0, eps, dt);

  // Steps 3-5: mm2 = matmul(RmsNormQuant(ql), wuq) = per head [q_nope (P) | q_rope (R)].
  std::vector<float> ql(ix(N, Q, 0));
  for (int t = 0; t < N; ++t)
    for (int j = 0; j < Q; ++j) ql[ix(t, Q, j)] = o.mm1[ix(t, W1, C + R + j)];
  o.mm2 = norm_matmul(quant_mode, ql, N, Q, in.gamma1, in.beta1, in.quant_scale1, in.quant_offset1,
                      in.wuq, in.wuq_f, W2, in.bias1, in.descale1, eps, dt);

  // Step 6: split per head, RoPE on the rope part.
  std::vector<float> qn(ix(N * Nh, P, 0)), qr(ix(N * Nh, R, 0));
  for (int t = 0; t < N; ++t)
    for (int h = 0; h < Nh; ++h) {
      for (int j = 0; j < P; ++j) qn[ix(t * Nh + h, P, j)] = o.mm2[ix(t, W2, h * (P + R) + j)];
      for (int j = 0; j < R; ++j) qr[ix(t * Nh + h, R, j)] = o.mm2[ix(t, W2, h * (P + R) + P + j)];
    }
  o.q_rope = rope(qr, N, Nh, R, in.sin, in.cos, dt);

  // Step 7: stage 5.
  const std::vector<float> qw = q_wuk(qn, N, Nh, P, in.wuk, C);
  o.q_nope_T.resize(qw.size());
  for (size_t k = 0; k < qw.size(); ++k) o.q_nope_T[k] = rnd(qw[k], dt);
  if (cache_mode == 2) {
    need(in.q_nope_scale.size() == static_cast<size_t>(Nh), "chain: q_nope_scale size");
    o.q_nope_i8.resize(qw.size());
    for (int th = 0; th < N * Nh; ++th)
      for (int c = 0; c < C; ++c)
        o.q_nope_i8[ix(th, C, c)] =
            q_nope_quant(o.q_nope_T[ix(th, C, c)], in.q_nope_scale[th % Nh], dt);
  }

  // Step 8: the K path (stage 6).
  std::vector<float> kv_n(ix(N, C, 0)), kv_r(ix(N, R, 0));
  for (int t = 0; t < N; ++t) {
    for (int j = 0; j < C; ++j) kv_n[ix(t, C, j)] = o.mm1[ix(t, W1, j)];
    for (int j = 0; j < R; ++j) kv_r[ix(t, R, j)] = o.mm1[ix(t, W1, C + j)];
  }
  const std::vector<float> y = rms_norm(kv_n, N, C, in.gamma2, eps);
  o.k_nope.resize(y.size());
  for (size_t k = 0; k < y.size(); ++k) o.k_nope[k] = rnd(y[k], dt);
  o.k_rope = rope(kv_r, N, 1, R, in.sin, in.cos, dt);
  if (cache_mode == 2) {
    o.k_nope_i8.resize(o.k_nope.size());
    for (size_t k = 0; k < o.k_nope.size(); ++k)
      o.k_nope_i8[k] = k_nope_quant(o.k_nope[k], in.quant_scale3, dt);
  }
  return o;
}

}  // namespace mla
}  // namespace ref
