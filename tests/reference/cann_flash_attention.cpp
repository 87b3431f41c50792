// The definitions of reference/cann_flash_attention.hpp (documented there), compiled once into the
// attnref_test_reference library, with -O2 in every preset (see the top-level CMakeLists.txt).

#include "reference/cann_flash_attention.hpp"

namespace ref::cann {

namespace {

// Softmax over the candidate scores (kNotCandidate: not one) times V; adds into o[0..dv).
// value_row(j) points at key j's value row. Returns the row's log-sum-exp, kNotCandidate (-inf)
// when there is no candidate. A NaN score (NaN read from an input) propagates to the output.
// `sink`: a logit that joins the denominator (as exp(sink - max)) without a value row and
// without entering the returned log-sum-exp.
template <class ValueRow>
double softmax_pv(const std::vector<double>& s, int dv, ValueRow&& value_row, double* o,
                  double sink = kNotCandidate) {
  double mx = kNotCandidate;
  for (double x : s)
    if (x != kNotCandidate) mx = std::isnan(x) || std::isnan(mx) ? std::nan("") : std::max(mx, x);
  if (mx == kNotCandidate) return kNotCandidate;
  double sum = 0.0;
  for (double x : s)
    if (x != kNotCandidate) sum += std::exp(x - mx);
  const double denominator = sum + std::exp(sink - mx);
  for (size_t j = 0; j < s.size(); ++j) {
    if (s[j] == kNotCandidate) continue;
    const double p = std::exp(s[j] - mx) / denominator;
    const double* v = value_row(static_cast<int>(j));
    for (int e = 0; e < dv; ++e) o[e] += p * v[e];
  }
  return mx + std::log(sum);
}

}  // namespace

Seqs pfa(const Pfa& pr, const Seqs& q, const Seqs& k, const Seqs& v, Seqs* lse) {
  const int N = pr.num_heads, G = N / pr.num_kv_heads, D = pr.head_size, Dv = pr.v_head_size;
  const int KVN = pr.num_kv_heads;
  Seqs o(q.size());
  if (lse) lse->assign(q.size(), {});
  for (size_t bi = 0; bi < q.size(); ++bi) {
    const int b = static_cast<int>(bi), S1 = pr.q_len[bi], S2 = pr.kv_len[bi];
    o[bi].assign(static_cast<size_t>(S1) * N * Dv, 0.0);
    if (lse) (*lse)[bi].assign(static_cast<size_t>(S1) * N, kNotCandidate);
    const bool user = pr.mask && (pr.sparse_mode == 0 || pr.sparse_mode == 1);
    for (int h = 0; h < N; ++h) {
      const int hk = h / G;
      for (int i = 0; i < S1; ++i) {
        std::vector<double> s(static_cast<size_t>(S2), kNotCandidate);
        for (int j = 0; j < S2; ++j) {
          if (pr.excluded(b, i, j)) continue;
          const bool masked = user && pr.mask(b, i, j);
          if (masked && (pr.inner_precise & 2)) continue;
          double dot = 0.0;
          for (int d = 0; d < D; ++d)
            dot += q[bi][(static_cast<size_t>(i) * N + h) * D + d] *
                   k[bi][(static_cast<size_t>(j) * KVN + hk) * D + d];
          const double p = pr.pse ? pr.pse(b, h, i, j) : 0.0;
          double x = pr.add_then_scale ? (dot + p) * pr.scale : dot * pr.scale + p;
          if (masked) x = -static_cast<double>(FLT_MAX);
          s[static_cast<size_t>(j)] = x;
        }
        const double l = softmax_pv(
            s, Dv, [&](int j) { return &v[bi][(static_cast<size_t>(j) * KVN + hk) * Dv]; },
            &o[bi][(static_cast<size_t>(i) * N + h) * Dv], pr.sink ? pr.sink(h) : kNotCandidate);
        if (lse) (*lse)[bi][static_cast<size_t>(h) * S1 + i] = l;
      }
    }
  }
  return o;
}

Seqs ifa(const Ifa& pr, const Seqs& q, const Seqs& k, const Seqs& v, Seqs* lse) {
  const int N = pr.num_heads, KVN = pr.num_kv_heads, G = N / KVN, D = pr.head_size;
  Seqs o(q.size());
  if (lse) lse->assign(q.size(), {});
  for (size_t bi = 0; bi < q.size(); ++bi) {
    const int b = static_cast<int>(bi), L = pr.kv_len[bi];
    o[bi].assign(static_cast<size_t>(N) * D, 0.0);
    if (lse) (*lse)[bi].assign(static_cast<size_t>(N), kNotCandidate);
    for (int h = 0; h < N; ++h) {
      const int hk = h / G;
      std::vector<double> s(static_cast<size_t>(L));
      for (int j = 0; j < L; ++j) {
        double dot = 0.0;
        for (int d = 0; d < D; ++d)
          dot += q[bi][static_cast<size_t>(h) * D + d] *
                 k[bi][(static_cast<size_t>(j) * KVN + hk) * D + d];
        const double p = pr.pse ? pr.pse(b, h, j) : 0.0;
        double x = pr.add_then_scale ? (dot + p) * pr.scale : dot * pr.scale + p;
        if (pr.mask && pr.mask(b, j)) x = -1e12;
        s[static_cast<size_t>(j)] = x;
      }
      const double l = softmax_pv(
          s, D, [&](int j) { return &v[bi][(static_cast<size_t>(j) * KVN + hk) * D]; },
          &o[bi][static_cast<size_t>(h) * D]);
      if (lse) (*lse)[bi][static_cast<size_t>(h)] = l;
    }
  }
  return o;
}

}  // namespace ref::cann
