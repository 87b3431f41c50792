#pragma once
/// MLA decode attention over the latent paged cache that mla_preprocess writes (KvCache mode:
/// [blocks, blockSize, 1, C + R], row t = concat(k_nope(t) = c_t, k_rope(t))).
///
/// Absorbed form (mla_decode), what DeepSeek inference runs: the query of head h is
/// q_h = concat(wuk[h]ᵀ · q_nope_h, q_rope_h) (C + R wide: mla_preprocess's q_out), every head
/// attends to the same single latent "kv head":
///   s_t = scale · q_h · row(t),   o_h = Σ_t softmax(s)_t · c_t          (o_h: C wide)
/// on the attention engine (K = the cache rows, V = their first C elements, one kv head). The
/// output projection through wuv (o_h -> v heads) is the caller's.
///
/// Un-absorbed form (mla_decode_unabsorbed), for verification: the latent is expanded through
/// the up-projection, k_h(t) = concat(wuk[h] · c_t, k_rope(t)) (P + R wide, fp32), v_h(t) = c_t,
/// q_h = concat(q_nope_h, q_rope_h); the same attention, per head, on fp32 copies. Equal to the
/// absorbed form in exact arithmetic: q_nope · (wuk c) = (wukᵀ q_nope) · c.
///
/// A sequence with no key gives 0. Block-table entries in use outside [0, blocks) throw
/// std::out_of_range; everything is checked before anything is written.

#include <array>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/attention.hpp"
#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"
#include "attnref/mla/rmsnorm_quant.hpp"

namespace attnref {

struct MlaDecodeParams {
  Index kv_lora_rank = 512;  ///< C
  Index rope_dim = 64;       ///< R
  /// Softmax scale; DeepSeek-V3 uses 1 / sqrt(nope_dim + rope_dim) = 1 / sqrt(192) (times its
  /// YaRN mscale², the caller's to fold in).
  double scale = 0.07216878364870322;
};

template <class T>
struct MlaDecodeInputs {
  StridedView<const T> q;                       ///< [B, heads, C + R] (absorbed q_nope | q_rope)
  StridedView<const T> kv_cache;                ///< [blocks, blockSize, 1, C + R]
  StridedView<const std::int32_t> block_table;  ///< [B, maxBlocksPerSeq]
  std::vector<Index> context_lens;              ///< B kv lengths

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("q", q), f("kv_cache", kv_cache), f("block_table", block_table);
  }
};

template <class T>
struct MlaUnabsorbedInputs {
  StridedView<const T> q_nope;                  ///< [B, heads, P] (before absorption)
  StridedView<const T> q_rope;                  ///< [B, heads, R] (after RoPE)
  StridedView<const T> wuk;                     ///< [heads, P, C]
  StridedView<const T> kv_cache;                ///< [blocks, blockSize, 1, C + R]
  StridedView<const std::int32_t> block_table;  ///< [B, maxBlocksPerSeq]
  std::vector<Index> context_lens;              ///< B kv lengths

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("q_nope", q_nope), f("q_rope", q_rope), f("wuk", wuk), f("kv_cache", kv_cache);
    f("block_table", block_table);
  }
};

/// The output of mla_decode and mla_decode_unabsorbed.
template <class T>
struct MlaDecodeOutputs {
  StridedView<T> out;  ///< [B, heads, C]

  template <class F>
  void for_each_view(F&& f) {
    f("out", out);
  }
};

namespace detail::mla {

/// The latent cache [blocks, blockSize, 1, W] with its block table and lengths as the one paged
/// type, validated under mla_decode's names: k reads all W columns of a row, v its first C.
template <class T>
PagedKvCache<const T> paged_cache(const char* fn, const StridedView<const T>& cache,
                                  const StridedView<const std::int32_t>& table,
                                  const std::vector<Index>& lens, Index B, Index W, Index C) {
  ATTNREF_CHECK(!cache.absent() && cache.rank() == 4 && cache.size(1) > 0 && cache.size(2) == 1 &&
                    cache.size(3) == W,
                std::invalid_argument, fn, "kv_cache.shape", "mismatch",
                "[blocks, blockSize, 1, " + std::to_string(W) + "]", detail::shape_str(cache));
  ATTNREF_CHECK(!table.absent() && table.rank() == 2 && table.size(0) == B, std::invalid_argument,
                fn, "block_table.shape", "mismatch", "[" + std::to_string(B) + ", maxBlocksPerSeq]",
                detail::shape_str(table));
  ATTNREF_CHECK(static_cast<Index>(lens.size()) == B, std::invalid_argument, fn, "context_lens",
                "size mismatch", std::to_string(B), std::to_string(lens.size()));
  // A row of one element: any stride reads it.
  const std::array<Index, 4> st{cache.stride(0), cache.stride(1), cache.stride(2),
                                W == 1 ? 1 : cache.stride(3)};
  const PagedKvCache<const T> pc{
      StridedView<const T, 4>(cache.data(), {cache.size(0), cache.size(1), 1, W}, st),
      StridedView<const T, 4>(cache.data(), {cache.size(0), cache.size(1), 1, C}, st),
      table.template fixed<2>(fn, "block_table"), lens};
  pc.validate(fn, {"kv_cache", "kv_cache", "block_table", "context_lens",
                   "kv_cache.shape[1] (blockSize)", "blockSize"});
  return pc;
}

/// Checks the decode params; returns the cache row width C + R.
inline Index decode_width(const char* fn, const MlaDecodeParams& params) {
  const Index C = params.kv_lora_rank, R = params.rope_dim;
  ATTNREF_CHECK(C > 0 && R >= 0, std::invalid_argument, fn, "params.kv_lora_rank / rope_dim",
                "out of range", "C > 0, R >= 0", std::to_string(C) + " / " + std::to_string(R));
  ATTNREF_CHECK(std::isfinite(params.scale), std::invalid_argument, fn, "params.scale",
                "not finite", "a finite value", std::to_string(params.scale));
  return detail::checked_add(fn, "params.kv_lora_rank + rope_dim", C, R);
}

}  // namespace detail::mla

