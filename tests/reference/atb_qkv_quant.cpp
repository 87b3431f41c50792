// The definitions of reference/atb_qkv_quant.hpp (documented there), compiled once into the
// attnref_test_reference library, with -O2 in every preset (see the top-level CMakeLists.txt).

#include "reference/atb_qkv_quant.hpp"

namespace ref {

QuantResult atb_qkv_quant(const AtbQkvQuant& pr, const std::vector<std::vector<std::int8_t>>& q,
                          const std::vector<std::vector<std::int8_t>>& k,
                          const std::vector<std::vector<std::int8_t>>& v) {
  const int N = pr.num_heads, Nk = pr.num_kv_heads, G = N / Nk, D = pr.head_size,
            Dv = pr.v_head_size;
  const bool online = pr.p_scale.empty();
  QuantResult res;
  for (size_t b = 0; b < pr.seq_len.size(); ++b) {
    const int L = pr.seq_len[b];
    std::vector<double> o(static_cast<size_t>(L) * N * Dv, 0.0);
    std::vector<char> tie(static_cast<size_t>(L) * N, 0);
    for (int h = 0; h < N; ++h) {
      const int hk = h / G;
      for (int i = 0; i < L; ++i) {
        std::vector<double> s(static_cast<size_t>(L));
        for (int j = 0; j < L; ++j) {
          std::int64_t dot = 0;
          for (int d = 0; d < D; ++d)
            dot += static_cast<std::int64_t>(q[b][(static_cast<size_t>(i) * N + h) * D + d]) *
                   k[b][(static_cast<size_t>(j) * Nk + hk) * D + d];
          // fp16(fp32(int32 · qkDescale)), then · fp16(qkScale) in fp16
          double x = fp16(static_cast<float>(dot) * pr.qk_descale[static_cast<size_t>(h)]);
          x = fp16(x * fp16(pr.qk_scale));
          if (pr.clamp) x = fp16(std::min(std::max(x, pr.clamp_min), pr.clamp_max));
          const double m = (pr.mask ? pr.mask(static_cast<int>(b), i, j) : 0.0) +
                           (pr.head_bias ? pr.head_bias(static_cast<int>(b), h, i, j) : 0.0);
          s[static_cast<size_t>(j)] = fp16(x + fp16(m));
        }
        double mx = -INFINITY, l = 0.0, amax = 0.0;
        std::vector<double> acc(static_cast<size_t>(Dv), 0.0);
        for (int j0 = 0; j0 < L; j0 += pr.block) {
          const int j1 = std::min(L, j0 + pr.block);
          double mb = -INFINITY;
          for (int j = j0; j < j1; ++j) mb = std::max(mb, s[static_cast<size_t>(j)]);
          const double m_new = std::max(mx, mb);
          if (m_new == -INFINITY) continue;  // nothing visible yet
          const double alpha = std::exp(mx - m_new);
          std::vector<double> p(static_cast<size_t>(j1 - j0));
          double blk_max = 0.0;
          std::vector<double> alt(static_cast<size_t>(j1 - j0), -1.0);  // the other rounding
          for (int j = j0; j < j1; ++j) {
            const double e = std::exp(s[static_cast<size_t>(j)] - m_new);
            const double ph = fp16(e);
            // A float exp is within a few ulps (4e-7) of e: P̂ could round the other way.
            for (double f : {1.0 - 4e-7, 1.0 + 4e-7})
              if (fp16(e * f) != ph) alt[static_cast<size_t>(j - j0)] = fp16(e * f);
            p[static_cast<size_t>(j - j0)] = ph;
            blk_max = std::max(blk_max, ph);
          }
          double blk_sum = 0.0;
          for (double ph : p) blk_sum += ph;
          l = l * alpha + blk_sum;
          float scale;
          if (online) {
            amax = std::max(amax, blk_max);
            scale = static_cast<float>(amax) / 127.0f;
          } else {
            scale = pr.p_scale[static_cast<size_t>(h)];
          }
          std::vector<std::int64_t> p8(p.size(), 0);
          for (size_t t = 0; t < p.size(); ++t) {
            if (scale == 0.0f) break;
            const float x = static_cast<float>(p[t]) / scale;  // fp32 division
            if (alt[t] >= 0.0 &&
                std::nearbyint(static_cast<float>(alt[t]) / scale) != std::nearbyint(x))
              tie[static_cast<size_t>(i) * N + h] = 1;  // ... and move P8 by one step
            p8[t] = static_cast<std::int64_t>(std::clamp(std::nearbyint(x), -128.0f, 127.0f));
          }
          const double factor = static_cast<double>(pr.vpv_descale[static_cast<size_t>(h)]) *
                                static_cast<double>(scale);
          for (int e = 0; e < Dv; ++e) {
            std::int64_t pv = 0;
            for (int j = j0; j < j1; ++j)
              pv += p8[static_cast<size_t>(j - j0)] *
                    v[b][(static_cast<size_t>(j) * Nk + hk) * Dv + e];
            acc[static_cast<size_t>(e)] =
                acc[static_cast<size_t>(e)] * alpha + factor * static_cast<double>(pv);
          }
          mx = m_new;
        }
        for (int e = 0; e < Dv; ++e)
          o[(static_cast<size_t>(i) * N + h) * Dv + e] =
              l > 0.0 ? acc[static_cast<size_t>(e)] / l : 0.0;
      }
    }
    res.out.push_back(std::move(o));
    res.tie.push_back(std::move(tie));
  }
  return res;
}

}  // namespace ref
