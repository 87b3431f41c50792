#pragma once
// Independent reference of NSA's block compression (aclnnNsaCompress), in double: batch b's raw
// tokens x_b[0, len_b) give compressed tokens i = 0 .. floor((len_b - l) / d) (none when
// len_b < l), out[i][n][e] = sum_{j < l} w[j][n] * x_b[i*d + j][n][e]; batches in order.
// Does not include attnref.

#include <cstdint>
#include <vector>

namespace ref::nsa {

// x [T][N][D] (TND), w [l][N], cu cumulative lengths. Returns [T'][N][D].
std::vector<double> compress(const std::vector<double>& x, int N, int D,
                             const std::vector<double>& w, int l, int d,
                             const std::vector<std::int64_t>& cu);

}  // namespace ref::nsa
