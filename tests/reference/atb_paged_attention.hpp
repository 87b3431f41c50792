#pragma once
// Independent reference of ATB PagedAttention (decode), from docs/semantics.md §3: the caller
// gathers each sequence's keys and values through the block table; scores, softmax and P·V in
// double. Does not include attnref.

#include <cmath>
#include <functional>
#include <vector>

namespace ref {

struct AtbPaged {
  int num_heads = 1, num_kv_heads = 1, head_size = 1, v_head_size = 1;
  double qk_scale = 1.0;
  std::vector<float> log_n;                          // empty: scaleType TOR
  std::function<double(int b, int t)> mask;          // NORM term
  std::function<double(int b, int h, int t)> alibi;  // ALIBI term
  // A per-key term added to q·k BEFORE qk_scale (razor attention's razorOffset): the same value
  // for every head of the sequence.
  std::function<double(int b, int t)> key_bias;
};

// q[b]: [heads * D]; k[b]: [len][kv heads * D]; v[b]: [len][kv heads * Dv] (len = k[b].size()).
// Returns [batch][heads][Dv] flattened; a sequence without keys gives zeros.
std::vector<double> atb_paged_attention(const AtbPaged& pr,
                                        const std::vector<std::vector<double>>& q,
                                        const std::vector<std::vector<std::vector<double>>>& k,
                                        const std::vector<std::vector<std::vector<double>>>& v);

}  // namespace ref
