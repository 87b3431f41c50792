#pragma once
// Independent reference of FusedInferAttentionScore's MLA full quantization (int8 query with a
// per-row-and-head dequant scale, int8 latent K / V with per-tensor scales, bf16 rope parts),
// written from docs/fia.md#mla-full-quantization:
//
//   per batch b (Q_b query rows, L_b keys), row s, head h:
//   key j visible iff j < L_b and (causal: j <= s + L_b - Q_b); none visible: o = 0
//   x_j = (Σ_d q8·k8_j + Σ_r qr·kr_j) · dqQ[s][h] · dqK · scale
//   keys in blocks of 512 from key 0; m = running max of x including the block;
//     P̂_j = exp(x_j - m); pmax = max_j P̂_j of the block + 2^-52
//     P8_j = rint(fp16(P̂_j · 127 / pmax))              (ties to even)
//     factor = fp16(pmax) · dqV / 127
//     l = l · exp(m_old - m) + Σ P̂_j;  O = O · exp(m_old - m) + factor · Σ_j P8_j · v8_j
//   o = O / l
//
// Everything in double except the fp16 rounding that defines P8. Each P8 that a relative change
// of P̂ · 127 / pmax by the row's window would move is a near tie (the window: `tie_window`, or
// twice the fp32 error bound of the row's scores, 4·sqrt(576)·2^-24 of the largest Σ |products|
// of a key, when larger); its largest effect on the row (|factor| · steps · max|v8|, rescaled
// like O, / l) is returned as `slack`. Does not include attnref.

#include <cstdint>
#include <vector>

namespace ref::cann {

struct MlaQuant {
  int num_heads = 1;
  double scale = 1.0;
  double dqk = 1.0, dqv = 1.0;
  bool causal = false;
  int block = 512;
  double tie_window = 3e-5;
};

// One batch: q8 [Q][N][512], qr [Q][N][64], dqq [Q][N]; k8 [L][512], kr [L][64], v8 [L][512].
struct MlaQuantBatch {
  std::vector<std::int8_t> q8, k8, v8;
  std::vector<double> qr, kr, dqq;
  int q_len = 0, kv_len = 0;
};

struct MlaQuantResult {
  std::vector<double> out;    // [Σ Q_b][N][512], batches in order
  std::vector<double> slack;  // [Σ Q_b][N]
  long near_ties = 0, quantized = 0;
};

MlaQuantResult mla_full_quant(const MlaQuant& pr, const std::vector<MlaQuantBatch>& batches);

}  // namespace ref::cann
