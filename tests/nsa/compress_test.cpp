// nsa_compress (aclnnNsaCompress) against the independent reference tests/reference/
// nsa_compress.hpp (double): batches shorter than, equal to and longer than the block, fp16 /
// bf16 / f32, strides 16 and 32, blocks 32 and 48; a one-hot weight is strided sampling, bit for
// bit; bad input throws naming the argument before anything is written.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/nsa/compress.hpp>
#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "reference/nsa_compress.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"

namespace compress_test {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::StridedView;
using support::dbl;
using support::z;

template <class T>
struct Case {
  Index N = 3, D = 32, l = 32, d = 16;
  std::vector<std::int64_t> cu;
  std::vector<T> x, w, out;
  Index total = 0;
  Case(Index l_, Index d_, std::vector<std::int64_t> lens, unsigned seed) : l(l_), d(d_) {
    std::int64_t c = 0;
    for (std::int64_t n : lens) cu.push_back(c += n);
    for (std::int64_t n : lens) total += attnref::nsa_compressed_count(n, l, d);
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    x.resize(z(c * N * D));
    w.resize(z(l * N));
    for (T& e : x) e = T(nd(rng));
    for (T& e : w) e = T(nd(rng) * 0.2f);
    out.assign(z(total * N * D), T(7.0f));
  }
  void run(const attnref::NsaCompressParams& p) {
    attnref::nsa_compress<T>(p, StridedView<const T>(x.data(), {cu.back(), N, D}),
                             StridedView<const T>(w.data(), {l, N}), cu,
                             StridedView<T>(out.data(), {total, N, D}));
  }
  attnref::NsaCompressParams params() const {
    attnref::NsaCompressParams p;
    p.compress_block_size = l;
    p.compress_stride = d;
    return p;
  }
};

template <class T>
void check(Index l, Index d, const std::vector<std::int64_t>& lens, unsigned seed) {
  Case<T> c(l, d, lens, seed);
  c.run(c.params());
  std::vector<double> x, w, got;
  for (const T& e : c.x) x.push_back(dbl(e));
  for (const T& e : c.w) w.push_back(dbl(e));
  for (const T& e : c.out) got.push_back(dbl(e));
  std::vector<double> want = ref::nsa::compress(x, static_cast<int>(c.N), static_cast<int>(c.D), w,
                                                static_cast<int>(l), static_cast<int>(d), c.cu);
  for (double& e : want) e = dbl(T(static_cast<float>(e)));
  using K = support::Kind;
  ASSERT_EQ(want.size(), got.size());
  EXPECT_TRUE(support::all_close(want, got,
                                 support::tolerance(std::is_same_v<T, half>    ? K::F16
                                                    : std::is_same_v<T, float> ? K::F32
                                                                               : K::BF16)))
      << "l " << l << " d " << d;
}

TEST(NsaCompress, MatchesReference) {
  unsigned seed = 1;
  for (Index l : {32, 48})
    for (Index d : {16, 32}) {
      if (d > l || l % 16 != 0) continue;
      const std::vector<std::int64_t> lens = {l - 1, l, l + 1, 5 * d + l + 7, 0, 200};
      check<half>(l, d, lens, seed++);
      check<bfloat16>(l, d, lens, seed++);
      check<float>(l, d, lens, seed++);
    }
}

// weight[j][n] = 1 at j = n % l, else 0: compressed token i of head n is x[i·d + n % l][n].
TEST(NsaCompress, OneHotWeightIsStridedSamplingBitForBit) {
  Case<half> c(32, 16, {100, 31, 64}, 9);
  for (Index j = 0; j < c.l; ++j)
    for (Index n = 0; n < c.N; ++n) c.w[z(j * c.N + n)] = half(j == n % c.l ? 1.0f : 0.0f);
  c.run(c.params());
  Index o = 0, start = 0;
  for (std::int64_t end : c.cu) {
    for (Index i = 0; i < attnref::nsa_compressed_count(end - start, c.l, c.d); ++i, ++o)
      for (Index n = 0; n < c.N; ++n)
        EXPECT_EQ(std::memcmp(&c.out[z((o * c.N + n) * c.D)],
                              &c.x[z(((start + i * c.d + n % c.l) * c.N + n) * c.D)],
                              z(c.D) * sizeof(half)),
                  0)
            << "token " << o << " head " << n;
    start = end;
  }
  EXPECT_EQ(o, c.total);
}

TEST(NsaCompress, RejectsBadInputBeforeWriting) {
  const Case<half> base(32, 16, {70, 40}, 3);
  using P = attnref::NsaCompressParams;
  struct Edit {
    std::function<void(Case<half>&, P&, Index&)> f;
    const char* what;
  };
  const std::vector<Edit> edits = {
      {[](auto&, P& p, Index&) { p.layout = "BSND"; }, "params.layout"},
      {[](auto&, P& p, Index&) { p.act_seq_len_type = 1; }, "act_seq_len_type"},
      {[](auto&, P& p, Index&) { p.compress_stride = 48; }, "compress_stride"},
      {[](auto&, P& p, Index&) { p.compress_stride = 8; }, "compress_stride"},
      {[](auto& c, P&, Index&) { c.cu[1] = 60; }, "act_seq_len[1]"},
      {[](auto& c, P&, Index&) { c.cu.clear(); }, "act_seq_len"},
      {[](auto& c, P&, Index&) { c.cu[1] = 109; }, "act_seq_len"},
      {[](auto&, P&, Index& extra) { extra = 1; }, "output.shape"},
  };
  for (const auto& e : edits) {
    Case<half> c = base;
    P p = c.params();
    Index extra = 0;
    e.f(c, p, extra);
    std::vector<half> out(c.out.size() + z(extra * c.N * c.D), half(7.0f));
    support::expect_throw(
        [&] {
          attnref::nsa_compress<half>(p, StridedView<const half>(c.x.data(), {110, c.N, c.D}),
                                      StridedView<const half>(c.w.data(), {c.l, c.N}), c.cu,
                                      StridedView<half>(out.data(), {c.total + extra, c.N, c.D}));
        },
        e.what, false);
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](half h) { return dbl(h) == 7.0; }))
        << e.what;
  }
  // Vendor rules: D not a multiple of 16; relaxed mode accepts D = 8 and d = 8.
  Case<half> c(32, 8, {70}, 4);
  c.D = 8;
  c.x.resize(z(70 * c.N * c.D));
  c.out.assign(z(c.total * c.N * c.D), half(7.0f));
  P p = c.params();
  support::expect_throw([&] { c.run(p); }, "compress_stride", false);
  p.strict = false;
  EXPECT_NO_THROW(c.run(p));
}

}  // namespace compress_test
