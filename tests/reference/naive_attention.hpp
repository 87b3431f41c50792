#pragma once
// Independent naive reference for scaled dot-product attention.
//
// Written from the documented formula only; it shares no code with include/attnref (it does not
// even include it). Plain loops, double accumulation, per-sequence dense arrays:
//   q[b]: [q_len[b]][num_heads][head_size]
//   k[b]: [kv_len[b]][num_kv_heads][head_size]
//   v[b]: [kv_len[b]][num_kv_heads][v_head_size]
// For query i, head h of sequence b, key j is hidden when
//   causal top-left:     j > i
//   causal bottom-right: j > i + kv_len - q_len
//   sliding window W (with a causal mode): also j <= i' - W, where i' = i (top-left) or
//                        i + kv_len - q_len (bottom-right)
//   hidden(b, h, i, j) returns true, or bias(b, h, i, j) returns -infinity.
// logit = scale * sum_d q·k + bias;  p = exp(logit - max) / sum;  o = sum_j p_j v_j.
// A query with no visible key gets o = 0, lse = -inf and p = 0.

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

namespace ref {

enum class Causal { kNone, kTopLeft, kBottomRight };

struct Problem {
  int num_heads = 1;
  int num_kv_heads = 1;
  int head_size = 1;
  int v_head_size = 1;
  std::vector<int> q_len;   // one entry per sequence
  std::vector<int> kv_len;  // one entry per sequence
  double scale = 1.0;
  Causal causal = Causal::kNone;
  int window = 0;                                          // 0: none
  std::function<bool(int b, int h, int i, int j)> hidden;  // optional boolean mask
  std::function<double(int b, int h, int i, int j)> bias;  // optional additive mask
};

using Seqs = std::vector<std::vector<double>>;  // one dense array per sequence

struct Result {
  Seqs o;    // [q_len][num_heads][v_head_size]
  Seqs lse;  // [num_heads][q_len], natural log
  Seqs p;    // [num_heads][q_len][kv_len]
};

inline Result attention(const Problem& pr, const Seqs& q, const Seqs& k, const Seqs& v) {
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
