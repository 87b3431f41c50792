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

#include "attnref/detail/engine/kernels.hpp"
#include "attnref/detail/engine/state.hpp"
#include "attnref/detail/gemm_i8.hpp"
#include "attnref/detail/simd.hpp"
#include "attnref/detail/simd_rows.hpp"

namespace attnref::detail {

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::pack_panel(Workspace& ws, const Head& hd, Index cols,
                                                       Index rows) const {
  if constexpr (std::is_same_v<Acc, float>) {
    const Index n = g.head_size, h = hd.kv_head;
    if (gathered()) key_tile(ws, h, cols);  // the head's keys gathered (dequantized, split)
    if (lanes(rows)) return;                // lane_scores converts the rows itself
    if (gathered())
      kernels::pack_key_panel(level, dense_rows(ws.k, n), h, cols, n, ws.kpanel.data());
    else  // packed straight from the cache rows, converted on the way
      kernels::pack_key_panel(level, cache_rows(ws.krow, in.k), h, cols, n, ws.kpanel.data());
  }
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::tile_scores(Workspace& ws, const Head& hd, Index rows,
                                                        Index r0, Index r1, Index c0, Index c1,
                                                        const simd::LineStream& ahead) const {
  if constexpr (std::is_same_v<Acc, float>) {
    const Index n = g.head_size, h = hd.kv_head;
    const float* q = hd.q + r0 * n;
    float* s = hd.s + r0 * ld() + c0;
    if (!lanes(rows))
      kernels::panel_scores(level, q, n, r1 - r0, ws.kpanel.data() + c0 * n, c1 - c0, n, s, ld(),
                            ahead);
    else if (gathered())
      kernels::lane_scores(level, q, n, r1 - r0, dense_rows(ws.k, n), h, c0, c1 - c0, n,
                           ws.kpanel.data(), s, ld(), ahead);
    else
      kernels::lane_scores(level, q, n, r1 - r0, cache_rows(ws.krow, in.k), h, c0, c1 - c0, n,
                           ws.kpanel.data(), s, ld(), ahead);
  }
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::masked_pv(const Head& hd, const ConstRowMap<Acc>& V,
                                                      Acc* t, Index r0, Index r1,
                                                      Index cols) const {
  const Index dv = g.v_head_size;
  ConstRowMap<Acc> P(hd.s, r1, cols, Eigen::OuterStride<>(ld()));
  RowMap<Acc> T(t, r1, dv, Eigen::OuterStride<>(dv));
  for (Index r = r0; r < r1; ++r)
    for (Index c = 0; c < cols; ++c)
      if (hd.f[r * ld() + c] == 0) T.row(r) += P(r, c) * V.row(c);
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::panel_tile(Workspace& ws, const WorkItem& it,
                                                       const SeqInfo& si, Index h, Index j0,
                                                       Index cols, TileMask tm) const {
  if constexpr (std::is_same_v<Acc, float>) {
    const Head hd = head(ws, it, h);
    const Index dv = g.v_head_size, nq = it.q_end - it.q_begin;
    const Index rows = g.group * nq;
    const bool partial = tm == TileMask::Partial;
    pack_panel(ws, hd, cols, rows);
    // Value rows adjacent in memory (mapped, or converted / dequantized into ws.v).
    const auto V = kv_tile(in.v, ws.vrow, h, cols, dv, ws.v, vmaps(ws, h), /*dense=*/true);
    // A masked position is never read for its row: with a non-finite value in the tile, a
    // partial tile takes the row-by-row product, which skips masked keys (0 · NaN is NaN).
    const bool guarded = partial && !all_finite(V);
    for (Index r0 = 0; r0 < rows; r0 += kPanelRows) {
      const Index r1 = std::min(rows, r0 + kPanelRows);
      // Both products run on the block's visible columns [c0, c1) only (16-key aligned): the
      // hooks set the scores outside to -inf, whose P is exactly 0.
      Index c0 = 0, c1 = cols;
      if (partial) visible_columns(hd, si, it.q_begin, nq, j0, cols, r0, r1, c0, c1);
      if (c1 > c0)
        tile_scores(ws, hd, rows, r0, r1, c0, c1,
                    r0 == 0 ? next_lines(ws, true, h) : simd::LineStream{});
      apply_hooks(hd, si, it.q_begin, nq, j0, cols, tm, r0, r1);
      softmax_update(hd, si, r0, r1, cols, partial, it.q_begin, nq, j0);
      if (!guarded) {
        if (c1 > c0)
          kernels::panel_pv(level, hd.s + r0 * ld() + c0, ld(), r1 - r0,
                            V.data() + c0 * V.outerStride(), V.outerStride(), c1 - c0, dv,
                            hd.o + r0 * dv, dv,
                            r0 == 0 ? next_lines(ws, false, h) : simd::LineStream{});
        continue;
      }
      masked_pv(hd, V, hd.o, r0, r1, cols);
    }
  }
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::raw_scores(Workspace& ws, const WorkItem& it, Index h0,
                                                       Index h1, Index rows, Index cols) const {
  if (small(rows)) {
    if constexpr (std::is_same_v<Acc, float>) {
      if (gathered()) {  // each head's keys gathered (dequantized, split) into ws.k, streamed
        for (Index h = h0; h < h1; ++h) {
          key_tile(ws, h, cols);
          kernels::small_scores(level, block(ws, it, h, h + 1, rows, cols),
                                dense_rows(ws.k, g.head_size));
        }
      } else {
        kernels::small_scores(level, block(ws, it, h0, h1, rows, cols), cache_rows(ws.krow, in.k),
                              cache_rows(ws.vrow, in.v));
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
  if (panel(rows)) {  // (the round_p variants: panel_tile runs the others)
    if constexpr (std::is_same_v<Acc, float>)
      for (Index h = h0; h < h1; ++h) {
        const Head hd = head(ws, it, h);
        pack_panel(ws, hd, cols, rows);
        tile_scores(ws, hd, rows, 0, rows, 0, cols, next_lines(ws, true, h));
      }
    return;
  }
  for (Index h = h0; h < h1; ++h) {
    const Head hd = head(ws, it, h);
    ConstRowMap<Acc> Q(hd.q, rows, g.head_size, Eigen::OuterStride<>(g.head_size));
    RowMap<Acc> S(hd.s, rows, cols, Eigen::OuterStride<>(ld()));
    auto K = key_tile(ws, h, cols);
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
          kv_tile(in.v, ws.vrow, h, cols, dv, ws.v, vmaps(ws, h));
          kernels::small_pv(level, block(ws, it, h, h + 1, rows, cols), partial,
                            dense_rows(ws.v, dv));
        }
      } else {
        kernels::small_pv(level, block(ws, it, h0, h1, rows, cols), partial,
                          cache_rows(ws.vrow, in.v),
                          {cache_rows(ws.kfirst, in.k), ws.first_cols, g.head_size});
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
    const bool pan = panel(rows);
    // fp16 / bf16 / int8 value rows of a short row block (at most kPanelRows: each row is read
    // by a few register blocks) straight from the cache, converted in registers, rather than
    // converted into ws.v first (nsa/compress_attention, 16 rows per kv head: 7-11 % faster).
    // Taller blocks read each row many times and ran up to 6 % slower so (dsa/sparse_attention,
    // 128 rows; AMD Zen 5). A partial tile keeps the copy, whose values it checks.
    if constexpr (std::is_same_v<Acc, float> && !std::is_same_v<TKV, float>) {
      if (pan && rows <= kPanelRows && !partial && !dequant() && in.v.stride(3) == 1) {
        kernels::panel_pv_rows(level, hd.s, ld(), rows, cache_rows(ws.vrow, in.v), h, cols, dv,
                               hd.o, dv, next_lines(ws, false, h));
        continue;
      }
    }
    ConstRowMap<Acc> P(hd.s, rows, cols, Eigen::OuterStride<>(ld()));
    RowMap<Acc> O(hd.o, rows, dv, Eigen::OuterStride<>(dv));
    // Quantized P: the tile's product alone (exact), then scaled by each row's factor.
    RowMap<Acc> T(kQuantP ? ws.pv.data() : hd.o, rows, dv, Eigen::OuterStride<>(dv));
    auto V = kv_tile(in.v, ws.vrow, h, cols, dv, ws.v, vmaps(ws, h), pan);
    if (partial && !all_finite(V)) {
      if (kQuantP) T.setZero();
      masked_pv(hd, V, T.data(), 0, rows, cols);
    } else if (pan) {
      if constexpr (std::is_same_v<Acc, float>)
        kernels::panel_pv(level, hd.s, ld(), rows, V.data(), V.outerStride(), cols, dv, hd.o, dv,
                          next_lines(ws, false, h));
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
