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

}  // namespace ref::nsa
