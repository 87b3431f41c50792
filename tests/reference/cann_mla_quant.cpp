#include "reference/cann_mla_quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "reference/atb_paged_modes.hpp"  // fp16_rne

namespace ref::cann {

namespace {

constexpr int kD = 512, kR = 64;

// rint(fp16(x)) as an integer.
int p8_of(double x) {
  return static_cast<int>(std::nearbyint(ref::fp16_rne(static_cast<float>(x))));
}

// One row: the output (kD values) and its slack.
double row(const MlaQuant& pr, const MlaQuantBatch& bt, int s, int h, double* out,
           MlaQuantResult& res) {
  const int N = pr.num_heads, L = bt.kv_len;
  int end = L;
  if (pr.causal) end = std::min(L, std::max(0, s + L - bt.q_len + 1));
  if (end <= 0) return 0.0;
  const size_t qi = static_cast<size_t>(s * N + h);
  const double rs = bt.dqq[qi] * pr.dqk * pr.scale;
  std::vector<double> x(static_cast<size_t>(end));
  double amax = 0.0;  // the largest Σ |products| of a key: the scale of an fp32 score's error
  for (int j = 0; j < end; ++j) {
    std::int64_t dot = 0, adot = 0;
    for (int d = 0; d < kD; ++d) {
      const std::int64_t t = static_cast<std::int64_t>(bt.q8[qi * kD + static_cast<size_t>(d)]) *
                             bt.k8[static_cast<size_t>(j * kD + d)];
      dot += t;
      adot += t < 0 ? -t : t;
    }
    double r = 0.0, ar = 0.0;
    for (int e = 0; e < kR; ++e) {
      const double t =
          bt.qr[qi * kR + static_cast<size_t>(e)] * bt.kr[static_cast<size_t>(j * kR + e)];
      r += t;
      ar += std::fabs(t);
    }
    x[static_cast<size_t>(j)] = (static_cast<double>(dot) + r) * rs;
    amax = std::max(amax, (static_cast<double>(adot) + ar) * std::fabs(rs));
  }
  // An implementation's fp32 scores lie within about 4·sqrt(576)·2^-24 of that scale of these;
  // P̂ then moves by twice that (the score and the row max), relatively.
  const double window = std::max(pr.tie_window, 2.0 * 4.0 * 24.0 * 0x1p-24 * amax);
  double m = -INFINITY, l = 0.0, slack = 0.0;
  std::vector<double> acc(kD, 0.0);
  for (int j0 = 0; j0 < end; j0 += pr.block) {
    const int j1 = std::min(end, j0 + pr.block);
    double m_new = m;
    for (int j = j0; j < j1; ++j) m_new = std::max(m_new, x[static_cast<size_t>(j)]);
    const double alpha = std::exp(m - m_new);  // first block: 0
    std::vector<double> ph;
    double pmax = 0.0, psum = 0.0;
    for (int j = j0; j < j1; ++j) {
      ph.push_back(std::exp(x[static_cast<size_t>(j)] - m_new));
      pmax = std::max(pmax, ph.back());
      psum += ph.back();
    }
    pmax += 2.220446049250313e-16;
    const double factor = ref::fp16_rne(static_cast<float>(pmax)) * pr.dqv / 127.0;
    l = l * alpha + psum;
    slack *= alpha;
    for (double& a : acc) a *= alpha;
    for (int j = j0; j < j1; ++j) {
      const double y = ph[static_cast<size_t>(j - j0)] * 127.0 / pmax;
      const int p8 = p8_of(y);
      const int steps = std::max(std::abs(p8 - p8_of(y * (1.0 - window))),
                                 std::abs(p8_of(y * (1.0 + window)) - p8));
      ++res.quantized;
      int vmax = 0;
      for (int e = 0; e < kD; ++e) {
        const int v = bt.v8[static_cast<size_t>(j * kD + e)];
        acc[static_cast<size_t>(e)] += factor * p8 * v;
        vmax = std::max(vmax, std::abs(v));
      }
      if (steps != 0) {
        ++res.near_ties;
        slack += std::fabs(factor) * steps * vmax;
      }
    }
    m = m_new;
  }
  for (int e = 0; e < kD; ++e) out[e] = acc[static_cast<size_t>(e)] / l;
  return slack / l;
}

}  // namespace

MlaQuantResult mla_full_quant(const MlaQuant& pr, const std::vector<MlaQuantBatch>& batches) {
  MlaQuantResult res;
  const int N = pr.num_heads;
  for (const auto& bt : batches)
    for (int s = 0; s < bt.q_len; ++s)
      for (int h = 0; h < N; ++h) {
        const size_t at = res.out.size();
        res.out.resize(at + kD, 0.0);
        res.slack.push_back(row(pr, bt, s, h, res.out.data() + at, res));
      }
  return res;
}

}  // namespace ref::cann
