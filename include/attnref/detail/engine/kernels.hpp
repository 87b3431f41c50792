#pragma once
/// The engine's hand-vectorised float products as free functions of the element type alone:
/// the small-row kernels (decode: K / V rows streamed token by token across the heads) and the
/// key packing of the panel kernels. They depend on no operator's variant or output type, so a
/// program compiles each once per stored element type (float, fp16, bf16, int8), not once per
/// engine instantiation; they are kept out of line for the same reason.

#include <algorithm>
#include <cstdint>

#include "attnref/core/types.hpp"
#include "attnref/detail/simd.hpp"
#include "attnref/detail/simd_panel.hpp"
#include "attnref/detail/simd_rows.hpp"

#if defined(__GNUC__)
#define ATTNREF_NOINLINE __attribute__((noinline))
#else
#define ATTNREF_NOINLINE
#endif

namespace attnref::detail::kernels {

/// The K or V rows of one kv tile: the cache's own (row[c]: key c's row of kv head 0, head h
/// at + h·head_stride, any paging and layout), or one head's rows dense in a buffer (base +
/// c·ld: the tile dequantized into the workspace; the head argument is then ignored).
template <class X>
struct TileRows {
  const X* const* row = nullptr;
  Index head_stride = 0;
  const X* base = nullptr;
  Index ld = 0;
  const X* operator()(Index h, Index c) const {
    return row != nullptr ? row[c] + h * head_stride : base + c * ld;
  }
};

/// Consecutive kv heads [h0, h1) of a work item in the workspace, `rows` rows each: head h's
/// q rows (n elements, stride n) at q + (h - h0)·rows·n, its scores and mask flags (row stride
/// ld) at s / f + (h - h0)·rows·ld, its output rows (dv elements, stride dv) at o + (h - h0)·
/// rows·dv.
struct HeadBlock {
  Index h0, h1, rows, cols;
  const float* q;
  Index n;
  float* s;
  const std::uint8_t* f;
  Index ld;
  float* o;
  Index dv;
  const float* q_of(Index h) const { return q + (h - h0) * rows * n; }
  float* s_of(Index h) const { return s + (h - h0) * rows * ld; }
  const std::uint8_t* f_of(Index h) const { return f + (h - h0) * rows * ld; }
  float* o_of(Index h) const { return o + (h - h0) * rows * dv; }
};

/// Asks for the cache line at p: kLocality 3 into every cache level (prefetcht0), 2 into the
/// second level and beyond (prefetcht1). On x86 an asm statement: g++ 12 counts a function whose
/// only effects are __builtin_prefetch calls as pure unless it loops, and deleted the calls of
/// a row's requests written out line by line (found while trying that form; the loop below
/// measured the same).
template <int kLocality>
inline void prefetch_line(const char* p) {
  static_assert(kLocality == 2 || kLocality == 3, "prefetcht1 or prefetcht0");
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  if constexpr (kLocality == 3)
    asm volatile("prefetcht0 {(%0)|[%0]}" : : "r"(p));
  else
    asm volatile("prefetcht1 {(%0)|[%0]}" : : "r"(p));
#elif defined(__GNUC__)
  __builtin_prefetch(p, 0, kLocality);
#else
  (void)p;
#endif
}

/// Asks for the cache lines of one row of n elements ahead of its use. Decode streams K and V
/// from memory once, doing little arithmetic per byte; left to the hardware prefetcher, the
/// small-row kernels waited for their rows (head-major V rows first: decode_bnsd/f32/B:8/KV:4096
/// 32–38 → 30–31 ms, AMD Zen 3), so they fetch the rows a few tokens ahead of the ones they
/// compute on. When that came in (2 vCPUs of an AMD EPYC Zen 5, min of 3 interleaved runs,
/// B:8 / KV:4096, one and two threads): decode/f16 14.1 → 10.2 and 7.4 → 5.4 ms,
/// decode_bnsd/f16 13.8 → 9.7 and 7.5 → 5.4 ms, decode_bnsd/f32 22.6 → 20.7 and 12.1 → 11.3 ms.
template <int kLocality = 3, class X>
inline void prefetch_row(const X* row, Index n) {
  const char* c = reinterpret_cast<const char*>(row);
  const Index bytes = n * static_cast<Index>(sizeof(X));
  for (Index off = 0; off < bytes; off += 64) prefetch_line<kLocality>(c + off);
}

/// Whether rows gathered from anywhere (paged blocks, selected tokens) are fetched ahead of
/// their conversion: fp16 / bf16 / int8 rows, whose conversion leaves the load ports idle.
template <class X>
constexpr bool kPrefetchRows = sizeof(X) < sizeof(float);

/// Tokens ahead at which the scores kernel fetches K rows (8 ran head-major fp16 decode from
/// memory 8 % slower; 24 and 32 were no faster, 32 slower on head-major rows; AMD Zen 5).
inline constexpr Index kPrefetchTokens = 16;

/// Rows of another tile (or phase) that a kernel fetches near its end, so that the next
/// kernel's first rows are on the way when it starts: rows(h, c) for c < count, n elements each.
template <class X>
struct NextRows {
  TileRows<X> rows;
  Index count = 0, n = 0;
};

/// Raw scores q·k of every head of the block against keys [0, cols): kTokens keys per step,
/// every head of the step before the next (the heads of a token-major page stay hot). `v`, when
/// given, is the tile's value rows: where one head's rows are adjacent (a head-major cache), they
/// are fetched into the second-level cache beside the keys, so that P·V, whose own fetches run
/// only 16 keys ahead of a single head's products, finds them there (decode_bnsd/f16/B:8/KV:4096
/// 7.4 -> 6.9 ms on one thread, f32 14.3 -> 12.8 ms, AMD Zen 5). On a token-major cache the same
/// slowed decode by 9-18 %: those rows are fetched head by head in small_pv. Each kernel fetches
/// its own rows kPrefetchTokens ahead, so the first rows of the next one would start cold: the
/// last steps here, where no key is left to fetch, ask for the tile's first value rows instead
/// (and small_pv's last block for the next tile's first keys).
template <class X>
ATTNREF_NOINLINE void small_scores(simd::Level level, const HeadBlock& block,
                                   const TileRows<X>& keys, const TileRows<X>& values = {}) {
  simd::with_vector(level, [&](auto vec) {
    using V = decltype(vec);
    simd::with_rows(block.rows, [&](auto R) {
      // Copies of the structs, local to this loop nest: the scores are stored through a vector
      // type that may alias anything, after which g++ reloaded every field it read through a
      // reference, for every step of every head (as locals: int8 scores 159 -> 198 GFLOPS and
      // fp16 137 -> 167, R 4, on rows in the L1 cache, AMD Zen 5).
      const HeadBlock b = block;
      const Index h0 = b.h0, h1 = b.h1, cols = b.cols, n = b.n, ld = b.ld, dv = b.dv;
      const TileRows<X> k = keys, v = values;
      // Tokens per step: R * kTokens accumulators, at most half the vector registers.
      constexpr int kRegs = V::kWidth == 16 ? 32 : 16;
      constexpr int kTokens = R() * 4 <= kRegs / 2 ? 4 : (R() * 2 <= kRegs / 2 ? 2 : 1);
      // The cache's rows are fetched ahead (a dequantized tile in the workspace is not). Float
      // rows of a token-major cache too: an earlier kernel ran 3-10 % slower so, this one runs
      // faster (decode/f32/B:1/KV:4096 1.71 -> 1.19 ms, B:8 16.1 -> 14.4 ms, one thread, Zen 5).
      const bool ahead = k.row != nullptr && cols > kPrefetchTokens + kTokens;
      const bool v_ahead = ahead && v.row != nullptr && v(h0, 1) == v(h0, 0) + dv;
      // Once no key is left to fetch (the steps from end - kPrefetchTokens on), the tile's
      // value rows 0 .. kPrefetchTokens - 1 are fetched instead, kTokens per step.
      const Index end = cols - cols % kTokens;
      Index c = 0;
      for (; c < end; c += kTokens)
        for (Index h = h0; h < h1; ++h) {
          const X* kt[kTokens];
          for (int t = 0; t < kTokens; ++t) kt[t] = k(h, c + t);
          if (ahead && c + kPrefetchTokens + kTokens <= cols) {
            for (int t = 0; t < kTokens; ++t) {
              prefetch_row(k(h, c + kPrefetchTokens + t), n);
              if (v_ahead) prefetch_row<2>(v(h, c + kPrefetchTokens + t), dv);
            }
          } else if (ahead && v.row != nullptr) {
            for (Index w = c + kPrefetchTokens - end; w < c + kPrefetchTokens + kTokens - end; ++w)
              if (w >= 0) prefetch_row(v(h, w), dv);
          }
          simd::dot_rows<V, R(), kTokens>(b.q_of(h), n, kt, n, b.s_of(h) + c, ld);
        }
      for (; c < cols; ++c)
        for (Index h = h0; h < h1; ++h) {
          const X* kt[1] = {k(h, c)};
          simd::dot_rows<V, R(), 1>(b.q_of(h), n, kt, n, b.s_of(h) + c, ld);
        }
    });
  });
}

/// O += P·V for every head of the block over value rows [0, cols). A key masked for a row
/// (flag set, `partial` tiles only) is never read for that row. `next`: the next tile's first key
/// rows, fetched head by head in the last block of keys.
template <class X>
ATTNREF_NOINLINE void small_pv(simd::Level level, const HeadBlock& b, bool partial,
                               const TileRows<X>& v, const NextRows<X>& next = {}) {
  const Index rows = b.rows, ld = b.ld, dv = b.dv;
  auto seen_by = [&](const std::uint8_t* f, Index c) {
    Index n = 0;
    for (Index r = 0; r < rows; ++r) n += f[r * ld + c] == 0 ? 1 : 0;
    return n;
  };
  simd::with_vector(level, [&](auto vec) {
    using V = decltype(vec);
    simd::with_rows(rows, [&](auto R) {
      if (!partial) {  // every row sees every key: blocks of keys, the output in registers
        constexpr Index kKeys = 16;  // the rows of a token-major page stay hot across the heads
        const X* vk[kKeys];
        // The next block's value rows are fetched ahead: one head's rows when they are adjacent
        // (a head-major cache), else every head's row of each token when the heads are adjacent
        // (a token-major cache). Head by head, just before that head's products: asked for all
        // at once (every head's rows of 16 tokens, 32 KiB of fp16), the requests queued behind
        // one another, and token-major decode from memory took 1.3-1.5x as long
        // (decode/f16/B:8/KV:4096 8.5 -> 5.3 ms spread out, ifa/int8/B:8 6.3 -> 4.3 ms, one thread,
        // AMD Zen 5).
        const bool adjacent = v.row != nullptr && b.cols > 1 && v(b.h0, 1) == v(b.h0, 0) + dv;
        const bool heads =
            v.row != nullptr && !adjacent && b.h1 - b.h0 > 1 && v(b.h0 + 1, 0) == v(b.h0, 0) + dv;
        for (Index c = 0; c < b.cols; c += kKeys) {
          const Index n = std::min(kKeys, b.cols - c);
          if (adjacent)
            for (Index k = c + n; k < std::min(b.cols, c + n + kKeys); ++k)
              prefetch_row(v(b.h0, k), dv);
          for (Index h = b.h0; h < b.h1; ++h) {
            if (heads)
              for (Index k = c + n; k < std::min(b.cols, c + n + kKeys); ++k)
                prefetch_row(v(h, k), dv);
            if (c + n == b.cols)
              for (Index k = 0; k < next.count; ++k) prefetch_row(next.rows(h, k), next.n);
            for (Index k = 0; k < n; ++k) vk[k] = v(h, c + k);
            simd::axpy_rows_all<V, R()>(b.s_of(h) + c, ld, vk, n, dv, b.o_of(h), dv);
          }
        }
        return;
      }
      for (Index c = 0; c < b.cols; c += 4) {
        const Index n = std::min<Index>(4, b.cols - c);
        for (Index h = b.h0; h < b.h1; ++h) {
          const float* s = b.s_of(h);
          const std::uint8_t* f = b.f_of(h);
          float* o = b.o_of(h);
          bool all = n == 4;
          for (Index k = 0; all && k < 4; ++k) all = seen_by(f, c + k) == rows;
          if (all) {
            const X* v4[4] = {v(h, c), v(h, c + 1), v(h, c + 2), v(h, c + 3)};
            simd::axpy_rows_all<V, R()>(s + c, ld, v4, 4, dv, o, dv);
            continue;
          }
          for (Index k = c; k < c + n; ++k) {
            const Index seen = seen_by(f, k);
            const X* v1[1] = {v(h, k)};
            if (seen == rows) {
              simd::axpy_rows_all<V, R()>(s + k, ld, v1, 1, dv, o, dv);
            } else if (seen > 0) {
              for (Index r = 0; r < rows; ++r)
                if (f[r * ld + k] == 0)
                  simd::axpy_rows_all<V, 1>(s + r * ld + k, 0, v1, 1, dv, o + r * dv, 0);
            }
          }
        }
      }
    });
  });
}

/// Packs the keys [0, cols) of kv head h (n elements each) into `panel` for the panel score
/// kernel (simd::pack_keys: transposed in blocks of one vector of keys, converted to float).
template <class X>
ATTNREF_NOINLINE void pack_key_panel(simd::Level level, const TileRows<X>& k, Index h, Index cols,
                                     Index n, float* panel) {
  simd::with_vector(level, [&](auto vec) {
    simd::pack_keys<decltype(vec)>([&](Index c) { return k(h, c); }, cols, n, panel);
  });
}

/// S = Q·Kᵀ of `rows` rows of q (stride ldq, n elements) against a packed key panel of `cols`
/// keys (simd::panel_scores), scores at s with row stride lds; `ahead` fetched meanwhile.
ATTNREF_NOINLINE inline void panel_scores(simd::Level level, const float* q, Index ldq, Index rows,
                                          const float* panel, Index cols, Index n, float* s,
                                          Index lds, const simd::LineStream& ahead = {}) {
  simd::with_vector(level, [&](auto vec) {
    simd::panel_scores<decltype(vec)>(q, ldq, rows, panel, cols, n, s, lds, ahead);
  });
}

/// Lanes of the vector level: the most query rows lane_scores takes (0 at the portable level).
inline Index lane_width(simd::Level level) {
  Index w = 0;
  simd::with_vector(level, [&](auto vec) { w = decltype(vec)::kWidth; });
  return w;
}

/// The floats lane_scores needs in `buf` for keys of n elements.
inline Index lane_buffer(Index n) { return 16 * n + 16 * simd::kLaneStride; }

/// S = Q·Kᵀ of `rows` rows of q (stride ldq, n elements, rows <= lane_width) against kv head
/// h's keys [c0, c0 + cols) of the tile (simd::lane_scores: the rows in the vector lanes, the
/// keys converted into buf), scores at s with row stride lds; `ahead` fetched meanwhile.
template <class X>
ATTNREF_NOINLINE void lane_scores(simd::Level level, const float* q, Index ldq, Index rows,
                                  const TileRows<X>& k, Index h, Index c0, Index cols, Index n,
                                  float* buf, float* s, Index lds,
                                  const simd::LineStream& ahead = {}) {
  simd::with_vector(level, [&](auto vec) {
    using V = decltype(vec);
    simd::pack_keys<V>([q, ldq](Index r) { return q + r * ldq; }, rows, n, buf);
    simd::lane_scores<V>(
        buf, rows, [&k, h, c0](Index c) { return k(h, c0 + c); }, cols, n, buf + 16 * n, s, lds,
        ahead);
  });
}

/// o += P·V of `rows` rows of p (stride ldp) and `cols` float value rows (row c at v + c·ldv,
/// n elements), output stride ldo (simd::panel_pv); `ahead` fetched meanwhile.
ATTNREF_NOINLINE inline void panel_pv(simd::Level level, const float* p, Index ldp, Index rows,
                                      const float* v, Index ldv, Index cols, Index n, float* o,
                                      Index ldo, const simd::LineStream& ahead = {}) {
  simd::with_vector(level, [&](auto vec) {
    simd::panel_pv<decltype(vec)>(
        p, ldp, rows, [v, ldv](Index c) { return v + c * ldv; }, cols, n, o, ldo, ahead);
  });
}

/// panel_pv on kv head h's value rows [0, cols) of the cache, converted in registers.
template <class X>
ATTNREF_NOINLINE void panel_pv_rows(simd::Level level, const float* p, Index ldp, Index rows,
                                    const TileRows<X>& v, Index h, Index cols, Index n, float* o,
                                    Index ldo, const simd::LineStream& ahead = {}) {
  simd::with_vector(level, [&](auto vec) {
    simd::panel_pv<decltype(vec)>(
        p, ldp, rows, [&v, h](Index c) { return v(h, c); }, cols, n, o, ldo, ahead);
  });
}

}  // namespace attnref::detail::kernels
