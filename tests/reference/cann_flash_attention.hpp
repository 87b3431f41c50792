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
  // FIA's learnable sink: exp(sink(h) - max) joins the row's denominator (no value row); the
  // lse leaves it out. Empty: none.
  std::function<double(int h)> sink{};

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
// lse (optional): [b][h·S1_b + i] = ln Σ exp(s_j) over the row's candidate scores (max + ln of
// the shifted sum); -inf for a row without a candidate.
Seqs pfa(const Pfa& pr, const Seqs& q, const Seqs& k, const Seqs& v, Seqs* lse = nullptr);

struct Ifa {
  int num_heads = 1, num_kv_heads = 1, head_size = 1;
  std::vector<int> kv_len;  // L_b
  double scale = 1.0;
  bool add_then_scale = false;
  std::function<bool(int b, int j)> mask{};
  std::function<double(int b, int h, int j)> pse{};
};

// q[b]: [N][D], k[b], v[b]: [L_b][KV_N][D] (dequantized). Returns [B][N][D]. lse (optional):
// [b][h], as pfa's (-inf when L_b = 0).
Seqs ifa(const Ifa& pr, const Seqs& q, const Seqs& k, const Seqs& v, Seqs* lse = nullptr);

// IFA antiquant: x = (x8 + offset[c]) · scale[c], c a channel kvHead · D + d (per tensor: one
// value); `offset` empty: 0. Exact in double.
inline double antiquant(std::int8_t x8, double scale, double offset) {
  return (static_cast<double>(x8) + offset) * scale;
}

}  // namespace ref::cann
