#pragma once
// Shared by the nsa_compress_with_cache and decode-loop tests: random or exactly summable raw
// tokens, and one compressed token as the vendor kernel sums it (ref::nsa::compress_block_vendor),
// rounded to the element type.

#include <attnref/core/types.hpp>
#include <random>
#include <vector>

#include "reference/nsa_compress.hpp"
#include "support/cast.hpp"

namespace compress_with_cache_support {

using attnref::Index;
using support::z;

/// Raw tokens x[t][n][e] of a sequence: normal values, or (exact) small multiples of 1/4 whose
/// weighted sums are exact in fp32 whatever the order.
template <class T>
std::vector<double> tokens(Index len, Index N, Index D, std::mt19937& rng, bool exact) {
  std::normal_distribution<double> nd;
  std::uniform_int_distribution<int> small(-4, 4);
  std::vector<double> x(z(len * N * D));
  for (double& e : x) e = exact ? small(rng) : support::rnd<T>(nd(rng));
  return x;
}

/// The compressed token of tokens [end − l, end) of x as the vendor kernel sums it, rounded to T.
template <class T>
std::vector<T> vendor_token(const std::vector<double>& x, Index end, Index N, Index D,
                            const std::vector<double>& w, Index l) {
  const std::vector<double> blk(x.begin() + (end - l) * N * D, x.begin() + end * N * D);
  const std::vector<float> f = ref::nsa::compress_block_vendor(
      blk, static_cast<int>(N), static_cast<int>(D), w, static_cast<int>(l));
  std::vector<T> r;
  for (float v : f) r.push_back(T(v));
  return r;
}

}  // namespace compress_with_cache_support
