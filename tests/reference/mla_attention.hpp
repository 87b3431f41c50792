#pragma once
// Independent reference of MLA decode attention over a latent paged cache (absorbed form), in
// double. Cache row t of sequence b: row(t) = cache[block_table[b][t / bs]][t % bs] (C + R
// values: the latent c_t then k_rope(t)). Head h of sequence b with query q (C + R values):
//   s_t = scale · q · row(t),  o = Σ_t softmax(s)_t · row(t)[0:C];  no key: o = 0.
// Does not include attnref.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace ref::mla {

// q [B][H][C + R], cache [blocks][bs][C + R] (values as double), table [B][maxb], lens [B].
// Returns [B][H][C].
std::vector<double> mla_decode(const std::vector<double>& q, int B, int H, int C, int R,
                               const std::vector<double>& cache, int bs,
                               const std::vector<std::int32_t>& table, int maxb,
                               const std::vector<int>& lens, double scale);

}  // namespace ref::mla
