// The definitions of reference/atb_paged_modes.hpp (documented there), compiled once into the
// attnref_test_reference library, with -O2 in every preset (see the top-level CMakeLists.txt).

#include "reference/atb_paged_modes.hpp"

namespace ref {

float fp16_rne(float x) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  int e = 0;
  std::frexp(x, &e);                       // |x| in [2^(e-1), 2^e)
  const int step = std::max(e - 11, -24);  // exponent of the fp16 step at |x|
  const double n = std::nearbyint(std::ldexp(static_cast<double>(x), -step));  // exact scaling
  const double y = std::ldexp(n, step);
  if (std::fabs(y) >= 65520.0) return x > 0 ? INFINITY : -INFINITY;
  return static_cast<float>(y);
}

std::vector<double> paged_rows(const PagedModes& pr, const Rows& q, const std::vector<int>& seq,
                               const std::vector<Rows>& k, const std::vector<Rows>& v) {
  const int N = pr.num_heads, G = N / pr.num_kv_heads, D = pr.head_size, Dv = pr.v_head_size;
  std::vector<double> o(q.size() * static_cast<size_t>(N * Dv), 0.0);
  for (size_t r = 0; r < q.size(); ++r) {
    const size_t b = static_cast<size_t>(seq[r]);
    const int L = static_cast<int>(k[b].size());
    for (int h = 0; h < N && L > 0; ++h) {
      const size_t hk = static_cast<size_t>(h / G);
      std::vector<double> s(static_cast<size_t>(L));
      double mx = -INFINITY;
      for (int t = 0; t < L; ++t) {
        double dot = 0.0;
        for (int d = 0; d < D; ++d)
          dot += q[r][static_cast<size_t>(h * D + d)] * k[b][static_cast<size_t>(t)][hk * D + d];
        double x = dot * pr.qk_scale;
        if (!pr.log_n.empty()) x *= pr.log_n[b];
        if (pr.bias) x += pr.bias(static_cast<int>(r), h, t);
        s[static_cast<size_t>(t)] = x;
        mx = std::max(mx, x);
      }
      double sum = 0.0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      double* out = &o[(r * N + static_cast<size_t>(h)) * Dv];
      for (int t = 0; t < L; ++t)
        for (int e = 0; e < Dv; ++e)
          out[e] += s[static_cast<size_t>(t)] / sum * v[b][static_cast<size_t>(t)][hk * Dv + e];
    }
  }
  return o;
}

std::vector<double> dequant(const std::int8_t* x, const std::vector<float>& descale,
                            const std::vector<std::int32_t>& offset) {
  std::vector<double> y(descale.size());
  for (size_t c = 0; c < y.size(); ++c)
    y[c] = (static_cast<double>(x[c]) + (offset.empty() ? 0.0 : offset[c])) * descale[c];
  return y;
}

