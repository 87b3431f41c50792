#pragma once
// Independent reference of CANN aclnnNsaCompressAttentionInfer (docs/semantics.md §8, §10 item 7,
// "Five facts" item 5), written from the definition, in double, over one dense array per batch:
//   q [q_len][N][Dqk], k [cmp][KV_N][Dqk], v [cmp][KV_N][Dv]   (already rounded to the input type)
//
// Per batch, query token i, head h (kv head h / G, G = N / KV_N):
//   s_t = q·k_t · scale; multi-token mask (mask flag and q_len > 1): s_{cmp-1} = -3e38 when
//   q_len - i - 1 > tail, tail = sel - ((cmp - 1)·d + l); P = softmax(s);
//   out = Σ_t R(P_t)·v_t, R = rounding of P to the output type (Dt);
//   per-head importance score of select block p < nSel = ceil(((cmp - 1)·d + l) / l') from the
//   paper's block-overlap definition (below); group score = Σ over the G heads of the group;
//   blocks 0, nSel - 2, nSel - 1 forced to +inf; top-k descending, ties to the lower index, -1
//   past nSel.
//
// The overlap definition. Cut the raw tokens into chunks of d (d | l, d | l'); a = l'/d, c = l/d.
// The NSA paper numbers blocks from 1: select block j >= 1 covers raw [(j-1)·l', j·l') = chunks
// a(j-1) .. aj-1, and compressed block i >= 1 covers raw [(i-1)·d, (i-1)·d + l) = chunks
// i-1 .. i+c-2. Its weight in select block j is the overlap in chunks (overlap length / d):
//   #{n < c : a(j-1) <= i-1+n <= aj-1} = #{(m, n) : m < a, n < c, i-1+n = aj-1-m}
//                                      = #{(m, n) : i = aj - m - n},
// so Σ_i overlap(i, j)·p_cmp[i] = Σ_m Σ_n p_cmp[aj - m - n]: the paper's formula IS the overlap,
// with BOTH j and i 1-based. The kernel evaluates it at j = p + 1 for its 0-based select block p
// and reads p_cmp[x] from its 0-based probability array P[x] (P[0] = the first compressed key):
//   score[p] = Σ_m Σ_n P[a(p+1) - m - n].
// That is the overlap above with the select block j = p + 1 (raw [p·l', (p+1)·l')) and the
// compressed key stored at array index t taken as the paper's block number i = t, i.e. as
// covering raw [(t-1)·d, (t-1)·d + l). So overlap_scores() below uses exactly that convention
// (compressed_first = 1: array index t is block number t). With the physical 0-based geometry
// (key t covers [t·d, t·d + l), compressed_first = 0) the overlap is Σ P[a(p+1) - 1 - m - n]:
// the kernel's (and attnref's) choice is one stride later than the physical overlap — the
// "p + 1" of docs/semantics.md §10 item 7. index_scores() is the index formula written directly.
//
// No include of attnref; Eigen only for the fp16 / bf16 roundings.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

namespace ref::nsa {

enum class Dt { F16, BF16, F32 };

/// x rounded to the type (round to nearest even, via float like the operator's fp32 P).
inline double round_to(Dt dt, double x) {
  const float f = static_cast<float>(x);
  switch (dt) {
    case Dt::F16:
      return static_cast<double>(static_cast<float>(Eigen::half(f)));
    case Dt::BF16:
      return static_cast<double>(static_cast<float>(Eigen::bfloat16(f)));
    case Dt::F32:
      return static_cast<double>(f);
  }
  return x;
}

struct Blocks {
  long l = 32, d = 16, ls = 64;  // compress block size, stride, select block size
};

/// Number of select blocks covering the raw span of cmp compressed keys (0 without keys).
inline long select_blocks(long cmp, const Blocks& g) {
  if (cmp <= 0) return 0;
  const long covered = (cmp - 1) * g.d + g.l;
  return (covered + g.ls - 1) / g.ls;
}

inline long overlap_len(long a0, long a1, long b0, long b1) {
  return std::max(0L, std::min(a1, b1) - std::max(a0, b0));
}

/// Per-head select-block scores from raw-token interval overlaps. Compressed key t (array index
/// 0..cmp-1) is taken as covering raw [(t - compressed_first)·d, (t - compressed_first)·d + l);
/// select block p covers [p·l', (p+1)·l'); weight = overlap length / d. compressed_first = 1 is
/// the paper's 1-based reading the kernel uses (see the header comment).
inline std::vector<double> overlap_scores(const std::vector<double>& P, const Blocks& g,
                                          long compressed_first = 1) {
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

/// The kernel's index formula, written directly: Σ_{m<a} Σ_{n<c} P[a(p+1) - m - n] (shift = 1;
/// shift = 0 gives the physical overlap a(p+1) - 1 - m - n), indices outside [0, cmp) dropped.
inline std::vector<double> index_scores(const std::vector<double>& P, const Blocks& g,
                                        long shift = 1) {
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

/// Blocks 0, n-2, n-1 (those that exist) set to +inf.
inline void force_blocks(std::vector<double>& s) {
  const long n = static_cast<long>(s.size());
  const double inf = std::numeric_limits<double>::infinity();
  for (long b : {0L, n - 2, n - 1})
    if (b >= 0 && b < n) s[static_cast<size_t>(b)] = inf;
}

/// The k largest indices, descending, ties to the lower index; -1 past s.size().
inline std::vector<std::int32_t> topk(const std::vector<double>& s, long k) {
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

struct Problem {
  int N = 1, KVN = 1, Dqk = 1, Dv = 1;
  double scale = 1.0;
  Blocks g;
  long k = 1;
  bool mask = false;  // the attention-mask flag
  Dt dt = Dt::F16;    // output type: P is rounded to it before P·V
  bool round_p = true;
};

struct Batch {
  int q_len = 1;
  long cmp = 0, sel = 0;        // compressed / raw lengths
  std::vector<double> q, k, v;  // [q_len][N][Dqk], [cmp][KVN][Dqk], [cmp][KVN][Dv]
};

struct Result {  // per batch
  long n_sel = 0;
  std::vector<double> probs;         // [q_len][N][cmp]
  std::vector<double> out;           // [q_len][N][Dv] (not rounded)
  std::vector<double> head_scores;   // [q_len][N][n_sel]
  std::vector<double> group_scores;  // [q_len][KVN][n_sel], forced blocks +inf
  std::vector<std::int32_t> topk;    // [q_len][KVN][k]
};

inline Result run(const Problem& pr, const Batch& b) {
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
