#pragma once
// Independent reference of ATB PagedAttention (decode), from docs/semantics.md §3: the caller
// gathers each sequence's keys and values through the block table; scores, softmax and P·V in
// double. Does not include attnref.

#include <cmath>
#include <functional>
#include <vector>

namespace ref {

struct AtbPaged {
  int num_heads = 1, num_kv_heads = 1, head_size = 1, v_head_size = 1;
  double qk_scale = 1.0;
  std::vector<float> log_n;                          // empty: scaleType TOR
  std::function<double(int b, int t)> mask;          // NORM term
  std::function<double(int b, int h, int t)> alibi;  // ALIBI term
  // A per-key term added to q·k BEFORE qk_scale (razor attention's razorOffset): the same value
  // for every head of the sequence.
  std::function<double(int b, int t)> key_bias;
};

// q[b]: [heads * D]; k[b]: [len][kv heads * D]; v[b]: [len][kv heads * Dv] (len = k[b].size()).
// Returns [batch][heads][Dv] flattened; a sequence without keys gives zeros.
inline std::vector<double> atb_paged_attention(
    const AtbPaged& pr, const std::vector<std::vector<double>>& q,
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
