#pragma once
// Independent reference of ATB SelfAttention (PA_ENCODER), written from docs/semantics.md §2.2–2.3.
// Double accumulation; the fp16 / fp32 rounding steps of the NPU are emulated explicitly with
// Eigen's half and with float. Does not include attnref.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace ref {

struct AtbSelfAttention {
  int num_heads = 1, num_kv_heads = 1, head_size = 1, v_head_size = 1;
  std::vector<int> seq_len;  // queries per sequence
  std::vector<int> kv_len;   // keys per sequence (empty: = seq_len)
  double q_scale = 1.0, qk_scale = 1.0;
  bool fp16_scores = false;  // kernelType DEFAULT with fp16 data
  bool clamp = false;
  double clamp_min = 0.0, clamp_max = 0.0;
  std::vector<float> log_n;      // empty: scaleType TOR
  bool log_n_per_batch = false;  // DECODER: log_n[b], else log_n[query position]
  // Mask term added to the score of (sequence b, query i, key j), already multiplied by the
  // encoding's coefficient (binary x -3e38, or the additive fp16 value).
  std::function<double(int b, int i, int j)> mask;
  // Per-head additive term (ALiBi masks), added like the mask.
  std::function<double(int b, int h, int i, int j)> head_bias;
  // Rounds a value to the data type (q * qScale is computed in the data type).
  std::function<double(double)> to_dtype = [](double x) { return x; };
};

inline double round_fp16(double x) {
  return static_cast<double>(static_cast<float>(Eigen::half(static_cast<float>(x))));
}

// q[b]: [len][num_heads][D]; k[b], v[b]: [len][num_kv_heads][D or Dv]. Returns o[b]:
// [len][num_heads][Dv].
inline std::vector<std::vector<double>> atb_self_attention(
    const AtbSelfAttention& pr, const std::vector<std::vector<double>>& q,
    const std::vector<std::vector<double>>& k, const std::vector<std::vector<double>>& v) {
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
        std::vector<double> s(KL);
        for (int j = 0; j < KL; ++j) {
          double dot = 0.0;
          for (int d = 0; d < D; ++d)
            dot += pr.to_dtype(q[b][(static_cast<size_t>(i) * N + h) * D + d] * pr.q_scale) *
                   k[b][(static_cast<size_t>(j) * Nk + hk) * D + d];
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
