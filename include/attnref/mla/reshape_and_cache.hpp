#pragma once
/// The cache write of ATB's MlaPreprocess (docs/semantics.md §5 step 7): each token's latent key
/// row k_nope [C] and rope part k_rope [R] go to slot s = slot_mapping[t] (block s / blockSize,
/// row s % blockSize; s < 0: the token is skipped; a slot written twice keeps the later token):
///   KvCache:     cache [blocks, bs, 1, C + R] = concat(k_nope, k_rope)
///   KRopeCtkv:   ctkv [blocks, bs, 1, C] = k_nope, krope [blocks, bs, 1, R] = k_rope
///   Int8NzCache: ctkv_i8 NZ [blocks, C / 32, bs, 32] = sat8(rne(fp16(k_nope · T(1 / scale3))))
///                (through fp16 for bf16 models too, as the golden does), krope NZ
///                [blocks, R / 16, bs, 16]
///   NzCache:     ctkv NZ [blocks, C / 16, bs, 16], krope NZ [blocks, R / 16, bs, 16]
/// NZ: element j of the row of (block, row) at [block][j / C0][row][j % C0] (§6).

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/nz.hpp"
#include "attnref/core/types.hpp"
#include "attnref/mla/params.hpp"
#include "attnref/mla/rmsnorm_quant.hpp"

namespace attnref {

/// The caches of one cache mode (the others absent).
template <class T>
struct MlaCaches {
  StridedView<T> kv_cache{};           ///< KvCache: [blocks, bs, 1, C + R]
  StridedView<T> ctkv{};               ///< KRopeCtkv: [blocks, bs, 1, C]; NzCache: NZ
  StridedView<std::int8_t> ctkv_i8{};  ///< Int8NzCache: NZ [blocks, C / 32, bs, 32]
  StridedView<T> krope{};              ///< KRopeCtkv: [blocks, bs, 1, R]; NZ modes: NZ

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("kv_cache", kv_cache), f("ctkv", ctkv), f("ctkv_i8", ctkv_i8), f("krope", krope);
  }
};

