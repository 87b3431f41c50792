// The definitions of reference/naive_attention.hpp (documented there), compiled once into the
// attnref_test_reference library, with -O2 in every preset (see the top-level CMakeLists.txt).

#include "reference/naive_attention.hpp"

namespace ref {

Result attention(const Problem& pr, const Seqs& q, const Seqs& k, const Seqs& v) {
  const double inf = std::numeric_limits<double>::infinity();
  const int group = pr.num_heads / pr.num_kv_heads;
  const int D = pr.head_size;
  const int Dv = pr.v_head_size;
  Result r;
  const int batch = static_cast<int>(pr.q_len.size());
  r.o.resize(batch);
  r.lse.resize(batch);
  r.p.resize(batch);
  for (int b = 0; b < batch; ++b) {
    const int sq = pr.q_len[b];
    const int skv = pr.kv_len[b];
    r.o[b].assign(static_cast<size_t>(sq) * pr.num_heads * Dv, 0.0);
    r.lse[b].assign(static_cast<size_t>(pr.num_heads) * sq, -inf);
    r.p[b].assign(static_cast<size_t>(pr.num_heads) * sq * skv, 0.0);
    for (int h = 0; h < pr.num_heads; ++h) {
      const int hk = h / group;
      for (int i = 0; i < sq; ++i) {
        std::vector<double> logit(skv, -inf);
        std::vector<bool> visible(skv, false);
        double mx = -inf;
        for (int j = 0; j < skv; ++j) {
          bool hide = false;
          if (pr.causal == Causal::kTopLeft) hide = j > i;
          if (pr.causal == Causal::kBottomRight) hide = j > i + skv - sq;
          if (pr.causal != Causal::kNone && pr.window > 0) {
            const int diag = pr.causal == Causal::kTopLeft ? i : i + skv - sq;
            if (j <= diag - pr.window) hide = true;
          }
          if (!hide && pr.hidden && pr.hidden(b, h, i, j)) hide = true;
          double add = 0.0;
          if (!hide && pr.bias) {
            add = pr.bias(b, h, i, j);
            if (add == -inf) hide = true;
          }
          if (hide) continue;
          double dot = 0.0;
          for (int d = 0; d < D; ++d)
            dot += q[b][(static_cast<size_t>(i) * pr.num_heads + h) * D + d] *
                   k[b][(static_cast<size_t>(j) * pr.num_kv_heads + hk) * D + d];
          logit[j] = pr.scale * dot + add;
          visible[j] = true;
          if (logit[j] > mx) mx = logit[j];
        }
        double sum = 0.0;
        for (int j = 0; j < skv; ++j)
          if (visible[j]) sum += std::exp(logit[j] - mx);
        if (sum == 0.0) continue;  // no visible key: zeros, lse = -inf
        r.lse[b][static_cast<size_t>(h) * sq + i] = mx + std::log(sum);
        for (int j = 0; j < skv; ++j) {
          if (!visible[j]) continue;
          const double pj = std::exp(logit[j] - mx) / sum;
          r.p[b][(static_cast<size_t>(h) * sq + i) * skv + j] = pj;
          for (int d = 0; d < Dv; ++d)
            r.o[b][(static_cast<size_t>(i) * pr.num_heads + h) * Dv + d] +=
                pj * v[b][(static_cast<size_t>(j) * pr.num_kv_heads + hk) * Dv + d];
        }
      }
    }
  }
  return r;
}

}  // namespace ref
