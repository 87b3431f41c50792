#pragma once
// Independent reference of NSA's selected and sliding-window branches (CANN
// aclnnNsaSelectedAttentionInfer and the decode step's window branch) and of the gated sum,
// written from the definitions, in double, over one dense array per batch:
//   q [q_len][N][Dqk], k [sel][KV_N][Dqk], v [sel][KV_N][Dv]   (already rounded to the input type)
// Query head h uses kv head g = h / G (G = N / KV_N).
//
// Selected branch. Query token i (0 <= i < q_len) of a batch with sel raw tokens sees the raw
// positions [0, L_i), L_i = sel - (q_len - 1 - i) (the multi-token causal rule). With the top-k
// list topk[i][g][0, k) of select blocks of size l' (-1: an empty slot), its keys are the union
//   keys(i, g) = U_{e : topk[i][g][e] != -1} [j*l', min((j + 1)*l', L_i)),  j = topk[i][g][e]
// and out = softmax(scale * q.k over keys) . v over keys; an empty key set gives 0.
//
// Window branch. Query token i sits at raw position t = sel - q_len + i and sees the raw
// positions (t - w, t] within [0, sel): the w positions ending at itself.
//
// Gated sum. out = g0 * o_cmp + g1 * o_sel + g2 * o_win per element (gates per row and head).
//
// No include of attnref (nor Eigen): plain loops and double accumulation.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace ref::nsa_select {

struct Problem {
  int N = 1, KVN = 1, Dqk = 1, Dv = 1;
  double scale = 1.0;
  long ls = 64;  // select block size l'
  long k = 1;    // top-k entries per (token, kv head)
};

struct Batch {
  int q_len = 1;
  long sel = 0;                    // raw tokens in the cache
  std::vector<double> q, k, v;     // [q_len][N][Dqk], [sel][KVN][Dqk], [sel][KVN][Dv]
  std::vector<std::int32_t> topk;  // [q_len][KVN][k] (the selected branch only)
};

/// Softmax attention of query (token i, head h) over the positions flagged in `visible`
/// (ascending), out[0, Dv) accumulated in double; all zero when nothing is visible.
void attend(const Problem& pr, const Batch& b, int i, int h, const std::vector<char>& visible,
            double* out);

/// L_i: the raw positions [0, L_i) token i may see (can be <= 0 when sel < q_len).
inline long visible_length(const Batch& b, int i) { return b.sel - (b.q_len - 1 - i); }

/// The raw positions of keys(i, g) as flags over [0, sel).
std::vector<char> selected_keys(const Problem& pr, const Batch& b, int i, int g);

/// The selected branch: [q_len][N][Dv] (not rounded).
std::vector<double> selected(const Problem& pr, const Batch& b);

/// The raw positions token i sees through a window of w: (t - w, t] within [0, sel).
std::vector<char> window_keys(const Batch& b, int i, long w);

/// The window branch: [q_len][N][Dv] (not rounded). w >= sel is plain causal attention.
std::vector<double> window(const Problem& pr, const Batch& b, long w);

/// out[r][h][x] = g0 * a + g1 * b + g2 * c, gates [rows][N][3], branches [rows][N][Dv].
std::vector<double> gated_sum(const std::vector<double>& gates, const std::vector<double>& a,
                              const std::vector<double>& b, const std::vector<double>& c, long Dv);

}  // namespace ref::nsa_select
