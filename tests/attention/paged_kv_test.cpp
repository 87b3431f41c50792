// The paged KV cache type and the block-table converters: a hand-worked CSR example, round trips
// on random tables (empty sequences, exact multiples, partial last pages, -1 padding), token
// locations against the definition, the checks naming the offending entry under the caller's
// names, and the engine reading a cache through AttentionInputs::read_kv.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/attention/attention.hpp>
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

TEST(PagedKv, ValidateNamesTheCallersArguments) {
  std::vector<float> k(8 * 4 * 1 * 2), v(8 * 4 * 1 * 3);
  const std::vector<std::int32_t> table{0, 1, 2, 3, -1, -1};
  attnref::PagedKvCache<float> cache{StridedView<float, 4>(k.data(), {8, 4, 1, 2}),
                                     StridedView<float, 4>(v.data(), {8, 4, 1, 3}),
                                     StridedView<const std::int32_t, 2>(table.data(), {2, 3}),
                                     {12, 9}};
  const attnref::PagedNames names{
      "key_cache", "value_cache", "block_tables", "context_lens", "key_cache.shape[1] (blockSize)",
      "blockSize"};
  support::expect_throw([&] { cache.validate("op", names); },
                        "attnref::op: block_tables[1][1] out of range: expected [0, 8), got -1",
                        true);
  cache.context_lens = {12, -1};
  support::expect_throw([&] { cache.validate("op", names); },
                        "context_lens[1] negative: expected >= 0, got -1", false);
  cache.context_lens = {12, 4};
  cache.validate("op", names);  // entries past a sequence's used blocks are never read
  cache.v = StridedView<float, 4>(v.data(), {8, 3, 1, 3});
  support::expect_throw([&] { cache.validate("op", names); },
                        "value_cache.shape mismatch with key_cache: expected [8, 4, 1, headSizeV]",
                        false);
  cache.v = StridedView<float, 4>(v.data(), {8, 4, 1, 3});
  cache.block_table = StridedView<const std::int32_t, 2>(nullptr, {2, 3});
  support::expect_throw([&] { cache.validate("op", names); }, "block_tables", false);
  cache.k = StridedView<float, 4>(k.data(), {8, 0, 1, 2});
  cache.v = StridedView<float, 4>(v.data(), {8, 0, 1, 3});
  cache.block_table = StridedView<const std::int32_t, 2>(table.data(), {2, 3});
  support::expect_throw([&] { cache.validate("op", names); },
                        "key_cache.shape[1] (blockSize) not positive", false);
}

// The engine reads a shuffled paged cache through read_kv exactly as it reads the same keys laid
// out contiguously (bit for bit: pages change where rows live, not the arithmetic).
TEST(PagedKv, EngineReadsTheCacheLikeContiguousKeys) {
  const Index bs = 4, blocks = 9, nkv = 2, d = 8, B = 2, max_blocks = 4;
  const std::vector<Index> lens{13, 6};
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> kp(static_cast<size_t>(blocks * bs * nkv * d)), vp(kp.size());
  for (float& x : kp) x = u(rng);
  for (float& x : vp) x = u(rng);
  const std::vector<std::int32_t> table{7, 2, 5, 0, 8, 1, -1, -1};
  const attnref::PagedKvCache<const float> cache{
      StridedView<const float, 4>(kp.data(), {blocks, bs, nkv, d}),
      StridedView<const float, 4>(vp.data(), {blocks, bs, nkv, d}),
      StridedView<const std::int32_t, 2>(table.data(), {B, max_blocks}), lens};
  cache.validate();
  // The same keys gathered by hand through locate().
  const Index L = 13;
  std::vector<float> kc(static_cast<size_t>(B * L * nkv * d)), vc(kc.size());
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < lens[static_cast<size_t>(b)]; ++t) {
      const attnref::PagedSlot s = cache.locate(b, t);
      for (Index h = 0; h < nkv; ++h)
        for (Index x = 0; x < d; ++x) {
          const size_t at = static_cast<size_t>(((b * L + t) * nkv + h) * d + x);
          kc[at] = cache.k(s.block, s.offset, h, x);
          vc[at] = cache.v(s.block, s.offset, h, x);
        }
    }
  std::vector<float> q(static_cast<size_t>(B * 1 * 4 * d));
  for (float& x : q) x = u(rng);
  const StridedView<const float, 4> qv(q.data(), {B, 1, 4, d});
  attnref::AttentionParams p;
  p.scale = 0.35;
  std::vector<float> o_paged(static_cast<size_t>(B * 4 * d)), o_flat(o_paged.size());
  attnref::AttentionInputs<float> paged{qv, {}, {}};
  paged.read_kv(cache);
  EXPECT_EQ(paged.paged_kv().context_lens, lens);
  attnref::attention(
      paged, p,
      attnref::AttentionOutputs<float>{StridedView<float, 4>(o_paged.data(), {B, 1, 4, d})});
  attnref::AttentionInputs<float> flat{qv, StridedView<const float, 4>(kc.data(), {B, L, nkv, d}),
                                       StridedView<const float, 4>(vc.data(), {B, L, nkv, d})};
  flat.seq.kv = lens;
  attnref::attention(
      flat, p,
      attnref::AttentionOutputs<float>{StridedView<float, 4>(o_flat.data(), {B, 1, 4, d})});
  for (size_t i = 0; i < o_flat.size(); ++i) ASSERT_EQ(o_paged[i], o_flat[i]) << i;
  // A table entry out of range is named under the engine's arguments.
  std::vector<std::int32_t> bad = table;
  bad[1] = 9;
  paged.block_table = StridedView<const std::int32_t, 2>(bad.data(), {B, max_blocks});
  support::expect_throw(
      [&] {
        attnref::attention(
            paged, p,
            attnref::AttentionOutputs<float>{StridedView<float, 4>(o_paged.data(), {B, 1, 4, d})});
      },
      "block_table[0][1] out of range: expected [0, 9), got 9", true);
}

}  // namespace paged_kv_test
