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
std::vector<double> overlap_scores(const std::vector<double>& P, const Blocks& g,
                                   long compressed_first = 1);

/// The kernel's index formula, written directly: Σ_{m<a} Σ_{n<c} P[a(p+1) - m - n] (shift = 1;
/// shift = 0 gives the physical overlap a(p+1) - 1 - m - n), indices outside [0, cmp) dropped.
std::vector<double> index_scores(const std::vector<double>& P, const Blocks& g, long shift = 1);

/// Blocks 0, n-2, n-1 (those that exist) set to +inf.
void force_blocks(std::vector<double>& s);

/// The k largest indices, descending, ties to the lower index; -1 past s.size().
std::vector<std::int32_t> topk(const std::vector<double>& s, long k);

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

Result run(const Problem& pr, const Batch& b);

}  // namespace ref::nsa