namespace detail::mla {

/// Block count and block size of the caches of `mode` for widths C, R; checks every shape.
template <class T>
std::pair<Index, Index> check_caches(const char* fn, MlaCacheMode mode, const MlaCaches<T>& c,
                                     Index C, Index R) {
  const int m = static_cast<int>(mode);
  ATTNREF_CHECK(m >= 0 && m <= 3, std::invalid_argument, fn, "cache_mode", "out of range", "0 to 3",
                std::to_string(m));
  auto shape4 = [](Index a, Index b, Index x, Index d) {
    return "[" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(x) + ", " +
           std::to_string(d) + "]";
  };
  auto nd = [&](const auto& t, const char* arg, Index width, Index blocks, Index bs) {
    ATTNREF_CHECK(!t.absent() && t.rank() == 4 && (blocks < 0 || t.size(0) == blocks) &&
                      (bs < 0 || t.size(1) == bs) && t.size(2) == 1 && t.size(3) == width &&
                      t.size(1) > 0,
                  std::invalid_argument, fn, std::string(arg) + ".shape", "mismatch",
                  shape4(blocks, bs, 1, width) + " (-1: any)", shape_str(t));
  };
  auto nz = [&](const auto& t, const char* arg, Index width, Index c0, Index blocks, Index bs) {
    ATTNREF_CHECK(width % c0 == 0, std::invalid_argument, fn, std::string(arg),
                  "width not a multiple of C0", "a multiple of " + std::to_string(c0),
                  std::to_string(width));
    ATTNREF_CHECK(!t.absent() && t.rank() == 4 && (blocks < 0 || t.size(0) == blocks) &&
                      t.size(1) == width / c0 && (bs < 0 || t.size(2) == bs) && t.size(3) == c0 &&
                      t.size(2) > 0 && t.size(2) % 16 == 0,
                  std::invalid_argument, fn, std::string(arg) + ".shape",
                  "mismatch (NZ; block size a multiple of 16)",
                  shape4(blocks, width / c0, bs, c0) + " (-1: any)", shape_str(t));
  };
  auto none = [&](bool absent, const char* arg) {
    ATTNREF_CHECK(absent, std::invalid_argument, fn, arg, "given for another cache mode", "none",
                  "a tensor");
  };
  switch (mode) {
    case MlaCacheMode::KvCache:
      nd(c.kv_cache, "kv_cache", C + R, -1, -1);
      none(c.ctkv.absent() && c.ctkv_i8.absent() && c.krope.absent(), "ctkv / krope");
      return {c.kv_cache.size(0), c.kv_cache.size(1)};
    case MlaCacheMode::KRopeCtkv:
      nd(c.ctkv, "ctkv", C, -1, -1);
      nd(c.krope, "krope", R, c.ctkv.size(0), c.ctkv.size(1));
      none(c.kv_cache.absent() && c.ctkv_i8.absent(), "kv_cache / ctkv_i8");
      return {c.ctkv.size(0), c.ctkv.size(1)};
    case MlaCacheMode::Int8NzCache:
      nz(c.ctkv_i8, "ctkv_i8", C, 32, -1, -1);
      nz(c.krope, "krope", R, 16, c.ctkv_i8.size(0), c.ctkv_i8.size(2));
      none(c.kv_cache.absent() && c.ctkv.absent(), "kv_cache / ctkv");
      return {c.ctkv_i8.size(0), c.ctkv_i8.size(2)};
    default:
      nz(c.ctkv, "ctkv", C, 16, -1, -1);
      nz(c.krope, "krope", R, 16, c.ctkv.size(0), c.ctkv.size(2));
      none(c.kv_cache.absent() && c.ctkv_i8.absent(), "kv_cache / ctkv_i8");
      return {c.ctkv.size(0), c.ctkv.size(2)};
  }
}

template <class T>
void check_slots(const char* fn, const StridedView<const std::int32_t>& slots, Index N,
                 Index capacity) {
  check_vector(fn, "slot_mapping", slots, N);
  for (Index t = 0; t < N; ++t)
    ATTNREF_CHECK(slots.data()[t] < capacity, std::out_of_range, fn,
                  "slot_mapping[" + std::to_string(t) + "]", "out of range",
                  "< blocks * blockSize = " + std::to_string(capacity),
                  std::to_string(slots.data()[t]));
}

/// Index of element j of the row of (block, row) in an NZ cache of width `width`.
inline Index nz_at(Index block, Index row, Index j, Index width, Index bs, Index c0) {
  return ((block * (width / c0) + j / c0) * bs + row) * c0 + j % c0;
}

/// Writes the rows; shapes and slots already checked.
template <class T>
void write_caches(MlaCacheMode mode, const T* k_nope, const T* k_rope, const std::int32_t* slots,
                  Index N, Index C, Index R, Index bs, float inv3, const MlaCaches<T>& c) {
  for (Index t = 0; t < N; ++t) {
    const std::int32_t s = slots[t];
    if (s < 0) continue;
    const Index block = s / bs, row = s % bs;
    const T* kn = k_nope + t * C;
    const T* kr = k_rope + t * R;
    switch (mode) {
      case MlaCacheMode::KvCache: {
        T* dst = c.kv_cache.data() + (block * bs + row) * (C + R);
        std::copy(kn, kn + C, dst);
        std::copy(kr, kr + R, dst + C);
        break;
      }
      case MlaCacheMode::KRopeCtkv:
        std::copy(kn, kn + C, c.ctkv.data() + (block * bs + row) * C);
        std::copy(kr, kr + R, c.krope.data() + (block * bs + row) * R);
        break;
      case MlaCacheMode::Int8NzCache:
        for (Index j = 0; j < C; ++j)
          c.ctkv_i8.data()[nz_at(block, row, j, C, bs, 32)] =
              sat8_rne(static_cast<float>(half(fmul(static_cast<float>(kn[j]), inv3))));
        for (Index j = 0; j < R; ++j) c.krope.data()[nz_at(block, row, j, R, bs, 16)] = kr[j];
        break;
      case MlaCacheMode::NzCache:
        for (Index j = 0; j < C; ++j) c.ctkv.data()[nz_at(block, row, j, C, bs, 16)] = kn[j];
        for (Index j = 0; j < R; ++j) c.krope.data()[nz_at(block, row, j, R, bs, 16)] = kr[j];
        break;
    }
  }
}

}  // namespace detail::mla

