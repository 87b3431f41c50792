// The definitions of reference/nsa_compress.hpp (documented there), compiled once into the
// attnref_test_reference library, with -O2 in every preset (see the top-level CMakeLists.txt).

#include "reference/nsa_compress.hpp"

#include <cstddef>

namespace ref::nsa {

std::vector<double> compress(const std::vector<double>& x, int N, int D,
                             const std::vector<double>& w, int l, int d,
                             const std::vector<std::int64_t>& cu) {
  std::vector<double> out;
  std::int64_t start = 0;
  for (std::int64_t end : cu) {
    const std::int64_t len = end - start;
    for (std::int64_t i = 0; len >= l && i <= (len - l) / d; ++i)
      for (int n = 0; n < N; ++n)
        for (int e = 0; e < D; ++e) {
          double s = 0.0;
          for (int j = 0; j < l; ++j)
            s += w[static_cast<size_t>(j) * N + n] *
                 x[(static_cast<size_t>(start + i * d + j) * N + n) * D + e];
          out.push_back(s);
        }
    start = end;
  }
  return out;
}

namespace {

float fold(std::vector<float> v) {
  while (v.size() > 1) {
    std::size_t h = 1;
    while (h * 2 < v.size()) h *= 2;
    for (std::size_t i = 0; i + h < v.size(); ++i) v[i] = v[i] + v[i + h];
    v.resize(h);
  }
  return v.empty() ? 0.0f : v[0];
}

}  // namespace

std::vector<float> compress_block_vendor(const std::vector<double>& x, int N, int D,
                                         const std::vector<double>& w, int l) {
  std::vector<float> out;
  for (int n = 0; n < N; ++n)
    for (int e = 0; e < D; ++e) {
      std::vector<float> runs;
      for (int r0 = 0; r0 < l; r0 += 8) {
        std::vector<float> run;
        for (int j = r0; j < l && j < r0 + 8; ++j) {
          const float wj = static_cast<float>(w[static_cast<std::size_t>(j) * N + n]);
          const float xj = static_cast<float>(x[(static_cast<std::size_t>(j) * N + n) * D + e]);
          run.push_back(wj * xj);
        }
        runs.push_back(fold(run));
      }
      out.push_back(fold(runs));
    }
  return out;
}

}  // namespace ref::nsa
