#pragma once
/// The NPU's FRACTAL_NZ layout (docs/semantics.md §6) and conversions to and from ND.
///
/// A 2-D matrix [M, N] of elements of e bytes is stored as [N1, M1·16, C0] with C0 = 32 / e
/// (16 for fp16 / bf16, 32 for int8, 8 for float), M1 = ceil(M / 16), N1 = ceil(N / C0):
/// element (m, n) sits at [n / C0][m][n % C0] — column blocks outermost, the rows of a block
/// contiguous, C0 elements of one row together. Padding (m >= M or n >= N) is zero. Leading
/// dimensions stay in front: a batch of matrices [B, M, N] is [B, N1, M1·16, C0]. The NZ KV caches
/// of ATB treat each block as a [blockSize, kvHead·headSize] matrix: [numBlocks, hidden / C0,
/// blockSize, C0].

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

/// C0 of element type T: 32 bytes' worth of elements.
template <class T>
constexpr Index nz_c0() {
  static_assert(32 % sizeof(T) == 0, "NZ needs an element size dividing 32 bytes");
  return static_cast<Index>(32 / sizeof(T));
}

/// The NZ shape [B, N1, M1·16, C0] of a batch of [M, N] matrices of T.
template <class T>
std::array<Index, 4> nz_shape(Index batch, Index rows, Index cols) {
  constexpr Index c0 = nz_c0<T>();
  return {batch, (cols + c0 - 1) / c0, (rows + 15) / 16 * 16, c0};
}

namespace detail {

template <class T>
void check_nz_pair(const char* fn, const StridedView<const T, 3>& nd,
                   const StridedView<const T, 4>& nz, const char* nz_name) {
  const std::array<Index, 4> want = nz_shape<T>(nd.size(0), nd.size(1), nd.size(2));
  ATTNREF_CHECK(nz.shape() == want, std::invalid_argument, fn, std::string(nz_name) + ".shape",
                "mismatch with the ND shape", shape_str<4>(want), shape_str(nz));
  ATTNREF_CHECK(!overlaps(nd, nz), std::invalid_argument, fn, "out", "overlaps the input",
                "disjoint memory", "overlapping memory");
}

}  // namespace detail

/// nz[b][n / C0][m][n % C0] = nd[b][m][n]; the padding of nz is set to 0. nz: nz_shape<T>(...).
template <class T>
void nd_to_nz(const StridedView<const T, 3>& nd, const StridedView<T, 4>& nz) {
  detail::check_nz_pair("nd_to_nz", nd, StridedView<const T, 4>(nz), "nz");
  constexpr Index c0 = nz_c0<T>();
  for (Index b = 0; b < nz.size(0); ++b)
    for (Index n1 = 0; n1 < nz.size(1); ++n1)
      for (Index m = 0; m < nz.size(2); ++m)
        for (Index c = 0; c < c0; ++c) {
          const Index n = n1 * c0 + c;
          nz(b, n1, m, c) = m < nd.size(1) && n < nd.size(2) ? nd(b, m, n) : T(0);
        }
}

/// nd[b][m][n] = nz[b][n / C0][m][n % C0] (the padding of nz is not read).
template <class T>
void nz_to_nd(const StridedView<const T, 4>& nz, const StridedView<T, 3>& nd) {
  detail::check_nz_pair("nz_to_nd", StridedView<const T, 3>(nd), nz, "nz");
  constexpr Index c0 = nz_c0<T>();
  for (Index b = 0; b < nd.size(0); ++b)
    for (Index m = 0; m < nd.size(1); ++m)
      for (Index n = 0; n < nd.size(2); ++n) nd(b, m, n) = nz(b, n / c0, m, n % c0);
}

}  // namespace attnref