namespace detail {
/// mla_reshape_and_cache on dense arguments: the public entry below passes every view through a
/// DenseArena first.
template <class T>
void mla_reshape_and_cache_dense(MlaCacheMode mode, const StridedView<const T>& k_nope,
                                 const StridedView<const T>& k_rope,
                                 const StridedView<const std::int32_t>& slot_mapping,
                                 const StridedView<const T>& quant_scale3,
                                 const MlaCaches<T>& caches) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16>,
                "mla_reshape_and_cache: half or bfloat16");
  using namespace detail::mla;
  constexpr const char* fn = "mla_reshape_and_cache";
  detail::check_views(fn, "k_nope", k_nope, "k_rope", k_rope, "slot_mapping", slot_mapping,
                      "quant_scale3", quant_scale3, "kv_cache", caches.kv_cache, "ctkv",
                      caches.ctkv, "ctkv_i8", caches.ctkv_i8, "krope", caches.krope);
  ATTNREF_CHECK(!k_nope.absent() && k_nope.rank() == 2, std::invalid_argument, fn, "k_nope.shape",
                "not 2-D", "[N, C]", detail::shape_str(k_nope));
  const Index N = k_nope.size(0), C = k_nope.size(1);
  ATTNREF_CHECK(!k_rope.absent() && k_rope.rank() == 2 && k_rope.size(0) == N,
                std::invalid_argument, fn, "k_rope.shape", "mismatch",
                "[" + std::to_string(N) + ", R]", detail::shape_str(k_rope));
  const Index R = k_rope.size(1);
  const auto [blocks, bs] = check_caches(fn, mode, caches, C, R);
  float inv3 = 0.0f;
  if (mode == MlaCacheMode::Int8NzCache) {
    check_vector(fn, "quant_scale3", quant_scale3, 1);
    const float qs = static_cast<float>(quant_scale3.data()[0]);
    ATTNREF_CHECK(qs != 0.0f && std::isfinite(qs), std::invalid_argument, fn, "quant_scale3",
                  "not usable", "finite and nonzero", std::to_string(qs));
    inv3 = static_cast<float>(T(1.0 / double(qs)));
  } else {
    ATTNREF_CHECK(quant_scale3.absent(), std::invalid_argument, fn, "quant_scale3",
                  "given outside Int8NzCache", "none", detail::shape_str(quant_scale3));
  }
  check_slots<T>(fn, slot_mapping, N, blocks * bs);
  write_caches(mode, k_nope.data(), k_rope.data(), slot_mapping.data(), N, C, R, bs, inv3, caches);
}
}  // namespace detail

/// Writes k_nope [N, C] and k_rope [N, R] (T) to the caches of `mode` at slot_mapping [N]
/// (int32; negative: skipped; >= blocks · blockSize: std::out_of_range). quant_scale3 ([1], T):
/// Int8NzCache only. Checks everything before writing.
template <class T>
void mla_reshape_and_cache(MlaCacheMode mode, const StridedView<const T>& k_nope,
                           const StridedView<const T>& k_rope,
                           const StridedView<const std::int32_t>& slot_mapping,
                           const StridedView<const T>& quant_scale3, const MlaCaches<T>& caches) {
  detail::DenseArena arena("mla_reshape_and_cache");
  StridedView<const T> dn = k_nope, dr = k_rope, ds = quant_scale3;
  StridedView<const std::int32_t> dm = slot_mapping;
  MlaCaches<T> dout = caches;
  arena.input("k_nope", dn);
  arena.input("k_rope", dr);
  arena.input("slot_mapping", dm);
  arena.input("quant_scale3", ds);
  dout.for_each_view([&](const std::string& name, auto& v) { arena.output(name, v); });
  detail::mla_reshape_and_cache_dense(mode, dn, dr, dm, ds, dout);
  arena.commit();
}

}  // namespace attnref
