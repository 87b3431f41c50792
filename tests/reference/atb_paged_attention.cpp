// The definitions of reference/atb_paged_attention.hpp (documented there), compiled once into the
// attnref_test_reference library, with -O2 in every preset (see the top-level CMakeLists.txt).

#include "reference/atb_paged_attention.hpp"

namespace ref {

std::vector<double> atb_paged_attention(const AtbPaged& pr,
                                        const std::vector<std::vector<double>>& q,
                                        const std::vector<std::vector<std::vector<double>>>& k,
                                        const std::vector<std::vector<std::vector<double>>>& v) {
  const int N = pr.num_heads, G = N / pr.num_kv_heads, D = pr.head_size, Dv = pr.v_head_size;
  std::vector<double> o(q.size() * static_cast<size_t>(N * Dv), 0.0);
  for (size_t b = 0; b < q.size(); ++b) {
    const int L = static_cast<int>(k[b].size());
    if (L == 0) continue;
    for (int h = 0; h < N; ++h) {
      const int hk = h / G;
      std::vector<double> s(static_cast<size_t>(L));
      double mx = -INFINITY;
      for (int t = 0; t < L; ++t) {
        double dot = 0.0;
        for (int d = 0; d < D; ++d)
          dot += q[b][static_cast<size_t>(h * D + d)] *
                 k[b][static_cast<size_t>(t)][static_cast<size_t>(hk * D + d)];
        if (pr.key_bias) dot += pr.key_bias(static_cast<int>(b), t);
        double x = dot * pr.qk_scale;
        if (!pr.log_n.empty()) x *= pr.log_n[b];
        if (pr.mask) x += pr.mask(static_cast<int>(b), t);
        if (pr.alibi) x += pr.alibi(static_cast<int>(b), h, t);
        s[static_cast<size_t>(t)] = x;
        mx = std::max(mx, x);
      }
      double sum = 0.0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int t = 0; t < L; ++t)
        for (int e = 0; e < Dv; ++e)
          o[(b * static_cast<size_t>(N) + static_cast<size_t>(h)) * static_cast<size_t>(Dv) +
            static_cast<size_t>(e)] +=
              s[static_cast<size_t>(t)] / sum *
              v[b][static_cast<size_t>(t)][static_cast<size_t>(hk * Dv + e)];
    }
  }
  return o;
}

}  // namespace ref
