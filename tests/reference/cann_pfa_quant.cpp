// The definitions of reference/cann_pfa_quant.hpp (documented there), compiled once into the
// attnref_test_reference library, with -O2 in every preset (see the top-level CMakeLists.txt).

#include "reference/cann_pfa_quant.hpp"

namespace ref::cann {

PfaQuantResult pfa_quant(const PfaQuant& p, const std::vector<std::int8_t>& q8,
                         const std::vector<std::int8_t>& k8, const std::vector<std::int8_t>& v8) {
  const int G = p.heads / p.kv_heads, D = p.d, S = p.seq;
  PfaQuantResult r;
  r.out.assign(static_cast<size_t>(p.batch * S * p.heads * D), 0.0);
  r.slack.assign(static_cast<size_t>(p.batch * S * p.heads), 0.0);
  auto qi = [&](int b, int i, int h, int e) {
    return static_cast<size_t>(((b * S + i) * p.heads + h) * D + e);
  };
  auto ki = [&](int b, int j, int h, int e) {
    return static_cast<size_t>(((b * S + j) * p.kv_heads + h) * D + e);
  };
  for (int b = 0; b < p.batch; ++b)
    for (int i = 0; i < S; ++i)
      for (int h = 0; h < p.heads; ++h) {
        const int hk = h / G, n = p.causal ? i + 1 : S;
        std::vector<float> s(static_cast<size_t>(n));
        for (int j = 0; j < n; ++j) {
          std::int64_t dot = 0;
          for (int e = 0; e < D; ++e) dot += std::int64_t{q8[qi(b, i, h, e)]} * k8[ki(b, j, hk, e)];
          volatile float a = static_cast<float>(dot) * p.deq1;  // one rounding per step
          volatile float c = a * p.scale;
          s[static_cast<size_t>(j)] = c;
        }
        double m = -std::numeric_limits<double>::infinity(), l = 0.0, flagged_vmax = 0.0;
        std::vector<double> o(static_cast<size_t>(D), 0.0);
        for (int j0 = 0; j0 < n; j0 += p.block) {
          const int j1 = std::min(n, j0 + p.block);
          double mn = m;
          for (int j = j0; j < j1; ++j)
            mn = std::max(mn, static_cast<double>(s[static_cast<size_t>(j)]));
          const double alpha = std::isinf(m) ? 0.0 : std::exp(m - mn);
          l *= alpha;
          for (double& x : o) x *= alpha;
          flagged_vmax *= alpha;
          for (int j = j0; j < j1; ++j) {
            const double ph = std::exp(static_cast<double>(s[static_cast<size_t>(j)]) - mn);
            l += ph;
            const double x = ph * p.qs1;
            const double p8 = std::clamp(std::nearbyint(x), -128.0, 127.0);
            double vmax = 0.0;
            for (int e = 0; e < D; ++e) {
              const double v = v8[ki(b, j, hk, e)];
              o[static_cast<size_t>(e)] += p.deq2 * p8 * v;
              vmax = std::max(vmax, std::fabs(v));
            }
            if (std::fabs(x - std::floor(x) - 0.5) < 1e-3) flagged_vmax += std::fabs(p.deq2) * vmax;
          }
          m = mn;
        }
        for (int e = 0; e < D; ++e) r.out[qi(b, i, h, e)] = o[static_cast<size_t>(e)] / l;
        r.slack[static_cast<size_t>((b * S + i) * p.heads + h)] = flagged_vmax / l;
      }
  return r;
}

}  // namespace ref::cann
