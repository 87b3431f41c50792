// MLA at small dims: MlaPreprocess (fp16, int8 weights, PER_TENSOR_QUANT_ASYMM) of a 5-token
// prompt writes the latent rows concat(k_nope, k_rope) into a paged cache of shuffled blocks; a
// decode step preprocesses token 5, then mla_decode attends its absorbed query over the 6 rows.
// Checks: prompt + step == one call over the 6 tokens (bit for bit), mla_decode == a naive loop.
#include <algorithm>
#include <attnref/attnref.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

using attnref::half;
using attnref::Index;

int main() {
  // Hidden H0, latent C, rope R, query latent Q, nope P (DeepSeek-V3: 7168, 512, 64, 1536, 128).
  constexpr Index H = 4, H0 = 64, C = 32, R = 16, Q = 48, P = 16, W = C + R, bs = 4, tokens = 6;
  constexpr Index W1 = C + R + Q, W2 = H * (P + R);
  const attnref::MlaPreprocessParams p{{H0, C, R, Q, P}};  // KVCACHE, PER_TENSOR_QUANT_ASYMM
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  auto rnd = [&](Index n, float sd) {
    std::vector<half> x(static_cast<size_t>(n));
    for (half& e : x) e = half(sd * nd(rng));
    return x;
  };
  std::uniform_int_distribution<int> ui(-128, 127);
  std::vector<std::int8_t> wdqkv(W1 * H0), wuq(W2 * Q);  // int8 weights, ND [out, in]
  for (auto* w : {&wdqkv, &wuq}) std::generate(w->begin(), w->end(), [&] { return ui(rng); });
  const auto x = rnd(tokens * H0, 1), g0 = rnd(H0, 1), g1 = rnd(Q, 1), g2 = rnd(C, 1),
             wuk = rnd(H * P * C, 0.1f), cos = rnd(tokens * R, 0.7f), sin = rnd(tokens * R, 0.7f);
  const std::vector<float> ds0(W1, 1.0f / 4096), ds1(W2, 1.0f / 4096);
  const half qs(0.02f);
  const std::int8_t qo = 1;
  const std::vector<std::int32_t> table = {2, 0, 3, 1};  // blocks of the sequence, shuffled
  std::vector<std::int32_t> slots;
  for (Index t = 0; t < tokens; ++t) slots.push_back(table[t / bs] * bs + t % bs);
  // MlaPreprocess of tokens [first, first + n) into `cache` [4 blocks, bs, 1, C + R].
  auto preprocess = [&](Index first, Index n, std::vector<half>& cache) {
    attnref::MlaPreprocessInputs<half> in;
    in.input = {x.data() + first * H0, {n, H0}};
    in.gamma0 = {g0.data(), {H0}};
    in.gamma1 = {g1.data(), {Q}};
    in.gamma2 = {g2.data(), {C}};
    in.quant_scale0 = in.quant_scale1 = {&qs, {1}};
    in.quant_offset0 = in.quant_offset1 = {&qo, {1}};
    in.wdqkv = {{wdqkv.data(), {W1, H0}}, W1, H0};
    in.de_scale0 = {ds0.data(), {W1}};
    in.wuq = {{wuq.data(), {W2, Q}}, W2, Q};
    in.de_scale1 = {ds1.data(), {W2}};
    in.cos = {cos.data() + first * R, {n, R}};
    in.sin = {sin.data() + first * R, {n, R}};
    in.wuk.tensor = {wuk.data(), {H, P, C}};
    in.slot_mapping = {slots.data() + first, {n}};
    std::vector<half> q_out(static_cast<size_t>(n * H * W));
    attnref::MlaPreprocessOutputs<half> out;
    out.q_out = {q_out.data(), {n, H, W}};
    out.caches.kv_cache = {cache.data(), {4, bs, 1, W}};
    attnref::mla_preprocess(p, in, out);
    return q_out;  // [n, H, C + R]: absorbed q_nope | q_rope
  };
  std::vector<half> cache(4 * bs * W, half(NAN)), cache_once(cache);
  preprocess(0, tokens - 1, cache);                 // the prompt
  const auto q = preprocess(tokens - 1, 1, cache);  // the decode step's token
  const auto q_once = preprocess(0, tokens, cache_once);
  const bool same =
      std::memcmp(cache.data(), cache_once.data(), cache.size() * sizeof(half)) == 0 &&
      std::memcmp(q.data(), &q_once[(tokens - 1) * H * W], q.size() * sizeof(half)) == 0;
  attnref::MlaDecodeParams dp{C, R, 1.0 / std::sqrt(double(P + R))};
  std::vector<half> o(H * C);
  attnref::mla_decode(
      dp, {{q.data(), {1, H, W}}, {cache.data(), {4, bs, 1, W}}, {table.data(), {1, 4}}, {tokens}},
      attnref::MlaDecodeOutputs<half>{{o.data(), {1, H, C}}});
  auto worse = [](double err, double d) { return std::isnan(d) ? INFINITY : std::max(err, d); };
  double err = 0.0;  // naive loop: s_t = scale q·row(t), o = softmax(s)·row(t)[0, C)
  auto f = [](half h) { return double(static_cast<float>(h)); };
  for (Index h = 0; h < H; ++h) {
    std::vector<double> s(tokens, 0.0), acc(C, 0.0);
    for (Index t = 0; t < tokens; ++t)
      for (Index c = 0; c < W; ++c) s[t] += dp.scale * f(q[h * W + c]) * f(cache[slots[t] * W + c]);
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0.0;
    for (Index t = 0; t < tokens; ++t) {
      sum += s[t] = std::exp(s[t] - mx);
      for (Index c = 0; c < C; ++c) acc[c] += s[t] * f(cache[slots[t] * W + c]);
    }
    for (Index c = 0; c < C; ++c) err = worse(err, std::fabs(acc[c] / sum - f(o[h * C + c])));
  }
  std::printf("MLA (H0 %ld, C %ld, R %ld, Q %ld, P %ld, %ld heads, fp16), %ld cached tokens\n",
              long(H0), long(C), long(R), long(Q), long(P), long(H), long(tokens));
  std::printf("  prompt + decode step == one call (cache rows, query): %s\n", same ? "yes" : "NO");
  std::printf("  mla_decode: max |err| vs naive loop %.2e\n", err);
  const bool ok = same && err < 2e-3;  // false for NaN
  std::printf("%s\n", ok ? "OK" : same ? "FAILED: decode != loop" : "FAILED: split != one call");
  return ok ? 0 : 1;
}