namespace detail {
/// mla_decode (run) or its validation alone (!run).
template <class T>
void mla_decode_call(const MlaDecodeParams& params, const MlaDecodeInputs<T>& in,
                     const MlaDecodeOutputs<T>& outs, const ExecConfig& exec, bool run) {
  check_exec("mla_decode", exec);
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "mla_decode: half, bfloat16 or float");
  using namespace detail::mla;
  constexpr const char* fn = "mla_decode";
  const StridedView<T>& out = outs.out;
  detail::check_views(fn, "q", in.q, "kv_cache", in.kv_cache, "block_table", in.block_table, "out",
                      out);
  const Index C = params.kv_lora_rank, W = decode_width(fn, params);
  ATTNREF_CHECK(!in.q.absent() && in.q.rank() == 3 && in.q.size(1) > 0 && in.q.size(2) == W,
                std::invalid_argument, fn, "q.shape", "mismatch",
                "[B, heads, " + std::to_string(W) + "]", detail::shape_str(in.q));
  const Index B = in.q.size(0), H = in.q.size(1);
  ATTNREF_CHECK(
      !out.absent() && out.rank() == 3 && out.size(0) == B && out.size(1) == H && out.size(2) == C,
      std::invalid_argument, fn, "out.shape", "mismatch",
      "[" + std::to_string(B) + ", " + std::to_string(H) + ", " + std::to_string(C) + "]",
      detail::shape_str(out));
  // Views of the caller's memory, any strides: q [B, heads, W] as [B, 1, heads, W]; the cache
  // rows hold k (all W) and v (the first C). A cache whose rows are not contiguous is copied
  // (the engine's decode kernels stream contiguous rows; another path would change the bits).
  detail::DenseArena arena(fn);  // also names mla_decode in the engine's rejections
  StridedView<const T> kc = in.kv_cache;
  if (kc.rank() == 4 && !kc.dense() && kc.stride(3) != 1) arena.input("kv_cache", kc);
  const auto cache = paged_cache(fn, kc, in.block_table, in.context_lens, B, W, C);
  const auto& q = in.q;
  AttentionInputs<T, T> e;
  e.q = StridedView<const T, 4>(q.data(), {B, 1, H, W}, {q.stride(0), 0, q.stride(1), q.stride(2)});
  e.read_kv(cache);
  AttentionParams ep;
  ep.scale = params.scale;
  const AttentionOutputs<T> eo{StridedView<T, 4>(out.data(), {B, 1, H, C},
                                                 {out.stride(0), 0, out.stride(1), out.stride(2)})};
  if (run)
    attention(e, ep, eo, exec);
  else
    validate(e, ep, eo, exec);  // the engine's checks (overlaps included), nothing written
}
}  // namespace detail

/// Every check of mla_decode() (params, tensors, cache, execution config), without computing or
/// writing anything.
template <class T>
void validate(const MlaDecodeParams& params, const MlaDecodeInputs<T>& in,
              const MlaDecodeOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::mla_decode_call(params, in, out, exec, false);
}

/// out [B, heads, C] = the absorbed MLA decode attention (T: half, bfloat16 or float), as
/// validate -> plan -> run.
template <class T>
void mla_decode(const MlaDecodeParams& params, const MlaDecodeInputs<T>& in,
                const MlaDecodeOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::mla_decode_call(params, in, out, exec, true);
}

