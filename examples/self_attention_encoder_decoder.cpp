// ATB SelfAttention with a KV cache: ENCODER runs two prompts of different lengths (packed
// tokens, causal) and writes their K/V into the [layer, batch, maxSeq, kvHead * headSize] caches,
// then DECODER steps append one token per sequence and attend over the cache. Check: every
// output row equals the matching row of one PA_ENCODER (no cache) over the full sequences.
#include <algorithm>
#include <attnref/attnref.hpp>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

using attnref::Index;
using attnref::StridedView;
using P = attnref::SelfAttentionParams;

int main() {
  constexpr Index B = 2, Hq = 4, Hkv = 2, D = 32, max_seq = 16, steps = 3, L = 12;
  const std::vector<Index> prompt = {6, 9}, full = {6 + steps, 9 + steps};
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  // Every token of both sequences up front, [B, L, heads, D] (L >= prompt + steps).
  std::vector<float> q(B * L * Hq * D), k(B * L * Hkv * D), v(k.size());
  for (std::vector<float>* x : {&q, &k, &v})
    for (float& e : *x) e = nd(rng);
  // Packs rows [first(b), last(b)) of each sequence: the operators take packed tokens.
  auto pack = [&](const std::vector<float>& x, Index H, auto first, auto last) {
    std::vector<float> r;
    for (Index b = 0; b < B; ++b)
      r.insert(r.end(), x.begin() + (b * L + first(b)) * H * D,
               x.begin() + (b * L + last(b)) * H * D);
    return r;
  };
  P p;
  p.num_heads = Hq;
  p.num_kv_heads = Hkv;
  p.qk_scale = 1.0f / std::sqrt(float(D));
  std::vector<float> k_cache(B * max_seq * Hkv * D), v_cache(k_cache.size());
  // Runs one call on rows [first, last) of each sequence; returns the packed output.
  auto run = [&](P::CalcType calc, auto first, auto last, std::vector<Index> token_offset) {
    const auto qp = pack(q, Hq, first, last), kp = pack(k, Hkv, first, last),
               vp = pack(v, Hkv, first, last);
    const Index n = static_cast<Index>(qp.size()) / (Hq * D);
    std::vector<float> o(qp.size());
    p.calc_type = calc;
    p.mask_type = calc == P::CalcType::Decoder ? P::MaskType::Undefined : P::MaskType::CausalMask;
    attnref::SelfAttentionInputs<float> in;
    in.query = StridedView<const float, 3>(qp.data(), {n, Hq, D});
    in.key = StridedView<const float, 3>(kp.data(), {n, Hkv, D});
    in.value = StridedView<const float, 3>(vp.data(), {n, Hkv, D});
    for (Index b = 0; b < B; ++b) in.seq_len.push_back(last(b) - first(b));
    in.token_offset = token_offset;
    attnref::SelfAttentionOutputs<float> out{StridedView<float, 3>(o.data(), {n, Hq, D})};
    if (calc != P::CalcType::PaEncoder) {  // the caches: layer 0 of [1, B, maxSeq, Hkv * D]
      out.key_cache = StridedView<float, 4>(k_cache.data(), {1, B, max_seq, Hkv * D});
      out.value_cache = StridedView<float, 4>(v_cache.data(), {1, B, max_seq, Hkv * D});
    }
    attnref::self_attention(p, in, out);
    return o;
  };
  auto zero = [](Index) { return Index(0); };
  auto prompt_end = [&](Index b) { return prompt[b]; };
  auto full_end = [&](Index b) { return full[b]; };
  // The reference: PA_ENCODER over the full sequences (K/V from the token arrays, no cache).
  const auto want = run(P::CalcType::PaEncoder, zero, full_end, {});
  auto worse = [](double err, double d) { return std::isnan(d) ? INFINITY : std::max(err, d); };
  auto row_err = [&](const float* got, Index b, Index t) {  // max |got - want row t of seq b|
    const float* w = want.data() + std::accumulate(full.begin(), full.begin() + b, t) * Hq * D;
    double e = 0.0;
    for (Index i = 0; i < Hq * D; ++i) e = worse(e, std::fabs(double(got[i]) - w[i]));
    return e;
  };
  const auto enc = run(P::CalcType::Encoder, zero, prompt_end, prompt);
  double err = 0.0;
  for (Index b = 0, row = 0; b < B; ++b)
    for (Index t = 0; t < prompt[b]; ++t, ++row)
      err = std::max(err, row_err(&enc[row * Hq * D], b, t));
  std::printf("ENCODER (fp32, causal) prompts %ld, %ld -> cache; max |diff| vs PA_ENCODER %.2e\n",
              long(prompt[0]), long(prompt[1]), err);
  bool ok = err < 1e-5;
  for (Index s = 0; s < steps; ++s) {
    auto pos = [&](Index b) { return prompt[b] + s; };
    auto next = [&](Index b) { return prompt[b] + s + 1; };
    const auto dec = run(P::CalcType::Decoder, pos, next, {next(0), next(1)});
    double e = 0.0;
    for (Index b = 0; b < B; ++b) e = std::max(e, row_err(&dec[b * Hq * D], b, pos(b)));
    std::printf("DECODER step %ld: kv lengths %ld, %ld from the cache; max |diff| %.2e\n", long(s),
                long(next(0)), long(next(1)), e);
    ok = ok && e < 1e-5;
  }
  std::printf("%s\n",
              ok ? "OK" : "FAILED: a cached step differs from PA_ENCODER on the full sequences");
  return ok ? 0 : 1;
}
