// attnref's first program: a causal GQA prefill (4 query heads sharing 2 kv heads) on random data.
#include <attnref/attnref.hpp>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  constexpr attnref::Index B = 1, S = 8, Hq = 4, Hkv = 2, D = 16;
  std::mt19937 rng(0);
  std::normal_distribution<float> nd;
  std::vector<float> q(B * S * Hq * D), k(B * S * Hkv * D), v(B * S * Hkv * D), o(q.size());
  for (std::vector<float>* x : {&q, &k, &v})
    for (float& e : *x) e = nd(rng);
  attnref::AttentionInputs<float> in{attnref::bsnd_view<const float>(q.data(), B, S, Hq, D),
                                     attnref::bsnd_view<const float>(k.data(), B, S, Hkv, D),
                                     attnref::bsnd_view<const float>(v.data(), B, S, Hkv, D)};
  attnref::AttentionParams params;
  params.scale = 1.0 / std::sqrt(double(D));
  params.causal = attnref::CausalMode::BottomRight;
  attnref::AttentionOutputs<float> out{attnref::bsnd_view(o.data(), B, S, Hq, D)};
  attnref::attention(in, params, out);
  std::printf("o[0, %ld, 3, 0] = %.6f (last token, q head 3 -> kv head 1)\n", long(S - 1),
              double(o[((S - 1) * Hq + 3) * D]));
}
