// The definitions of reference/nsa.hpp (documented there), compiled once into the
// attnref_test_reference library, with -O2 in every preset (see the top-level CMakeLists.txt).

#include "reference/nsa.hpp"

namespace ref::nsa {

std::vector<double> overlap_scores(const std::vector<double>& P, const Blocks& g,
                                   long compressed_first) {
  const long cmp = static_cast<long>(P.size());
  const long ns = select_blocks(cmp, g);
  std::vector<double> s(static_cast<size_t>(ns), 0.0);
  for (long p = 0; p < ns; ++p) {
    // Only keys whose interval can reach [p·l', (p+1)·l') (a superset; the overlap decides).
    const long t_lo = std::max(0L, (p * g.ls - g.l) / g.d + compressed_first - 1);
    const long t_hi = std::min(cmp, (p + 1) * g.ls / g.d + compressed_first + 1);
    for (long t = t_lo; t < t_hi; ++t) {
      const long start = (t - compressed_first) * g.d;
      const long ov = overlap_len(start, start + g.l, p * g.ls, (p + 1) * g.ls);
      if (ov % g.d != 0) return {};  // cannot happen when d | l and d | l'
      s[static_cast<size_t>(p)] += static_cast<double>(ov / g.d) * P[static_cast<size_t>(t)];
    }
  }
  return s;
}

std::vector<double> index_scores(const std::vector<double>& P, const Blocks& g, long shift) {
  const long cmp = static_cast<long>(P.size());
  const long ns = select_blocks(cmp, g), a = g.ls / g.d, c = g.l / g.d;
  std::vector<double> s(static_cast<size_t>(ns), 0.0);
  for (long p = 0; p < ns; ++p)
    for (long m = 0; m < a; ++m)
      for (long n = 0; n < c; ++n) {
        const long idx = a * (p + 1) - m - n - (1 - shift);
        if (idx >= 0 && idx < cmp) s[static_cast<size_t>(p)] += P[static_cast<size_t>(idx)];
      }
  return s;
}

void force_blocks(std::vector<double>& s) {
  const long n = static_cast<long>(s.size());
  const double inf = std::numeric_limits<double>::infinity();
  for (long b : {0L, n - 2, n - 1})
    if (b >= 0 && b < n) s[static_cast<size_t>(b)] = inf;
}

std::vector<std::int32_t> topk(const std::vector<double>& s, long k) {
  std::vector<std::int32_t> idx(s.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](std::int32_t x, std::int32_t y) {
    return s[static_cast<size_t>(x)] > s[static_cast<size_t>(y)];
  });
  std::vector<std::int32_t> out(static_cast<size_t>(k), -1);
  for (long i = 0; i < k && i < static_cast<long>(idx.size()); ++i)
    out[static_cast<size_t>(i)] = idx[static_cast<size_t>(i)];
  return out;
}

Result run(const Problem& pr, const Batch& b) {
  Result r;
  const long cmp = b.cmp;
  const int N = pr.N, KVN = pr.KVN, G = pr.N / pr.KVN;
  r.n_sel = select_blocks(cmp, pr.g);
  const long ns = r.n_sel;
  const size_t Q = static_cast<size_t>(b.q_len);
  r.probs.assign(Q * N * cmp, 0.0);
  r.out.assign(Q * N * pr.Dv, 0.0);
  r.head_scores.assign(Q * N * ns, 0.0);
  r.group_scores.assign(Q * KVN * ns, 0.0);
  r.topk.assign(Q * KVN * pr.k, -1);
  const long tail = b.sel - ((cmp - 1) * pr.g.d + pr.g.l);
  for (int i = 0; i < b.q_len; ++i) {
    const bool masked = pr.mask && b.q_len > 1 && cmp > 0 && b.q_len - i - 1 > tail;
    for (int h = 0; h < N; ++h) {
      const int kh = h / G;
      std::vector<double> s(static_cast<size_t>(cmp));
      for (long t = 0; t < cmp; ++t) {
        double dot = 0.0;
        for (int x = 0; x < pr.Dqk; ++x)
          dot += b.q[(static_cast<size_t>(i) * N + h) * pr.Dqk + x] *
                 b.k[(static_cast<size_t>(t) * KVN + kh) * pr.Dqk + x];
        s[static_cast<size_t>(t)] = dot * pr.scale;
      }
      if (masked) s[static_cast<size_t>(cmp - 1)] = -3e38;
      std::vector<double> P(static_cast<size_t>(cmp), 0.0);
      if (cmp > 0) {
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0.0;
        for (long t = 0; t < cmp; ++t) sum += std::exp(s[static_cast<size_t>(t)] - mx);
        for (long t = 0; t < cmp; ++t)
          P[static_cast<size_t>(t)] = std::exp(s[static_cast<size_t>(t)] - mx) / sum;
      }
      const size_t row = static_cast<size_t>(i) * N + h;
      for (long t = 0; t < cmp; ++t) {
        r.probs[row * cmp + t] = P[static_cast<size_t>(t)];
        const double pt =
            pr.round_p ? round_to(pr.dt, P[static_cast<size_t>(t)]) : P[static_cast<size_t>(t)];
        for (int x = 0; x < pr.Dv; ++x)
          r.out[row * pr.Dv + x] += pt * b.v[(static_cast<size_t>(t) * KVN + kh) * pr.Dv + x];
      }
      const std::vector<double> hs = overlap_scores(P, pr.g);
      for (long p = 0; p < ns; ++p) {
        r.head_scores[row * ns + p] = hs[static_cast<size_t>(p)];
        r.group_scores[(static_cast<size_t>(i) * KVN + kh) * ns + p] += hs[static_cast<size_t>(p)];
      }
    }
    for (int kh = 0; kh < KVN; ++kh) {
      const size_t gr = static_cast<size_t>(i) * KVN + kh;
      std::vector<double> gs(r.group_scores.begin() + static_cast<long>(gr * ns),
                             r.group_scores.begin() + static_cast<long>((gr + 1) * ns));
      force_blocks(gs);
      std::copy(gs.begin(), gs.end(), r.group_scores.begin() + static_cast<long>(gr * ns));
      const auto tk = topk(gs, pr.k);
      std::copy(tk.begin(), tk.end(), r.topk.begin() + static_cast<long>(gr * pr.k));
    }
  }
  return r;
}

}  // namespace ref::nsa
