#pragma once
/// The engine's two products per kv tile, S = Q·Kᵀ and O += P·V, each in four modes chosen
/// once per call: the small-row SIMD kernels (decode: K / V rows streamed token by token across
/// the heads), the int8 kernels (int8 q / k / v with quantized P, exact in int32), the panel
/// SIMD kernels (larger row blocks: keys packed once per tile and head), and one Eigen GEMM per
/// head (the portable level, double compute, quantized P).

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attnref/detail/engine/state.hpp"
#include "attnref/detail/gemm_i8.hpp"
#include "attnref/detail/simd.hpp"

namespace attnref::detail {

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
template <class RowOf>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::scores_small(Workspace& ws, const WorkItem& it,
                                                         Index h0, Index h1, Index rows, Index cols,
                                                         const RowOf& row_of) const {
  using X = std::remove_cv_t<std::remove_pointer_t<decltype(row_of(Index{}, Index{}))>>;
  simd::with_vector(level, [&](auto vec) {
    using V = decltype(vec);
    simd::with_rows(rows, [&](auto R) {
      // Tokens per step: R * kTokens accumulators, at most half the vector registers.
      constexpr int kRegs = V::kWidth == 16 ? 32 : 16;
      constexpr int kTokens = R() * 4 <= kRegs / 2 ? 4 : (R() * 2 <= kRegs / 2 ? 2 : 1);
      Index c = 0;
      for (; c + kTokens <= cols; c += kTokens)
        for (Index h = h0; h < h1; ++h) {
          const Head hd = head(ws, it, h);
          const X* k[kTokens];
          for (int t = 0; t < kTokens; ++t) k[t] = row_of(h, c + t);
          simd::dot_rows<V, R(), kTokens>(hd.q, g.head_size, k, g.head_size, hd.s + c, ld());
        }
      for (; c < cols; ++c)
        for (Index h = h0; h < h1; ++h) {
          const Head hd = head(ws, it, h);
          const X* k[1] = {row_of(h, c)};
          simd::dot_rows<V, R(), 1>(hd.q, g.head_size, k, g.head_size, hd.s + c, ld());
        }
    });
  });
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
template <class RowOf>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::pv_small(Workspace& ws, const WorkItem& it, Index h0,
                                                     Index h1, Index rows, Index cols, bool partial,
                                                     const RowOf& row_of) const {
  using X = std::remove_cv_t<std::remove_pointer_t<decltype(row_of(Index{}, Index{}))>>;
  const Index dv = g.v_head_size;
  auto seen_by = [&](const Head& hd, Index c) {
    Index n = 0;
    for (Index r = 0; r < rows; ++r) n += hd.f[r * ld() + c] == 0 ? 1 : 0;
    return n;
  };
  simd::with_vector(level, [&](auto vec) {
    using V = decltype(vec);
    simd::with_rows(rows, [&](auto R) {
      if (!partial) {  // every row sees every key: blocks of keys, the output in registers
        constexpr Index kKeys = 16;  // the rows of a token-major page stay hot across the heads
        const X* vk[kKeys];
        for (Index c = 0; c < cols; c += kKeys) {
          const Index n = std::min(kKeys, cols - c);
          for (Index h = h0; h < h1; ++h) {
            const Head hd = head(ws, it, h);
            for (Index k = 0; k < n; ++k) vk[k] = row_of(h, c + k);
            simd::axpy_rows_all<V, R()>(hd.s + c, ld(), vk, n, dv, hd.o, dv);
          }
        }
        return;
      }
      for (Index c = 0; c < cols; c += 4) {
        const Index n = std::min<Index>(4, cols - c);
        for (Index h = h0; h < h1; ++h) {
          const Head hd = head(ws, it, h);
          bool all = n == 4;
          for (Index k = 0; all && partial && k < 4; ++k) all = seen_by(hd, c + k) == rows;
          if (all) {
            const X* v4[4] = {row_of(h, c), row_of(h, c + 1), row_of(h, c + 2), row_of(h, c + 3)};
            simd::axpy_rows_all<V, R()>(hd.s + c, ld(), v4, 4, dv, hd.o, dv);
            continue;
          }
          for (Index k = c; k < c + n; ++k) {
            const Index seen = partial ? seen_by(hd, k) : rows;
            const X* v1[1] = {row_of(h, k)};
            if (seen == rows) {
              simd::axpy_rows_all<V, R()>(hd.s + k, ld(), v1, 1, dv, hd.o, dv);
            } else if (seen > 0) {
              for (Index r = 0; r < rows; ++r)
                if (hd.f[r * ld() + k] == 0)
                  simd::axpy_rows_all<V, 1>(hd.s + r * ld() + k, 0, v1, 1, dv, hd.o + r * dv, 0);
            }
          }
        }
      }
    });
  });
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::scores_panel(Workspace& ws, const Head& hd, Index rows,
                                                         Index cols) const {
  if constexpr (std::is_same_v<Acc, float>) {
    const Index n = g.head_size, h = hd.kv_head;
    simd::with_vector(level, [&](auto vec) {
      using V = decltype(vec);
      if (dequant()) {  // the head's keys dequantized into ws.k, then packed
        kv_tile(in.k, ws.krow, h, cols, n, ws.k, ws.kdq.data());
        simd::pack_keys<V>([&](Index c) { return ws.k.data() + c * n; }, cols, n, ws.kpanel.data());
      } else {  // packed straight from the cache rows, converted on the way
        const Index hs = h * in.k.stride(2);
        simd::pack_keys<V>([&](Index c) { return ws.krow[static_cast<size_t>(c)] + hs; }, cols, n,
                           ws.kpanel.data());
      }
      simd::panel_scores<V>(hd.q, n, rows, ws.kpanel.data(), cols, n, hd.s, ld());
    });
  }
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::pv_panel(const Head& hd, const ConstRowMap<Acc>& v,
                                                     Index rows, Index cols) const {
  if constexpr (std::is_same_v<Acc, float>) {
    simd::with_vector(level, [&](auto vec) {
      simd::panel_pv<decltype(vec)>(hd.s, ld(), rows, v.data(), v.outerStride(), cols,
                                    g.v_head_size, hd.o, g.v_head_size);
    });
  }
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::raw_scores(Workspace& ws, const WorkItem& it, Index h0,
                                                       Index h1, Index rows, Index cols) const {
  if (small(rows)) {
    if constexpr (std::is_same_v<Acc, float>) {
      if (dequant()) {  // each head's keys dequantized into ws.k, then streamed
        for (Index h = h0; h < h1; ++h) {
          kv_tile(in.k, ws.krow, h, cols, g.head_size, ws.k, ws.kdq.data());
          scores_small(ws, it, h, h + 1, rows, cols,
                       [&](Index, Index c) -> const Acc* { return ws.k.data() + c * g.head_size; });
        }
      } else {
        scores_small(ws, it, h0, h1, rows, cols, [&](Index h, Index c) {
          return ws.krow[static_cast<size_t>(c)] + h * in.k.stride(2);
        });
      }
    }
    return;
  }
  if constexpr (kI8) {
    if (i8()) {  // int8 Q·Kᵀ, exact in int32
      const Index n_pad = i8::round_up(cols, 16);
      for (Index h = h0; h < h1; ++h) {
        const Head hd = head(ws, it, h);
        const Index first = (h - it.head_begin) * rows;  // the head's rows in the item
        i8::pack_cols(ws.krow.data(), h * in.k.stride(2), g.head_size, cols, n_pad, ws.kp.data(),
                      ws.kcorr.data());
        i8::gemm(ws.q8.data() + first * g.head_size, g.head_size, rows, ws.kp.data(), n_pad,
                 g.head_size / 4, ws.kcorr.data(), cols, hd.s, ld());
      }
      return;
    }
  }
  if (panel(rows)) {
    for (Index h = h0; h < h1; ++h) scores_panel(ws, head(ws, it, h), rows, cols);
    return;
  }
  for (Index h = h0; h < h1; ++h) {
    const Head hd = head(ws, it, h);
    ConstRowMap<Acc> Q(hd.q, rows, g.head_size, Eigen::OuterStride<>(g.head_size));
    RowMap<Acc> S(hd.s, rows, cols, Eigen::OuterStride<>(ld()));
    auto K =
        kv_tile(in.k, ws.krow, h, cols, g.head_size, ws.k, dequant() ? ws.kdq.data() : nullptr);
    S.noalias() = Q * K.transpose();
  }
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::accumulate_pv(Workspace& ws, const WorkItem& it,
                                                          Index h0, Index h1, Index rows,
                                                          Index cols, bool partial) const {
  const Index dv = g.v_head_size;
  if (small(rows)) {  // stream V token by token across the heads, four tokens at a time
    if constexpr (std::is_same_v<Acc, float>) {
      if (dequant()) {  // each head's values dequantized into ws.v, then streamed
        for (Index h = h0; h < h1; ++h) {
          kv_tile(in.v, ws.vrow, h, cols, dv, ws.v, ws.vdq.data());
          pv_small(ws, it, h, h + 1, rows, cols, partial,
                   [&](Index, Index c) -> const Acc* { return ws.v.data() + c * dv; });
        }
      } else {
        pv_small(ws, it, h0, h1, rows, cols, partial, [&](Index h, Index c) {
          return ws.vrow[static_cast<size_t>(c)] + h * in.v.stride(2);
        });
      }
    }
    return;
  }
  if constexpr (kI8) {
    if (i8()) {  // int8 P·V, exact in int32, then scaled by the rows' factors
      const Index k4 = (cols + 3) / 4, d_pad = i8::round_up(dv, 16);
      for (Index h = h0; h < h1; ++h) {
        const Head hd = head(ws, it, h);
        i8::pack_rows(ws.vrow.data(), h * in.v.stride(2), cols, dv, d_pad, ws.vp.data(),
                      ws.vcorr.data());
        for (Index r = 0; r < rows; ++r) {
          std::uint8_t* dst = ws.p8.data() + r * k4 * 4;
          i8::to_u8_offset(hd.s + r * ld(), cols, dst);
          std::fill(dst + cols, dst + k4 * 4, std::uint8_t{128});  // meets zero rows of V
        }
        i8::gemm(ws.p8.data(), k4 * 4, rows, ws.vp.data(), d_pad, k4, ws.vcorr.data(), dv,
                 ws.pv.data(), dv);
        RowMap<Acc> O(hd.o, rows, dv, Eigen::OuterStride<>(dv));
        ConstRowMap<Acc> T(ws.pv.data(), rows, dv, Eigen::OuterStride<>(dv));
        for (Index r = 0; r < rows; ++r) O.row(r) += hd.fac[r] * T.row(r);
      }
      return;
    }
  }
  for (Index h = h0; h < h1; ++h) {
    const Head hd = head(ws, it, h);
    ConstRowMap<Acc> P(hd.s, rows, cols, Eigen::OuterStride<>(ld()));
    RowMap<Acc> O(hd.o, rows, dv, Eigen::OuterStride<>(dv));
    // Quantized P: the tile's product alone (exact), then scaled by each row's factor.
    RowMap<Acc> T(kQuantP ? ws.pv.data() : hd.o, rows, dv, Eigen::OuterStride<>(dv));
    const bool pan = panel(rows);
    auto V = kv_tile(in.v, ws.vrow, h, cols, dv, ws.v, dequant() ? ws.vdq.data() : nullptr, pan);
    if (partial && !V.allFinite()) {
      if (kQuantP) T.setZero();
      for (Index r = 0; r < rows; ++r)
        for (Index c = 0; c < cols; ++c)
          if (hd.f[r * ld() + c] == 0) T.row(r) += P(r, c) * V.row(c);
    } else if (pan) {
      pv_panel(hd, V, rows, cols);
    } else if (kQuantP) {
      T.noalias() = P * V;
    } else {
      T.noalias() += P * V;
    }
    if constexpr (kQuantP)
      for (Index r = 0; r < rows; ++r) O.row(r) += hd.fac[r] * T.row(r);
  }
}

}  // namespace attnref::detail
