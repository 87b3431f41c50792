#pragma once
// Independent reference of ATB SelfAttention's qkv full quantization (quantType QKV_OFFLINE /
// QKV_ONLINE), written from docs/semantics.md §2.8: int64 products, double accumulation, the fp16 /
// fp32 rounding steps of the definition emulated explicitly. Does not include attnref.
//
// Besides the output it reports, per output row, whether rounding P̂ = exp(s - m) to fp16 fell
// so close to a tie that an implementation computing exp in float (a few ulps of error) may
// legitimately round the other way, which moves P8 by one step; tests compare such rows more
// loosely. Every other step (the scores, P̂ / scale in fp32, the products) is exactly defined.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace ref {

struct AtbQkvQuant {
  int num_heads = 1, num_kv_heads = 1, head_size = 1, v_head_size = 1;
  std::vector<int> seq_len;
  double qk_scale = 1.0;
  bool clamp = false;
  double clamp_min = 0.0, clamp_max = 0.0;
  // Mask term of (sequence, query, key), coefficient applied (-inf: the key is hidden).
  std::function<double(int b, int i, int j)> mask;
  std::function<double(int b, int h, int i, int j)> head_bias;
  std::vector<float> qk_descale, vpv_descale;
  std::vector<float> p_scale;  // empty: online
  int block = 128;
};

struct QuantResult {
  std::vector<std::vector<double>> out;  // [b]: [len][heads][Dv]
  std::vector<std::vector<char>> tie;    // [b]: [len][heads], 1 = a rounding was near a tie
};

inline double fp16(double x) {
  return static_cast<double>(static_cast<float>(Eigen::half(static_cast<float>(x))));
}

// q[b]: [len][heads][D] int8 values, k[b]: [len][kv heads][D], v[b]: [len][kv heads][Dv].
QuantResult atb_qkv_quant(const AtbQkvQuant& pr, const std::vector<std::vector<std::int8_t>>& q,
                          const std::vector<std::vector<std::int8_t>>& k,
                          const std::vector<std::vector<std::int8_t>>& v);

}  // namespace ref
