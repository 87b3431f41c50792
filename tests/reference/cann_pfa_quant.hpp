#pragma once
// Independent reference of CANN PromptFlashAttention's int8 path (attnref's reading,
// docs/semantics.md §7 and §10 item 9): per row, s_j = fp32(fp32(int32(q8·k8_j)·deq1)·scale); keys
// in blocks of `block` from key 0 against the running max m; P̂_j = exp(s_j − m); P8_j =
// sat(rint(P̂_j·qs1)); O = Σ_blocks (rescaled) deq2·Σ P8_j·V8_j, l = Σ P̂ (unrounded); out = O / l.
// Keys: all (sparse mode 0 without a mask) or j <= i (mode 3 with S1 = S2). The exps are in double;
// `slack` bounds what a P8 flipped at a rounding tie (|P̂·qs1 − k − 0.5| < 1e-3) may move each row's
// output. Does not include attnref.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace ref::cann {

struct PfaQuant {
  int batch = 1, seq = 1, heads = 1, kv_heads = 1, d = 1;
  bool causal = false;
  int block = 128;
  float deq1 = 1, qs1 = 1, deq2 = 1, scale = 1;
};

struct PfaQuantResult {
  std::vector<double> out;    // [batch][seq][heads][d]
  std::vector<double> slack;  // [batch][seq][heads]
};

// q8: [batch][seq][heads][d]; k8, v8: [batch][seq][kv_heads][d] (BSND).
PfaQuantResult pfa_quant(const PfaQuant& p, const std::vector<std::int8_t>& q8,
                         const std::vector<std::int8_t>& k8, const std::vector<std::int8_t>& v8);

}  // namespace ref::cann
