#pragma once
// Independent reference of CANN PromptFlashAttention (PFA) and IncreFlashAttention (IFA), written
// from attnref's definition (docs/semantics.md §7 and §10 items 8–9 as settled by the vendor's
// kernels):
//
// PFA, per batch b (S1_b query rows, S2_b keys), query head h (kv head h / (N / KV_N)), row i:
//   key j < S2_b is EXCLUDED by sparse_mode
//     0 without a mask: never; 0 with a mask: unless -pre <= j - i <= next (top-left)
//     1: never; 2: j > i; 3: j > i + S2_b - S1_b; 4: unless -pre <= j - i - (S2_b - S1_b) <= next
//   user mask (modes 0 and 1): m(b, i, j) true = masked; inner_precise bit 1 set: excluded too;
//   bit 1 clear: its score becomes -FLT_MAX (a select, not an addition)
//   s_j = q·k_j · scale + pse(b, h, i, j)   (add_then_scale: (q·k_j + pse) · scale)
//   o = softmax over the non-excluded keys · V; no such key: o = 0
// IFA (one query row per batch, kv length L_b): every key j < L_b is a candidate; a masked key's
// score becomes -1e12 (select); no row fix (an all-masked row is the mean of V); L_b = 0: o = 0.
//
// Everything in double (softmax exact, P never rounded); the caller rounds o to the output type.
// Does not include attnref.

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace ref::cann {

using Seqs = std::vector<std::vector<double>>;  // one dense array per batch

constexpr double kNotCandidate = -std::numeric_limits<double>::infinity();

// Softmax over the candidate scores (kNotCandidate: not one) times V; adds into o[0..dv).
// value_row(j) points at key j's value row. Returns false when there is no candidate. A NaN
// score (NaN read from an input) propagates to the output.
template <class ValueRow>
bool softmax_pv(const std::vector<double>& s, int dv, ValueRow&& value_row, double* o) {
  double mx = kNotCandidate;
  for (double x : s)
    if (x != kNotCandidate) mx = std::isnan(x) || std::isnan(mx) ? std::nan("") : std::max(mx, x);
  if (mx == kNotCandidate) return false;
  double sum = 0.0;
  for (double x : s)
    if (x != kNotCandidate) sum += std::exp(x - mx);
  for (size_t j = 0; j < s.size(); ++j) {
    if (s[j] == kNotCandidate) continue;
    const double p = std::exp(s[j] - mx) / sum;
    const double* v = value_row(static_cast<int>(j));
    for (int e = 0; e < dv; ++e) o[e] += p * v[e];
  }
  return true;
}

struct Pfa {
  int num_heads = 1, num_kv_heads = 1, head_size = 1, v_head_size = 1;
  std::vector<int> q_len, kv_len;  // S1_b, S2_b
  double scale = 1.0;
  int sparse_mode = 0;
  std::int64_t pre = 2147483647, next = 0;
  int inner_precise = 1;
  bool add_then_scale = false;
  bool has_mask = false;                            // a mask tensor is given (any mode)
  std::function<bool(int b, int i, int j)> mask{};  // the user mask (modes 0 and 1)
  std::function<double(int b, int h, int i, int j)> pse{};

  bool excluded(int b, int i, int j) const {
    const std::int64_t d = j - i, off = kv_len[b] - q_len[b];
    switch (sparse_mode) {
      case 0:
        return has_mask && (d < -pre || d > next);
      case 2:
        return d > 0;
      case 3:
        return d > off;
      case 4:
        return d - off < -pre || d - off > next;
      default:
        return false;
    }
  }
};

// q[b]: [S1_b][N][D], k[b]: [S2_b][KV_N][D], v[b]: [S2_b][KV_N][Dv]. Returns [S1_b][N][Dv].
inline Seqs pfa(const Pfa& pr, const Seqs& q, const Seqs& k, const Seqs& v) {
  const int N = pr.num_heads, G = N / pr.num_kv_heads, D = pr.head_size, Dv = pr.v_head_size;
  const int KVN = pr.num_kv_heads;
  Seqs o(q.size());
  for (size_t bi = 0; bi < q.size(); ++bi) {
    const int b = static_cast<int>(bi), S1 = pr.q_len[bi], S2 = pr.kv_len[bi];
    o[bi].assign(static_cast<size_t>(S1) * N * Dv, 0.0);
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
        softmax_pv(
            s, Dv, [&](int j) { return &v[bi][(static_cast<size_t>(j) * KVN + hk) * Dv]; },
            &o[bi][(static_cast<size_t>(i) * N + h) * Dv]);
      }
    }
  }
  return o;
}

struct Ifa {
  int num_heads = 1, num_kv_heads = 1, head_size = 1;
  std::vector<int> kv_len;  // L_b
  double scale = 1.0;
  bool add_then_scale = false;
  std::function<bool(int b, int j)> mask{};
  std::function<double(int b, int h, int j)> pse{};
};

// q[b]: [N][D], k[b], v[b]: [L_b][KV_N][D] (dequantized). Returns [B][N][D].
inline Seqs ifa(const Ifa& pr, const Seqs& q, const Seqs& k, const Seqs& v) {
  const int N = pr.num_heads, KVN = pr.num_kv_heads, G = N / KVN, D = pr.head_size;
  Seqs o(q.size());
  for (size_t bi = 0; bi < q.size(); ++bi) {
    const int b = static_cast<int>(bi), L = pr.kv_len[bi];
    o[bi].assign(static_cast<size_t>(N) * D, 0.0);
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
      softmax_pv(
          s, D, [&](int j) { return &v[bi][(static_cast<size_t>(j) * KVN + hk) * D]; },
          &o[bi][static_cast<size_t>(h) * D]);
    }
  }
  return o;
}

// IFA antiquant: x = (x8 + offset[c]) · scale[c], c a channel kvHead · D + d (per tensor: one
// value); `offset` empty: 0. Exact in double.
inline double antiquant(std::int8_t x8, double scale, double offset) {
  return (static_cast<double>(x8) + offset) * scale;
}

}  // namespace ref::cann
