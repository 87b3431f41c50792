// The definitions of reference/atb_self_attention.hpp (documented there), compiled once into the
// attnref_test_reference library, with -O2 in every preset (see the top-level CMakeLists.txt).

#include "reference/atb_self_attention.hpp"

namespace ref {

std::vector<std::vector<double>> atb_self_attention(const AtbSelfAttention& pr,
                                                    const std::vector<std::vector<double>>& q,
                                                    const std::vector<std::vector<double>>& k,
                                                    const std::vector<std::vector<double>>& v) {
  const int G = pr.num_heads / pr.num_kv_heads;
  const int D = pr.head_size, Dv = pr.v_head_size, N = pr.num_heads, Nk = pr.num_kv_heads;
  std::vector<std::vector<double>> o(pr.seq_len.size());
  for (size_t b = 0; b < pr.seq_len.size(); ++b) {
    const int L = pr.seq_len[b];
    const int KL = pr.kv_len.empty() ? L : pr.kv_len[b];
    o[b].assign(static_cast<size_t>(L) * N * Dv, 0.0);
    if (KL == 0) continue;
    for (int h = 0; h < N; ++h) {
      const int hk = h / G;
      for (int i = 0; i < L; ++i) {
        std::vector<double> qi(D);  // q * qScale, rounded to the data type
        for (int d = 0; d < D; ++d)
          qi[d] = pr.to_dtype(q[b][(static_cast<size_t>(i) * N + h) * D + d] * pr.q_scale);
        std::vector<double> s(KL);
        for (int j = 0; j < KL; ++j) {
          double dot = 0.0;
          for (int d = 0; d < D; ++d)
            dot += qi[d] * k[b][(static_cast<size_t>(j) * Nk + hk) * D + d];
          double x = dot;
          const double log_n =
              pr.log_n.empty()
                  ? 1.0
                  : pr.log_n[static_cast<size_t>(pr.log_n_per_batch ? static_cast<int>(b) : i)];
          if (pr.fp16_scores) {
            x = round_fp16(x);
            if (!pr.log_n.empty()) x = round_fp16(x * log_n);
            x = round_fp16(x * round_fp16(pr.qk_scale));
          } else {
            x *= log_n;
            x *= pr.qk_scale;
          }
          if (pr.clamp) x = round_fp16(std::min(std::max(x, pr.clamp_min), pr.clamp_max));
          const double m = (pr.mask ? pr.mask(static_cast<int>(b), i, j) : 0.0) +
                           (pr.head_bias ? pr.head_bias(static_cast<int>(b), h, i, j) : 0.0);
          // The NPU adds the mask in fp16 (DEFAULT) or fp32: -3e38 absorbs the score in fp32.
          if (pr.fp16_scores)
            x = round_fp16(x + round_fp16(m));
          else
            x = static_cast<double>(static_cast<float>(x) + static_cast<float>(m));
          s[j] = x;
        }
        double mx = -INFINITY;
        for (double x : s) mx = std::max(mx, x);
        double sum = 0.0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int j = 0; j < KL; ++j)
          for (int e = 0; e < Dv; ++e)
            o[b][(static_cast<size_t>(i) * N + h) * Dv + e] +=
                s[j] / sum * v[b][(static_cast<size_t>(j) * Nk + hk) * Dv + e];
      }
    }
  }
  return o;
}

}  // namespace ref
