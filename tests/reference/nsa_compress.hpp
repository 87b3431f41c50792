#pragma once
// Independent reference of NSA's block compression (aclnnNsaCompress), in double: batch b's raw
// tokens x_b[0, len_b) give compressed tokens i = 0 .. floor((len_b - l) / d) (none when
// len_b < l), out[i][n][e] = sum_{j < l} w[j][n] * x_b[i*d + j][n][e]; batches in order.
// Does not include attnref.

#include <cstdint>
#include <vector>

namespace ref::nsa {

// x [T][N][D] (TND), w [l][N], cu cumulative lengths. Returns [T'][N][D].
inline std::vector<double> compress(const std::vector<double>& x, int N, int D,
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
