// FRACTAL_NZ conversions: the element placement of docs/semantics.md §6 computed here as a flat
// offset, zero padding, exact round trips for fp16, bf16, int8 and float, and bad shapes.

#include <gtest/gtest.h>

#include <attnref/core/nz.hpp>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "support/errors.hpp"

namespace nz_test {

using attnref::Index;
using attnref::StridedView;

template <class T>
void round_trip(Index batch, Index rows, Index cols, Index c0) {
  ASSERT_EQ(attnref::nz_c0<T>(), c0);
  std::mt19937 rng(static_cast<unsigned>(rows * 131 + cols));
  std::uniform_int_distribution<int> u(-100, 100);
  std::vector<T> nd(static_cast<size_t>(batch * rows * cols));
  for (T& x : nd) x = T(static_cast<float>(u(rng)));
  const auto shape = attnref::nz_shape<T>(batch, rows, cols);
  const Index m1 = (rows + 15) / 16, n1 = (cols + c0 - 1) / c0;
  ASSERT_EQ(shape[1], n1);
  ASSERT_EQ(shape[2], m1 * 16);
  std::vector<T> nz(static_cast<size_t>(batch * n1 * m1 * 16 * c0), T(99.0f));
  attnref::nd_to_nz(StridedView<const T, 3>(nd.data(), {batch, rows, cols}),
                    StridedView<T, 4>(nz.data(), shape));
  // Placement: flat offset of (b, m, n) is ((b·N1 + n / C0)·M1·16 + m)·C0 + n % C0.
  for (Index b = 0; b < batch; ++b)
    for (Index m = 0; m < m1 * 16; ++m)
      for (Index n = 0; n < n1 * c0; ++n) {
        const size_t off = static_cast<size_t>(((b * n1 + n / c0) * m1 * 16 + m) * c0 + n % c0);
        const float want =
            m < rows && n < cols
                ? static_cast<float>(nd[static_cast<size_t>((b * rows + m) * cols + n)])
                : 0.0f;
        ASSERT_EQ(static_cast<float>(nz[off]), want) << "b " << b << " m " << m << " n " << n;
      }
  std::vector<T> back(nd.size(), T(7.0f));
  attnref::nz_to_nd(StridedView<const T, 4>(nz.data(), shape),
                    StridedView<T, 3>(back.data(), {batch, rows, cols}));
  for (size_t i = 0; i < nd.size(); ++i)
    ASSERT_EQ(static_cast<float>(back[i]), static_cast<float>(nd[i])) << i;
}

TEST(Nz, PlacementPaddingAndRoundTrip) {
  for (Index rows : {1, 15, 16, 17, 40})
    for (Index cols : {1, 16, 31, 32, 33, 64}) {
      round_trip<attnref::half>(2, rows, cols, 16);
      round_trip<attnref::bfloat16>(1, rows, cols, 16);
      round_trip<std::int8_t>(2, rows, cols, 32);
      round_trip<float>(1, rows, cols, 8);
    }
}

TEST(Nz, BadShapesThrowBeforeWriting) {
  std::vector<attnref::half> nd(2 * 20 * 24), nz(2 * 2 * 32 * 16, attnref::half(5.0f));
  // [2, 20, 24] -> [2, 2, 32, 16]; a wrong NZ shape is rejected.
  support::expect_rejected(
      [&] {
        attnref::nd_to_nz(StridedView<const attnref::half, 3>(nd.data(), {2, 20, 24}),
                          StridedView<attnref::half, 4>(nz.data(), {2, 2, 16, 16}));
      },
      "attnref::nd_to_nz: nz.shape mismatch with the ND shape: expected [2, 2, 32, 16], got [2, 2, "
      "16, 16]");
  for (const auto& x : nz) ASSERT_EQ(static_cast<float>(x), 5.0f);
}

}  // namespace nz_test
