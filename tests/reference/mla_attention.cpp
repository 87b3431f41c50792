// The definitions of reference/mla_attention.hpp (documented there), compiled once into the
// attnref_test_reference library, with -O2 in every preset (see the top-level CMakeLists.txt).

#include "reference/mla_attention.hpp"

namespace ref::mla {

std::vector<double> mla_decode(const std::vector<double>& q, int B, int H, int C, int R,
                               const std::vector<double>& cache, int bs,
                               const std::vector<std::int32_t>& table, int maxb,
                               const std::vector<int>& lens, double scale) {
  const int W = C + R;
  std::vector<double> o(static_cast<size_t>(B) * H * C, 0.0);
  for (int b = 0; b < B; ++b) {
    const int L = lens[static_cast<size_t>(b)];
    auto row = [&](int t) {
      const int blk = table[static_cast<size_t>(b) * maxb + t / bs];
      return &cache[(static_cast<size_t>(blk) * bs + t % bs) * W];
    };
    for (int h = 0; h < H; ++h) {
      if (L == 0) continue;
      const double* qh = &q[(static_cast<size_t>(b) * H + h) * W];
      std::vector<double> s(static_cast<size_t>(L));
      double mx = -INFINITY;
      for (int t = 0; t < L; ++t) {
        double dot = 0.0;
        const double* r = row(t);
        for (int j = 0; j < W; ++j) dot += qh[j] * r[j];
        s[static_cast<size_t>(t)] = scale * dot;
        mx = std::max(mx, s[static_cast<size_t>(t)]);
      }
      double sum = 0.0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      double* oh = &o[(static_cast<size_t>(b) * H + h) * C];
      for (int t = 0; t < L; ++t) {
        const double p = s[static_cast<size_t>(t)] / sum;
        const double* r = row(t);
        for (int c = 0; c < C; ++c) oh[c] += p * r[c];
      }
    }
  }
  return o;
}

}  // namespace ref::mla
