// One Native Sparse Attention decode step at the vendor's shapes (fp16, 8 q / 2 kv heads, Dqk
// 192, Dv 128): a 400-token prompt's raw K/V in a paged cache of shuffled blocks, nsa_compress into
// a paged compressed cache, then nsa_decode_step. Checks: each kv head's top-k starts with the
// forced blocks 0, n-2, n-1, and the compressed branch equals a naive loop.
#include <algorithm>
#include <attnref/attnref.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

using attnref::half;
using attnref::Index;

int main() {
  constexpr Index N = 8, KVN = 2, Dqk = 192, Dv = 128, l = 32, d = 16, ls = 64, k = 4, len = 400;
  constexpr Index pbs = 128, blocks = (len + pbs - 1) / pbs, cpbs = 16, cmp_blocks = 2;
  const Index cmp = attnref::nsa_compressed_count(len, l, d);          // 24
  const Index n_sel = attnref::nsa_select_block_count(cmp, l, d, ls);  // 7
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<half> raw_k(len * KVN * Dqk), raw_v(len * KVN * Dv), q(N * Dqk);  // TND
  for (std::vector<half>* x : {&raw_k, &raw_v, &q})
    for (half& e : *x) e = half(nd(rng));
  std::vector<std::int32_t> table(blocks), cmp_table = {0, 1};  // raw: shuffled, spare rows NaN
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<half> kc(blocks * pbs * KVN * Dqk, half(NAN)), vc(blocks * pbs * KVN * Dv, half(NAN));
  for (Index t = 0; t < len; ++t) {
    const Index slot = table[t / pbs] * pbs + t % pbs;
    std::copy_n(&raw_k[t * KVN * Dqk], KVN * Dqk, &kc[slot * KVN * Dqk]);
    std::copy_n(&raw_v[t * KVN * Dv], KVN * Dv, &vc[slot * KVN * Dv]);
  }
  // NsaCompress (token i = sum_j w[j] raw[i d + j]) into the paged compressed cache, in order.
  std::vector<half> w(l * KVN, half(1.0f / l)), ck(cmp_blocks * cpbs * KVN * Dqk, half(NAN)),
      cv(cmp_blocks * cpbs * KVN * Dv, half(NAN));
  const attnref::NsaCompressParams cpar;  // l 32, stride 16
  attnref::nsa_compress<half>(cpar, {raw_k.data(), {len, KVN, Dqk}}, {w.data(), {l, KVN}}, {len},
                              {ck.data(), {cmp, KVN, Dqk}});
  attnref::nsa_compress<half>(cpar, {raw_v.data(), {len, KVN, Dv}}, {w.data(), {l, KVN}}, {len},
                              {cv.data(), {cmp, KVN, Dv}});
  attnref::NsaDecodeParams p;
  p.num_heads = N;
  p.num_key_value_heads = KVN;
  p.select_block_count = k;
  p.window_size = 64;
  p.cmp_page_block_size = cpbs;
  p.scale_value = 1.0 / std::sqrt(double(Dqk));
  const std::vector<float> gates(N * 3, 1.0f / 3);  // [1, N, 3]: compressed, selected, window
  attnref::NsaDecodeInputs<half> in;
  in.query = {q.data(), {1, N, Dqk}};
  in.key = {kc.data(), {blocks, pbs, KVN * Dqk}};
  in.value = {vc.data(), {blocks, pbs, KVN * Dv}};
  in.block_table = {table.data(), {1, blocks}};
  in.cmp_key = {ck.data(), {cmp_blocks, cpbs, KVN * Dqk}};
  in.cmp_value = {cv.data(), {cmp_blocks, cpbs, KVN * Dv}};
  in.cmp_block_table = {cmp_table.data(), {1, cmp_blocks}};
  in.gates = {gates.data(), {1, N, 3}};
  in.actual_sel_kv_seq_len = {len};
  std::vector<half> o(N * Dv), o_cmp(N * Dv);
  std::vector<std::int32_t> topk(KVN * k);
  attnref::nsa_decode_step(
      p, in, {{o.data(), {1, N, Dv}}, {topk.data(), {1, KVN, k}}, {o_cmp.data(), {1, N, Dv}}});
  std::printf(
      "NSA decode step: %ld raw tokens, %ld compressed, %ld select blocks of %ld; o[0] %.4f\n",
      long(len), long(cmp), long(n_sel), long(ls), double(static_cast<float>(o[0])));
  bool ok = true;
  for (Index kh = 0; kh < KVN; ++kh) {
    const std::int32_t* t = &topk[kh * k];
    std::printf("  kv head %ld chose blocks %d %d %d %d of %ld\n", long(kh), t[0], t[1], t[2], t[3],
                long(n_sel));
    ok = ok && t[0] == 0 && t[1] == n_sel - 2 && t[2] == n_sel - 1 && t[3] > 0 && t[3] < n_sel - 2;
  }
  auto worse = [](double err, double d) { return std::isnan(d) ? INFINITY : std::max(err, d); };
  double err = 0.0;  // the compressed branch: softmax(scale q.ck_t) . cv_t over the cmp tokens
  auto f = [](half x) { return double(static_cast<float>(x)); };
  for (Index h = 0; h < N; ++h) {
    std::vector<double> s(cmp, 0.0), acc(Dv, 0.0);
    const Index kh = h / (N / KVN);
    for (Index t = 0; t < cmp; ++t)
      for (Index e = 0; e < Dqk; ++e)
        s[t] += p.scale_value * f(q[h * Dqk + e]) * f(ck[(t * KVN + kh) * Dqk + e]);
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0.0;
    for (Index t = 0; t < cmp; ++t) {
      sum += s[t] = std::exp(s[t] - mx);
      for (Index e = 0; e < Dv; ++e) acc[e] += s[t] * f(cv[(t * KVN + kh) * Dv + e]);
    }
    for (Index e = 0; e < Dv; ++e) err = worse(err, std::fabs(acc[e] / sum - f(o_cmp[h * Dv + e])));
  }
  std::printf("  compressed branch: max |err| vs naive loop %.2e; top-k %s\n", err,
              ok ? "ok" : "WRONG");
  ok = ok && err < 2e-3;
  std::printf("%s\n", ok ? "OK" : "FAILED: wrong top-k or compressed branch");
  return ok ? 0 : 1;
}
