#pragma once
/// attnref::nsa_compress — CANN aclnnNsaCompress: the weighted block compression of NSA's
/// compressed branch. Raw keys (or values) x [T, N, D] in TND with cumulative lengths; batch b's
/// tokens [cu[b−1], cu[b]) give floor((len_b − l)/d) + 1 compressed tokens (none when len_b < l),
/// compressed token i of head n being
///   out[i][n][:] = Σ_{j<l} weight[j][n] · x[i·d + j][n][:]
/// accumulated in fp32 in j order (each step acc = fp32(acc + w·x), the product exact) and rounded
/// once to T. The outputs of the batches follow one
/// another ([T', N, D], T' the sum of the counts). The vendor's constraints (N <= 128, D a
/// multiple of 16 up to 256, l a multiple of 16 up to 128, d a multiple of 16, l >= d) are
/// checked by default; strict = false keeps l >= d >= 1.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/layout.hpp"
#include "attnref/core/types.hpp"

namespace attnref {

struct NsaCompressParams {
  std::int64_t compress_block_size = 32;  ///< compressBlockSize l
  std::int64_t compress_stride = 16;      ///< compressStride d
  std::string layout = "TND";             ///< layoutOptional (TND only, as the vendor)
  std::int64_t act_seq_len_type = 0;      ///< actSeqLenType (0: cumulative, the vendor's only)
  bool strict = true;                     ///< the vendor's constraint list
};

/// Compressed tokens of a batch of `len` raw tokens.
inline Index nsa_compressed_count(Index len, Index compress_block_size, Index compress_stride) {
  return len < compress_block_size ? 0 : (len - compress_block_size) / compress_stride + 1;
}

namespace detail {
/// nsa_compress on dense arguments: the public entry below passes every view through a
/// DenseArena first.
template <class T>
void nsa_compress_dense(const NsaCompressParams& p, const StridedView<const T>& input,
                        const StridedView<const T>& weight,
                        const std::vector<std::int64_t>& act_seq_len,
                        const StridedView<T>& output) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "nsa_compress: half or bfloat16 (float: attnref extension)");
  constexpr const char* fn = "nsa_compress";
  detail::check_views(fn, "input", input, "weight", weight, "output", output);
  const std::string rule = p.strict ? " (vendor rule; params.strict = false relaxes it)" : "";
  const std::int64_t l = p.compress_block_size, d = p.compress_stride;
  detail::parse_layout("nsa_compress", "params.layout", p.layout, {Layout::TND});
  ATTNREF_CHECK(p.act_seq_len_type == 0, std::invalid_argument, "nsa_compress",
                "params.act_seq_len_type", "not supported", "0 (cumulative lengths)",
                std::to_string(p.act_seq_len_type));
  ATTNREF_CHECK(d >= 1 && l >= d, std::invalid_argument, "nsa_compress",
                "params.compress_block_size / compress_stride",
                "need compress_block_size >= compress_stride >= 1", "l >= d >= 1",
                std::to_string(l) + " / " + std::to_string(d));
  if (p.strict)
    ATTNREF_CHECK(l % 16 == 0 && l <= 128 && d % 16 == 0, std::invalid_argument, "nsa_compress",
                  "params.compress_block_size / compress_stride", "not supported" + rule,
                  "l a multiple of 16 up to 128, d a multiple of 16",
                  std::to_string(l) + " / " + std::to_string(d));
  ATTNREF_CHECK(!input.absent() && input.rank() == 3 && input.size(1) > 0 && input.size(2) > 0,
                std::invalid_argument, "nsa_compress", "input.shape", "not [T, N, D]", "[T, N, D]",
                detail::shape_str(input));
  const Index Tn = input.size(0), N = input.size(1), D = input.size(2);
  if (p.strict)
    ATTNREF_CHECK(N <= 128 && D % 16 == 0 && D <= 256, std::invalid_argument, "nsa_compress",
                  "input.shape", "not supported" + rule, "N <= 128, D a multiple of 16 up to 256",
                  detail::shape_str(input));
  ATTNREF_CHECK(
      !weight.absent() && weight.rank() == 2 && weight.size(0) == l && weight.size(1) == N,
      std::invalid_argument, "nsa_compress", "weight.shape", "mismatch",
      "[" + std::to_string(l) + ", " + std::to_string(N) + "]", detail::shape_str(weight));
  ATTNREF_CHECK(!act_seq_len.empty(), std::invalid_argument, "nsa_compress", "act_seq_len",
                "required", "cumulative lengths", "none");
  Index prev = 0, total = 0;
  for (size_t b = 0; b < act_seq_len.size(); ++b) {
    const std::int64_t c = act_seq_len[b];
    ATTNREF_CHECK(c >= prev, std::invalid_argument, "nsa_compress",
                  "act_seq_len[" + std::to_string(b) + "]", "not cumulative",
                  ">= " + std::to_string(prev), std::to_string(c));
    total += nsa_compressed_count(c - prev, l, d);
    prev = c;
  }
  ATTNREF_CHECK(prev == Tn, std::invalid_argument, "nsa_compress", "act_seq_len",
                "last value differs from input.shape[0]", std::to_string(Tn), std::to_string(prev));
  ATTNREF_CHECK(
      !output.absent() && output.rank() == 3 && output.size(0) == total && output.size(1) == N &&
          output.size(2) == D,
      std::invalid_argument, "nsa_compress", "output.shape", "mismatch",
      "[" + std::to_string(total) + ", " + std::to_string(N) + ", " + std::to_string(D) + "]",
      detail::shape_str(output));
  // Nothing has been written yet.
  std::vector<float> acc(static_cast<size_t>(D));
  Index start = 0, o = 0;
  for (const std::int64_t c : act_seq_len) {
    const Index count = nsa_compressed_count(c - start, l, d);
    for (Index i = 0; i < count; ++i, ++o)
      for (Index n = 0; n < N; ++n) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (Index j = 0; j < l; ++j) {
          const float w = static_cast<float>(weight.data()[j * N + n]);
          const T* x = input.data() + ((start + i * d + j) * N + n) * D;
          for (Index e = 0; e < D; ++e)
            acc[static_cast<size_t>(e)] = static_cast<float>(
                double(acc[static_cast<size_t>(e)]) + double(w) * double(static_cast<float>(x[e])));
        }
        T* dst = output.data() + (o * N + n) * D;
        for (Index e = 0; e < D; ++e) dst[e] = T(acc[static_cast<size_t>(e)]);
      }
    start = c;
  }
}
}  // namespace detail

/// input [T, N, D], weight [l, N], act_seq_len cumulative (B values, the last = T), output
/// [T', N, D]. T: half or bfloat16 (float: attnref extension).
template <class T>
void nsa_compress(const NsaCompressParams& p, const StridedView<const T>& input,
                  const StridedView<const T>& weight, const std::vector<std::int64_t>& act_seq_len,
                  const StridedView<T>& output) {
  detail::DenseArena arena("nsa_compress");
  StridedView<const T> dx = input, dw = weight;
  StridedView<T> dout = output;
  arena.input("input", dx);
  arena.input("weight", dw);
  arena.output("output", dout);
  detail::nsa_compress_dense(p, dx, dw, act_seq_len, dout);
  arena.commit();
}

}  // namespace attnref
