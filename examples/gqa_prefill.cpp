// Causal GQA prefill of two sequences of different lengths in one padded BSND batch: fp16 Q/K/V,
// float output. Sequence 0 is a chunk of 5 new tokens after 7 cached ones (q_len 5, kv_len 12),
// sequence 1 a fresh prompt of 8 tokens; bottom-right causal aligns each query with the end of
// its keys. Checked against a naive double loop on every row; padded rows must stay untouched.
#include <algorithm>
#include <attnref/attnref.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

using attnref::half;
using attnref::Index;

int main() {
  constexpr Index B = 2, Sq = 8, Skv = 12, Hq = 8, Hkv = 2, D = 32, G = Hq / Hkv;
  const std::vector<Index> q_len = {5, 8}, kv_len = {12, 8};
  const double scale = 1.0 / std::sqrt(double(D));
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  auto random_half = [&](Index n) {
    std::vector<half> x(static_cast<size_t>(n));
    for (half& e : x) e = half(nd(rng));
    return x;
  };
  const auto q = random_half(B * Sq * Hq * D), k = random_half(B * Skv * Hkv * D),
             v = random_half(B * Skv * Hkv * D);
  std::vector<float> o(q.size(), NAN);  // rows past q_len are never written

  attnref::AttentionInputs<half> in{attnref::bsnd_view<const half>(q.data(), B, Sq, Hq, D),
                                    attnref::bsnd_view<const half>(k.data(), B, Skv, Hkv, D),
                                    attnref::bsnd_view<const half>(v.data(), B, Skv, Hkv, D)};
  in.seq.q = q_len;
  in.seq.kv = kv_len;
  attnref::AttentionParams params;
  params.scale = scale;
  params.causal = attnref::CausalMode::BottomRight;
  attnref::AttentionOutputs<float> out{attnref::bsnd_view(o.data(), B, Sq, Hq, D)};
  attnref::attention(in, params, out);

  // Naive loop: query i of sequence b sees keys j <= i + kv_len - q_len; q head h, kv head h / G.
  auto worse = [](double err, double d) { return std::isnan(d) ? INFINITY : std::max(err, d); };
  auto at = [](const std::vector<half>& x, Index S, Index H, Index b, Index s, Index h, Index d) {
    return double(static_cast<float>(x[static_cast<size_t>(((b * S + s) * H + h) * D + d)]));
  };
  double err = 0.0;
  bool padding_ok = true;
  for (Index b = 0; b < B; ++b)
    for (Index i = 0; i < Sq; ++i)
      for (Index h = 0; h < Hq; ++h) {
        const float* got = &o[static_cast<size_t>(((b * Sq + i) * Hq + h) * D)];
        if (i >= q_len[b]) {
          padding_ok = padding_ok && std::isnan(got[0]);
          continue;
        }
        const Index last = i + kv_len[b] - q_len[b];
        std::vector<double> s(static_cast<size_t>(last + 1)), acc(D, 0.0);
        double mx = -INFINITY, sum = 0.0;
        for (Index j = 0; j <= last; ++j) {
          for (Index d = 0; d < D; ++d)
            s[j] += scale * at(q, Sq, Hq, b, i, h, d) * at(k, Skv, Hkv, b, j, h / G, d);
          mx = std::max(mx, s[j]);
        }
        for (Index j = 0; j <= last; ++j) {
          const double p = std::exp(s[j] - mx);
          sum += p;
          for (Index d = 0; d < D; ++d) acc[d] += p * at(v, Skv, Hkv, b, j, h / G, d);
        }
        for (Index d = 0; d < D; ++d) err = worse(err, std::fabs(acc[d] / sum - got[d]));
      }
  std::printf("GQA prefill: fp16 q [%ld, %ld, %ld, %ld], k/v [%ld, %ld, %ld, %ld], float out\n",
              long(B), long(Sq), long(Hq), long(D), long(B), long(Skv), long(Hkv), long(D));
  std::printf(
      "  seq 0: q_len %ld, kv_len %ld; seq 1: q_len %ld, kv_len %ld (bottom-right causal)\n",
      long(q_len[0]), long(kv_len[0]), long(q_len[1]), long(kv_len[1]));
  std::printf("  max |out - naive loop| = %.2e over every row; padded rows untouched: %s\n", err,
              padding_ok ? "yes" : "NO");
  if (!(err < 1e-5) || !padding_ok) {
    std::printf("FAILED: the output differs from the naive loop or a padded row was written\n");
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