QkvResult paged_qkv(const PagedQkv& pr, const Rows8& q, const std::vector<int>& seq,
                    const std::vector<Rows8>& k, const std::vector<Rows8>& v) {
  const int N = pr.num_heads, G = N / pr.num_kv_heads, D = pr.head_size, Dv = pr.v_head_size;
  const bool online = pr.p_scale.empty();
  QkvResult res;
  res.out.assign(q.size() * static_cast<size_t>(N * Dv), 0.0);
  res.mag.assign(res.out.size(), 0.0);
  res.slack.assign(q.size() * static_cast<size_t>(N), 0.0);
  for (size_t r = 0; r < q.size(); ++r) {
    const size_t b = static_cast<size_t>(seq[r]);
    const int L = static_cast<int>(k[b].size());
    for (int h = 0; h < N && L > 0; ++h) {
      const size_t hk = static_cast<size_t>(h / G), hs = static_cast<size_t>(h);
      std::vector<float> s(static_cast<size_t>(L));
      for (int t = 0; t < L; ++t) {
        std::int64_t dot = 0;
        for (int d = 0; d < D; ++d)
          dot += static_cast<std::int64_t>(q[r][static_cast<size_t>(h * D + d)]) *
                 k[b][static_cast<size_t>(t)][hk * D + d];
        float x = f32_mul(f32_mul(static_cast<float>(dot), pr.k_descale[hs]), pr.qk_scale);
        if (pr.mask) x = f32_add(x, pr.mask(static_cast<int>(r), t));
        s[static_cast<size_t>(t)] = x;
      }
      float m = -INFINITY;
      double l = 0.0, slack = 0.0;
      std::vector<double> acc(static_cast<size_t>(Dv), 0.0), mag(static_cast<size_t>(Dv), 0.0);
      for (int j0 = 0; j0 < L; j0 += pr.block) {
        const int j1 = std::min(L, j0 + pr.block), n = j1 - j0;
        float m_new = m;
        for (int t = j0; t < j1; ++t) m_new = std::max(m_new, s[static_cast<size_t>(t)]);
        const double alpha = std::exp(static_cast<double>(f32_sub(m, m_new)));  // first: 0
        std::vector<float> ph(static_cast<size_t>(n));
        float bmax = 0.0f;
        double psum = 0.0;
        for (int t = 0; t < n; ++t) {
          const float d = f32_sub(s[static_cast<size_t>(j0 + t)], m_new);
          ph[static_cast<size_t>(t)] = static_cast<float>(std::exp(static_cast<double>(d)));
          bmax = std::max(bmax, ph[static_cast<size_t>(t)]);
          psum += ph[static_cast<size_t>(t)];
        }
        float factor = pr.v_descale[hs], scale = 0.0f;
        if (online) {
          scale = f32_div(bmax, 127.0f);
          factor = f32_div(f32_mul(pr.v_descale[hs], bmax), 127.0f);
        }
        std::vector<int> p8(static_cast<size_t>(n), 0), steps(static_cast<size_t>(n), 0);
        for (int t = 0; t < n && !(online && bmax == 0.0f); ++t) {
          const float p = ph[static_cast<size_t>(t)];
          const float x = online ? f32_div(p, scale) : f32_mul(p, pr.p_scale[hs]);
          const int q8 = sat8_rint_fp16(x);
          const int lo = sat8_rint_fp16(static_cast<double>(x) * (1.0 - pr.tie_window));
          const int hi = sat8_rint_fp16(static_cast<double>(x) * (1.0 + pr.tie_window));
          p8[static_cast<size_t>(t)] = q8;
          steps[static_cast<size_t>(t)] = std::max(q8 - lo, hi - q8);
          ++res.quantized;
          if (steps[static_cast<size_t>(t)] != 0) ++res.near_ties;
        }
        l = l * alpha + psum;
        slack *= alpha;
        for (int t = 0; t < n; ++t) {
          if (steps[static_cast<size_t>(t)] == 0) continue;
          int vmax = 0;
          for (int e = 0; e < Dv; ++e)
            vmax = std::max(
                vmax, std::abs(static_cast<int>(v[b][static_cast<size_t>(j0 + t)][hk * Dv + e])));
          slack += std::fabs(static_cast<double>(factor)) * steps[static_cast<size_t>(t)] * vmax;
        }
        for (int e = 0; e < Dv; ++e) {
          std::int64_t pv = 0, pa = 0;
          for (int t = 0; t < n; ++t) {
            const std::int64_t term =
                static_cast<std::int64_t>(p8[static_cast<size_t>(t)]) *
                v[b][static_cast<size_t>(j0 + t)][hk * Dv + static_cast<size_t>(e)];
            pv += term;
            pa += term < 0 ? -term : term;
          }
          const size_t es = static_cast<size_t>(e);
          acc[es] = acc[es] * alpha + static_cast<double>(factor) * static_cast<double>(pv);
          mag[es] = mag[es] * alpha + std::fabs(static_cast<double>(factor)) * pa;
        }
        m = m_new;
      }
      for (int e = 0; e < Dv; ++e) {
        const size_t i = (r * N + hs) * Dv + static_cast<size_t>(e);
        res.out[i] = acc[static_cast<size_t>(e)] / l;
        res.mag[i] = mag[static_cast<size_t>(e)] / l;
      }
      res.slack[r * N + hs] = slack / l;
    }
  }
  return res;
}

}  // namespace ref