namespace detail {
/// mla_decode_unabsorbed on dense arguments: the public entry below passes every view through a
/// DenseArena first.
template <class T>
void mla_decode_unabsorbed_dense(const MlaDecodeParams& params, const MlaUnabsorbedInputs<T>& in,
                                 const MlaDecodeOutputs<T>& outs, const ExecConfig& exec) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "mla_decode_unabsorbed: half, bfloat16 or float");
  using namespace detail::mla;
  constexpr const char* fn = "mla_decode_unabsorbed";
  const StridedView<T>& out = outs.out;
  detail::check_views(fn, "q_nope", in.q_nope, "q_rope", in.q_rope, "wuk", in.wuk, "kv_cache",
                      in.kv_cache, "block_table", in.block_table, "out", out);
  const Index C = params.kv_lora_rank, R = params.rope_dim, W = decode_width(fn, params);
  ATTNREF_CHECK(!in.q_nope.absent() && in.q_nope.rank() == 3 && in.q_nope.size(1) > 0 &&
                    in.q_nope.size(2) > 0,
                std::invalid_argument, fn, "q_nope.shape", "not [B, heads, P]", "[B, heads, P]",
                detail::shape_str(in.q_nope));
  const Index B = in.q_nope.size(0), H = in.q_nope.size(1), P = in.q_nope.size(2);
  const std::string bh = "[" + std::to_string(B) + ", " + std::to_string(H) + ", ";
  ATTNREF_CHECK((!in.q_rope.absent() && in.q_rope.shape() == std::vector<Index>{B, H, R}),
                std::invalid_argument, fn, "q_rope.shape", "mismatch", bh + std::to_string(R) + "]",
                detail::shape_str(in.q_rope));
  ATTNREF_CHECK((!in.wuk.absent() && in.wuk.shape() == std::vector<Index>{H, P, C}),
                std::invalid_argument, fn, "wuk.shape", "mismatch",
                "[" + std::to_string(H) + ", " + std::to_string(P) + ", " + std::to_string(C) + "]",
                detail::shape_str(in.wuk));
  ATTNREF_CHECK((!out.absent() && out.shape() == std::vector<Index>{B, H, C}),
                std::invalid_argument, fn, "out.shape", "mismatch", bh + std::to_string(C) + "]",
                detail::shape_str(out));
  const auto cache = paged_cache(fn, in.kv_cache, in.block_table, in.context_lens, B, W, C);
  Index L = 1;
  for (Index l : in.context_lens) L = std::max(L, l);
  // Expanded keys [B, L, H, P + R] and values [B, L, H, C] in fp32.
  const Index KW = P + R;
  std::vector<float> q(static_cast<size_t>(B * H * KW)), k(static_cast<size_t>(B * L * H * KW)),
      v(static_cast<size_t>(B * L * H * C));
  for (Index b = 0; b < B; ++b)
    for (Index h = 0; h < H; ++h) {
      for (Index j = 0; j < P; ++j)
        q[static_cast<size_t>((b * H + h) * KW + j)] =
            static_cast<float>(in.q_nope.data()[(b * H + h) * P + j]);
      for (Index j = 0; j < R; ++j)
        q[static_cast<size_t>((b * H + h) * KW + P + j)] =
            static_cast<float>(in.q_rope.data()[(b * H + h) * R + j]);
    }
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < in.context_lens[static_cast<size_t>(b)]; ++t) {
      const PagedSlot at = cache.locate(b, t);
      const T* row = &cache.k(at.block, at.offset, 0, 0);  // dense: the arena's copy
      for (Index h = 0; h < H; ++h) {
        float* kr = k.data() + ((b * L + t) * H + h) * KW;
        for (Index j = 0; j < P; ++j) {
          double acc = 0.0;
          const T* w = in.wuk.data() + (h * P + j) * C;
          for (Index c = 0; c < C; ++c)
            acc += double(static_cast<float>(w[c])) * double(static_cast<float>(row[c]));
          kr[j] = static_cast<float>(acc);
        }
        for (Index j = 0; j < R; ++j) kr[P + j] = static_cast<float>(row[C + j]);
        float* vr = v.data() + ((b * L + t) * H + h) * C;
        for (Index c = 0; c < C; ++c) vr[c] = static_cast<float>(row[c]);
      }
    }
  AttentionInputs<float, float> e;
  e.q = StridedView<const float, 4>(q.data(), {B, 1, H, KW});
  e.k = StridedView<const float, 4>(k.data(), {B, L, H, KW});
  e.v = StridedView<const float, 4>(v.data(), {B, L, H, C});
  e.seq.kv = in.context_lens;
  AttentionParams ep;
  ep.scale = params.scale;
  std::vector<float> o(static_cast<size_t>(B * H * C));
  attention(e, ep, AttentionOutputs<float>{StridedView<float, 4>(o.data(), {B, 1, H, C})}, exec);
  for (size_t i = 0; i < o.size(); ++i) out.data()[i] = T(o[i]);
}
}  // namespace detail

/// out [B, heads, C] = the same attention with the latent expanded per head (verification).
template <class T>
void mla_decode_unabsorbed(const MlaDecodeParams& params, const MlaUnabsorbedInputs<T>& in,
                           const MlaDecodeOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::check_exec("mla_decode_unabsorbed", exec);
  detail::dense_call("mla_decode_unabsorbed", in, out, true,
                     [&](const auto& din, const auto& dout) {
                       detail::mla_decode_unabsorbed_dense(params, din, dout, exec);
                     });
}

}  // namespace attnref
