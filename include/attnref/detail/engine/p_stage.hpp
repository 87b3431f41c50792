#pragma once
/// The engine's P stage: the variant's mask and transform hooks on the raw scores (masked
/// entries -inf and flagged, overflowed rows marked), the online-softmax update (with the
/// quantize_p hook: P quantized block by block), and the second pass of round_p variants
/// (P = exp(s - m) / l, rounded by the hook, then P·V).

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attnref/detail/engine/products.hpp"
#include "attnref/detail/engine/state.hpp"
#include "attnref/detail/simd_exp.hpp"

namespace attnref::detail {

/// The largest of x[0..n) (n >= 1): the level's vector kernel for float, Eigen otherwise.
template <class Acc>
Acc max_of(simd::Level level, const Acc* x, Index n) {
  Acc m{};
  if constexpr (std::is_same_v<Acc, float>)
    if (simd::with_vector(level, [&](auto vec) { m = simd::row_max<decltype(vec)>(x, n); }))
      return m;
  return ArrayMap<Acc>(const_cast<Acc*>(x), n).maxCoeff();
}

/// x[i] <- exp(x[i] - m), i < n (m >= every x[i], finite), exactly 0 where masked[i] != 0
/// (masked: null when nothing is); returns the sum. The level's vector kernel for float (whose
/// exp of a masked -inf is 0 already), Eigen otherwise (whose exp of -inf is a tiny positive
/// number: the masked entries are cleared after it).
template <class Acc>
Acc exp_shift_sum(simd::Level level, Acc* x, Index n, Acc m, const std::uint8_t* masked) {
  Acc sum{};
  if constexpr (std::is_same_v<Acc, float>)
    if (simd::with_vector(level,
                          [&](auto vec) { sum = simd::exp_shift_sum<decltype(vec)>(x, n, m); }))
      return sum;
  ArrayMap<Acc> row(x, n);
  row = (row - m).exp();
  if (masked != nullptr)
    for (Index c = 0; c < n; ++c)
      if (masked[c]) x[c] = Acc(0);
  return row.sum();
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::apply_hooks(const Head& hd, const SeqInfo& si, Index q0,
                                                        Index nq, Index j0, Index cols, TileMask tm,
                                                        Index r0, Index r1) const {
  const bool partial = tm == TileMask::Partial;
  // (a q_transform row constant is added to the visible scores just before transform())
  const bool transform = var.has_transform() || hd.qb != nullptr;
  // (int8 q·k, summed exactly: always finite, no overflow to flag)
  const bool exact_int = kI8 && i8();
  if (!partial && !transform) {  // every position visible, raw scores used as they are
    if (!exact_int)
      for (Index r = r0; r < r1; ++r) flag_overflow(hd, r, hd.s + r * ld(), cols);
    return;
  }
  for (Index r = r0; r < r1; ++r) {
    const Index gi = r / nq;
    const Index i = q0 + r % nq;
    Acc* srow = hd.s + r * ld();
    std::uint8_t* frow = hd.f + r * ld();
    const Coord c0{si.batch, i, j0, hd.kv_head * g.group + gi, hd.kv_head};
    // Rows whose visible keys form one interval [lo, hi) of the tile (or the whole tile) are
    // masked by range; other rows ask the predicate per position.
    Index lo = 0, hi = cols;
    bool interval = !partial;
    if constexpr (has_row_interval<Variant>::value) {
      KvRange vr{0, 0};
      if (partial && var.row_interval(si, c0, vr)) {
        interval = true;
        lo = std::clamp<Index>(vr.begin - j0, 0, cols);
        hi = std::clamp<Index>(vr.end - j0, lo, cols);
      }
    }
    if (interval) {
      std::fill(frow, frow + lo, std::uint8_t{1});
      std::fill(frow + lo, frow + hi, std::uint8_t{0});
      std::fill(frow + hi, frow + cols, std::uint8_t{1});
      if (!exact_int) flag_overflow(hd, r, srow + lo, hi - lo);
      if (transform) transform_span(si, c0, srow, lo, hi, hd.qb ? hd.qb + r : nullptr);
      std::fill(srow, srow + lo, kNegInf);
      std::fill(srow + hi, srow + cols, kNegInf);
      continue;
    }
    bool bad = false;  // a visible raw score that is not finite
    for (Index c = 0; c < cols; ++c) {
      frow[c] = var.masked(si, Coord{si.batch, i, j0 + c, c0.q_head, c0.kv_head}) ? 1 : 0;
      bad = bad || (frow[c] == 0 && !std::isfinite(srow[c]));
    }
    if (bad) hd.st[r].overflow = true;
    if (hd.qb != nullptr) ArrayMap<Acc>(srow, cols) += hd.qb[r];  // masked ones: overwritten
    bool done = !var.has_transform();
    if constexpr (has_transform_row<Variant, Acc>::value) {
      if (!done) {  // transform_row may see masked positions: they are overwritten below
        var.template transform_row<Acc>(si, c0, srow, cols);
        done = true;
      }
    }
    for (Index c = 0; c < cols; ++c) {
      if (frow[c])
        srow[c] = kNegInf;
      else if (!done)
        srow[c] = var.template transform<Acc>(si, Coord{si.batch, i, j0 + c, c0.q_head, c0.kv_head},
                                              srow[c]);
    }
  }
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::visible_columns(const Head& hd, const SeqInfo& si,
                                                            Index q0, Index nq, Index j0,
                                                            Index cols, Index r0, Index r1,
                                                            Index& c0, Index& c1) const {
  c0 = 0;
  c1 = cols;
  if constexpr (has_row_interval<Variant>::value) {
    Index lo = cols, hi = 0;  // the union of the rows' intervals in the tile
    for (Index r = r0; r < r1; ++r) {
      const Index gi = r / nq;
      KvRange vr{0, 0};
      if (!var.row_interval(
              si, Coord{si.batch, q0 + r % nq, j0, hd.kv_head * g.group + gi, hd.kv_head}, vr))
        return;  // a row without an interval: every column
      const Index b = std::clamp<Index>(vr.begin - j0, 0, cols);
      const Index e = std::clamp<Index>(vr.end - j0, b, cols);
      if (e > b) lo = std::min(lo, b), hi = std::max(hi, e);
    }
    if (hi <= lo) {  // nothing visible to the block
      c0 = c1 = 0;
      return;
    }
    c0 = lo / 16 * 16;
    c1 = std::min(cols, (hi + 15) / 16 * 16);
  } else {
    (void)hd, (void)si, (void)q0, (void)nq, (void)j0, (void)r0, (void)r1;
  }
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::flag_overflow(const Head& hd, Index r, const Acc* raw,
                                                          Index n) const {
  // x · 0 is 0 for a finite x and NaN for ±inf / NaN: one vectorised pass, no branch.
  if (n > 0 && !((ArrayMap<Acc>(const_cast<Acc*>(raw), n) * Acc(0)).sum() == Acc(0)))
    hd.st[r].overflow = true;
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::transform_span(const SeqInfo& si, const Coord& c0,
                                                           Acc* srow, Index lo, Index hi,
                                                           const Acc* bias) const {
  if (hi <= lo) return;
  if (bias != nullptr) ArrayMap<Acc>(srow + lo, hi - lo) += *bias;
  if (!var.has_transform()) return;
  if constexpr (has_transform_row<Variant, Acc>::value) {
    var.template transform_row<Acc>(si, Coord{c0.batch, c0.q, c0.kv + lo, c0.q_head, c0.kv_head},
                                    srow + lo, hi - lo);
  } else {
    for (Index c = lo; c < hi; ++c)
      srow[c] = var.template transform<Acc>(
          si, Coord{c0.batch, c0.q, c0.kv + c, c0.q_head, c0.kv_head}, srow[c]);
  }
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
bool Engine<Acc, TQ, TKV, TO, TS, Variant>::tile_has_visible(const Head& hd, Index r, Index cols,
                                                             bool partial) const {
  if (!partial) return cols > 0;
  const std::uint8_t* frow = hd.f + r * ld();
  return std::find(frow, frow + cols, std::uint8_t{0}) != frow + cols;
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::softmax_update(const Head& hd, const SeqInfo& si,
                                                           Index r0, Index r1, Index cols,
                                                           bool partial, Index q0, Index nq,
                                                           Index j0) const {
  const Index dv = g.v_head_size;
  for (Index r = r0; r < r1; ++r) {
    Acc* srow = hd.s + r * ld();
    ArrayMap<Acc> row(srow, cols);
    SoftmaxState<Acc>& st = hd.st[r];
    const Acc mx = max_of(level, srow, cols);
    const Acc m_new = std::max(st.m, mx);
    if (m_new == kNegInf) {  // nothing visible to this row yet, or only overflowed scores
      st.visible = st.visible || tile_has_visible(hd, r, cols, partial);
      row.setZero();
      if constexpr (kQuantP) hd.fac[r] = Acc(0);
      continue;
    }
    st.visible = true;  // a finite maximum is a visible score (masked ones are -inf)
    const Acc alpha = exp_diff(st.m, m_new);
    // (masked entries are -inf: their exp is exactly 0, in the sum too). Quantized-P variants
    // keep Eigen's exp at every level: P is rounded and quantized next, and their output bits
    // do not depend on the level.
    Acc tile_sum = exp_shift_sum(kQuantP ? simd::Level::Portable : level, srow, cols, m_new,
                                 partial ? hd.f + r * ld() : nullptr);
    if constexpr (kQuantP) {
      const Coord c0{si.batch, q0 + r % nq, j0, hd.kv_head * g.group + r / nq, hd.kv_head};
      hd.fac[r] = var.template quantize_p<Acc>(c0, srow, cols, hd.aux[r], tile_sum);
    }
    st.l = st.l * alpha + tile_sum;
    st.m = m_new;
    if (alpha != Acc(1)) ArrayMap<Acc>(hd.o + r * dv, dv) *= alpha;
  }
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::normalised_pass(Workspace& ws,
                                                            const WorkItem& it) const {
  const ResolvedSeq& s = g.seqs[static_cast<size_t>(it.seq)];
  const SeqInfo si{it.seq, s.q_len, s.kv_len};
  const Index nq = it.q_end - it.q_begin;
  const Index rows = g.group * nq;
  const bool want_probs = !out.probs.absent();
  const Index span = it.kv_end - it.kv_begin;
  // The probs of keys no tile below writes (outside the item's range, fully masked tiles) are 0;
  // so are those of the fully masked tiles in the kept rows handed to item_probs.
  Index written = 0;  // keys [0, written) of every row are done
  const auto zero_to = [&](Index j1) {
    const Index lo = std::max(written, it.kv_begin), hi = std::min(j1, it.kv_end);
    for (Index hkv = it.head_begin; hkv < it.head_end && j1 > written; ++hkv)
      for (Index r = 0; r < rows; ++r) {
        if (want_probs) {
          TS* dst = out.probs.ptr(s.q_batch, hkv * g.group + r / nq, s.q_off + it.q_begin + r % nq,
                                  written);
          for (Index j = 0; j < j1 - written; ++j) dst[j * out.probs.stride(3)] = TS(0);
        }
        if (kItemProbs && hi > lo)
          std::fill_n(
              ws.cache_s.data() + ((hkv - it.head_begin) * rows + r) * span + (lo - it.kv_begin),
              hi - lo, Acc(0));
      }
    written = std::max(written, j1);
  };
  const Index step = small(rows) ? it.head_end - it.head_begin : 1;
  for_each_tile(ws, it, si, false, [&](Index j0, Index cols, TileMask tm) {
    zero_to(j0);
    written = j0 + cols;  // (every row's probs of the tile are written below)
    const bool partial = tm == TileMask::Partial;
    for (Index h0 = it.head_begin; h0 < it.head_end; h0 += step) {
      const Index h1 = h0 + step;
      for (Index h = h0; h < h1; ++h) {
        const Head hd = head(ws, it, h);
        for (Index r = 0; r < rows; ++r) {
          // The first pass's scores of this row and tile, turned into P on their way to hd.s.
          const size_t at =
              static_cast<size_t>(((h - it.head_begin) * rows + r) * span + (j0 - it.kv_begin));
          Acc* kept = ws.cache_s.data() + at;
          if (partial)
            std::copy_n(ws.cache_f.begin() + static_cast<std::ptrdiff_t>(at), cols,
                        hd.f + r * ld());
          Acc* srow = hd.s + r * ld();
          const SoftmaxState<Acc>& st = hd.st[r];
          const std::uint8_t* frow = hd.f + r * ld();
          const Acc inv = st.inv_l();
          const Index qh = h * g.group + r / nq, qi = it.q_begin + r % nq;
          ArrayMap<Acc> row(srow, cols);
          if (st.l == Acc(0) && !st.undefined()) {
            row.setZero();
          } else {
            // (the first pass's exponential: P sums to l's normalisation at the vector levels)
            bool vec = false;
            if constexpr (std::is_same_v<Acc, float>)
              vec = simd::with_vector(level, [&](auto v) {
                simd::exp_shift_scale<decltype(v)>(kept, cols, st.m, inv, srow);
              });
            if (!vec) row = (ArrayMap<Acc>(kept, cols) - st.m).exp() * inv;
            if (partial)
              for (Index c = 0; c < cols; ++c)
                if (frow[c]) srow[c] = Acc(0);
          }
          if constexpr (kItemProbs) std::copy_n(srow, cols, kept);  // (P for item_probs)
          if (want_probs) {
            TS* dst = out.probs.ptr(s.q_batch, qh, s.q_off + qi, j0);
            if (std::is_same_v<TS, Acc> && out.probs.stride(3) == 1)
              std::copy_n(srow, cols, dst);
            else
              for (Index c = 0; c < cols; ++c)
                dst[c * out.probs.stride(3)] = static_cast<TS>(srow[c]);
          }
          var.template round_p<Acc>(Coord{si.batch, qi, j0, qh, h}, srow, cols);
        }
      }
      accumulate_pv(ws, it, h0, h1, rows, cols, partial);
    }
  });
  zero_to(s.kv_len);
  if constexpr (kItemProbs)
    var.template item_probs<Acc>(
        si, ItemProbs<Acc>{it.head_begin, it.head_end, g.group, it.q_begin, it.q_end, it.kv_begin,
                           it.kv_end, ws.cache_s.data()});
}

}  // namespace attnref::detail
