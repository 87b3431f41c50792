// The paged KV cache type and the block-table converters: a hand-worked CSR example, round trips
// on random tables (empty sequences, exact multiples, partial last pages, -1 padding), token
// locations against the definition, and the checks naming the offending entry.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/attention/paged_kv.hpp>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/errors.hpp"

namespace paged_kv_test {

using attnref::Index;
using attnref::StridedView;

TEST(PagedKv, CsrOfAHandWorkedTable) {
  // block size 4; lengths 5 (2 pages), 0, 8 (2 full pages), 1; padding -1 and junk.
  const std::vector<std::int32_t> table{7, 2, -1, 9, 9, 9, 0, 5, -1, 3, -1, -1};
  const auto c =
      attnref::to_csr(StridedView<const std::int32_t, 2>(table.data(), {4, 3}), {5, 0, 8, 1}, 4);
  EXPECT_EQ(c.indptr, (std::vector<std::int32_t>{0, 2, 2, 4, 5}));
  EXPECT_EQ(c.indices, (std::vector<std::int32_t>{7, 2, 0, 5, 3}));
  EXPECT_EQ(c.last_page_len, (std::vector<std::int32_t>{1, 0, 4, 1}));
  const auto p = attnref::from_csr(c, 4, 3);
  EXPECT_EQ(p.context_lens, (std::vector<Index>{5, 0, 8, 1}));
  EXPECT_EQ(p.table, (std::vector<std::int32_t>{7, 2, -1, -1, -1, -1, 0, 5, -1, 3, -1, -1}));
}

TEST(PagedKv, RandomTablesRoundTripAndLocate) {
  std::mt19937 rng(21);
  for (Index bs : {1, 3, 16, 128}) {
    const Index batch = 6, max_blocks = 5, num_blocks = 40;
    std::uniform_int_distribution<Index> len_d(0, max_blocks * bs);
    std::vector<Index> lens;
    for (Index b = 0; b < batch; ++b) lens.push_back(b == 0 ? 0 : b == 1 ? bs : len_d(rng));
    std::vector<std::int32_t> ids(num_blocks);
    for (Index i = 0; i < num_blocks; ++i)
      ids[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::vector<std::int32_t> table(static_cast<size_t>(batch * max_blocks), -1);
    Index next = 0;
    for (Index b = 0; b < batch; ++b)
      for (Index j = 0; j < (lens[static_cast<size_t>(b)] + bs - 1) / bs; ++j)
        table[static_cast<size_t>(b * max_blocks + j)] =
            ids[static_cast<size_t>(next++ % num_blocks)];
    const StridedView<const std::int32_t, 2> tv(table.data(), {batch, max_blocks});
    const auto c = attnref::to_csr(tv, lens, bs);
    const auto p = attnref::from_csr(c, bs, max_blocks);
    EXPECT_EQ(p.context_lens, lens) << "bs " << bs;
    EXPECT_EQ(p.table, table) << "bs " << bs;  // used entries kept, padding -1

    std::vector<float> k(static_cast<size_t>(num_blocks * bs * 2 * 4)), v(k.size());
    attnref::PagedKvCache<float> cache{StridedView<float, 4>(k.data(), {num_blocks, bs, 2, 4}),
                                       StridedView<float, 4>(v.data(), {num_blocks, bs, 2, 4}), tv,
                                       lens};
    cache.validate();
    for (Index b = 0; b < batch; ++b)
      for (Index t = 0; t < lens[static_cast<size_t>(b)]; ++t) {
        const attnref::PagedSlot s = cache.locate(b, t);
        ASSERT_EQ(s.block, table[static_cast<size_t>(b * max_blocks + t / bs)]);
        ASSERT_EQ(s.offset, t % bs);
      }
  }
}

TEST(PagedKv, ChecksNameTheEntry) {
  std::vector<float> k(8 * 4 * 1 * 2), v(k.size());
  const std::vector<std::int32_t> table{0, 1, 2, 3, 8, -1};
  attnref::PagedKvCache<float> cache{StridedView<float, 4>(k.data(), {8, 4, 1, 2}),
                                     StridedView<float, 4>(v.data(), {8, 4, 1, 2}),
                                     StridedView<const std::int32_t, 2>(table.data(), {2, 3}),
                                     {12, 5}};
  auto expect = [](auto&& f, const std::string& what, bool range) {
    support::expect_throw(f, what, range);
  };
  expect([&] { cache.validate(); }, "block_table[1][1] out of range: expected [0, 8), got 8", true);
  expect([&] { (void)cache.locate(1, 4); }, "block_table[1][1] out of range", true);
  EXPECT_EQ(cache.locate(1, 2).block, 3);
  expect([&] { (void)cache.locate(0, 12); }, "t out of range: expected [0, 12), got 12", true);
  cache.context_lens = {13, 0};
  expect([&] { cache.validate(); },
         "context_lens[0] exceeds block_table.shape[1] * blockSize: expected <= 12, got 13", false);
  attnref::CsrBlockTable bad{{0, 2}, {1, 2}, {5}};
  expect([&] { (void)attnref::from_csr(bad, 4); },
         "last_page_len[0] out of range: expected [1, 4], got 5", false);
}

}  // namespace paged_kv_test
