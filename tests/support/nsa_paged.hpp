#pragma once
// The paged caches of the NSA operator tests: per-sequence token rows in blocks handed out from a
// shuffled pool, the shape [blocks, page, row] the NSA operators read through a block table.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace support {

template <class T>
struct PagedPool {
  std::vector<T> k, v;              // [blocks, page, row_k] / [blocks, page, row_v]
  std::vector<std::int32_t> table;  // [len.size(), max_blocks]
  int max_blocks = 1, blocks = 0;
};

/// Sequence b's len[b] tokens, row t of keys(b) / values(b) (token-major doubles, row_k / row_v
/// elements a token), in blocks of `page` rows: each sequence takes its blocks in order from a
/// pool of every block shuffled by std::mt19937(seed), `spare` blocks stay unused, and every row
/// not written holds NaN. The table has one column more than the longest sequence needs, -1 past
/// each sequence's blocks. Tokens below lo[b] (lo empty: none) keep their NaN too.
template <class T, class Keys, class Values>
PagedPool<T> page_tokens(const std::vector<long>& len, int page, int row_k, int row_v, Keys&& keys,
                         Values&& values, int spare, unsigned seed,
                         const std::vector<long>& lo = {}) {
  PagedPool<T> p;
  const std::size_t B = len.size();
  int used = 0, longest = 0;
  for (long x : len) {
    const int n = static_cast<int>((x + page - 1) / page);
    used += n, longest = std::max(longest, n);
  }
  p.max_blocks = longest + 1;
  p.blocks = used + spare;
  std::vector<std::int32_t> pool(static_cast<std::size_t>(p.blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::mt19937 prng(seed);
  std::shuffle(pool.begin(), pool.end(), prng);
  p.table.assign(B * static_cast<std::size_t>(p.max_blocks), -1);
  p.k.assign(static_cast<std::size_t>(p.blocks) * static_cast<std::size_t>(page * row_k), T(NAN));
  p.v.assign(static_cast<std::size_t>(p.blocks) * static_cast<std::size_t>(page * row_v), T(NAN));
  std::size_t next = 0;
  for (std::size_t b = 0; b < B; ++b) {
    const std::vector<double>& kd = keys(b);
    const std::vector<double>& vd = values(b);
    for (long t = 0; t < len[b]; ++t) {
      std::int32_t& entry =
          p.table[b * static_cast<std::size_t>(p.max_blocks) + static_cast<std::size_t>(t / page)];
      if (t % page == 0) entry = pool[next++];
      if (!lo.empty() && t < lo[b]) continue;
      const long r = long{entry} * page + t % page;
      for (int e = 0; e < row_k; ++e)
        p.k[static_cast<std::size_t>(r * row_k + e)] =
            T(static_cast<float>(kd[static_cast<std::size_t>(t * row_k + e)]));
      for (int e = 0; e < row_v; ++e)
        p.v[static_cast<std::size_t>(r * row_v + e)] =
            T(static_cast<float>(vd[static_cast<std::size_t>(t * row_v + e)]));
    }
  }
  return p;
}

}  // namespace support
