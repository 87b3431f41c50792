#pragma once
// Independent reference of ATB SelfAttention (PA_ENCODER), written from docs/semantics.md §2.2–2.3.
// Double accumulation; the fp16 / fp32 rounding steps of the NPU are emulated explicitly with
// Eigen's half and with float. Does not include attnref.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace ref {

struct AtbSelfAttention {
  int num_heads = 1, num_kv_heads = 1, head_size = 1, v_head_size = 1;
  std::vector<int> seq_len;  // queries per sequence
  std::vector<int> kv_len;   // keys per sequence (empty: = seq_len)
  double q_scale = 1.0, qk_scale = 1.0;
  bool fp16_scores = false;  // kernelType DEFAULT with fp16 data
  bool clamp = false;
  double clamp_min = 0.0, clamp_max = 0.0;
  std::vector<float> log_n;      // empty: scaleType TOR
  bool log_n_per_batch = false;  // DECODER: log_n[b], else log_n[query position]
  // Mask term added to the score of (sequence b, query i, key j), already multiplied by the
  // encoding's coefficient (binary x -3e38, or the additive fp16 value).
  std::function<double(int b, int i, int j)> mask;
  // Per-head additive term (ALiBi masks), added like the mask.
  std::function<double(int b, int h, int i, int j)> head_bias;
  // Rounds a value to the data type (q * qScale is computed in the data type).
  std::function<double(double)> to_dtype = [](double x) { return x; };
};

inline double round_fp16(double x) {
  return static_cast<double>(static_cast<float>(Eigen::half(static_cast<float>(x))));
}

// q[b]: [len][num_heads][D]; k[b], v[b]: [len][num_kv_heads][D or Dv]. Returns o[b]:
// [len][num_heads][Dv].
std::vector<std::vector<double>> atb_self_attention(const AtbSelfAttention& pr,
                                                    const std::vector<std::vector<double>>& q,
                                                    const std::vector<std::vector<double>>& k,
                                                    const std::vector<std::vector<double>>& v);

}  // namespace ref
