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

Result attention(const Problem& pr, const Seqs& q, const Seqs& k, const Seqs& v);

}  // namespace ref
