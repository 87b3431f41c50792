#pragma once
// Independent reference of NSA's block compression (aclnnNsaCompress), in double: batch b's raw
// tokens x_b[0, len_b) give compressed tokens i = 0 .. floor((len_b - l) / d) (none when
// len_b < l), out[i][n][e] = sum_{j < l} w[j][n] * x_b[i*d + j][n][e]; batches in order.
// compress_block_vendor is aclnnNsaCompressWithCache's own fp32 arithmetic for one compressed
// token. Does not include attnref.

#include <cstdint>
#include <vector>

namespace ref::nsa {

// x [T][N][D] (TND), w [l][N], cu cumulative lengths. Returns [T'][N][D].
std::vector<double> compress(const std::vector<double>& x, int N, int D,
                             const std::vector<double>& w, int l, int d,
                             const std::vector<std::int64_t>& cu);

// One compressed token as the aclnnNsaCompressWithCache kernel sums it, in fp32: x [l][N][D]
// holds the block's raw tokens (values of the input dtype), w [l][N] the weights. Each product
// w[j][n] * x[j][n][e] is one fp32 multiplication; the tokens are cut into runs of 8 (the last
// run shorter when l % 8 != 0), each run is folded to one value, then the run values are folded
// to one. Folding a list of n > 1 values: with h the largest power of two below n, value i gets
// value i + h added for every i < n - h, the list keeps its first h values, and so on until one
// value is left. Returns [N][D], not rounded to the input dtype.
std::vector<float> compress_block_vendor(const std::vector<double>& x, int N, int D,
                                         const std::vector<double>& w, int l);

}  // namespace ref::nsa
