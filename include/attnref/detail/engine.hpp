#pragma once
/// The one tiled, online-softmax attention loop. Not part of the API: operators call
/// attnref::attention / attnref::attention_with (attention/attention.hpp), which validate first.
///
/// Work decomposition (never depends on the thread count):
///   item = (sequence b, kv head, q tile of `q_tile` positions, kv split)
/// Each item stacks the G = N_q / N_kv query heads of its kv head into one row block
/// (rows = G * q_tile), so every K/V tile is loaded (and converted from fp16/bf16) once per head
/// group. Per kv tile: S = Q·Kᵀ (Eigen GEMM), mask / transform hooks, online-softmax update,
/// O += P·V (Eigen GEMM). Sequences with a single q tile (decode) are split along kv into fixed
/// `kv_split`-key partials that are merged in split order afterwards (split-KV).

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnref/attention/params.hpp"
#include "attnref/attention/variant.hpp"
#include "attnref/core/softmax.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"
#include "attnref/detail/gemm_i8.hpp"
#include "attnref/detail/simd.hpp"
#include "attnref/detail/threading.hpp"

namespace attnref::detail {

template <class Acc>
using RowMatrix = Eigen::Matrix<Acc, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Acc>
using RowMap = Eigen::Map<RowMatrix<Acc>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class Acc>
using ConstRowMap = Eigen::Map<const RowMatrix<Acc>, Eigen::Unaligned, Eigen::OuterStride<>>;
template <class Acc>
using ArrayMap = Eigen::Map<Eigen::Array<Acc, Eigen::Dynamic, 1>>;
template <class T>
using AlignedVector = std::vector<T, Eigen::aligned_allocator<T>>;

/// dst[i] = Acc(src[i * stride]) * mul for i < n (vectorised when stride == 1).
template <class Acc, class T>
inline void load_row(const T* src, Index stride, Index n, Acc* dst, Acc mul) {
  if constexpr (std::is_same_v<Acc, float> &&
                (std::is_same_v<T, half> || std::is_same_v<T, bfloat16> ||
                 std::is_same_v<T, std::int8_t>)) {
    if (stride == 1 && simd::enabled()) {  // same bits as the portable conversion
      simd::to_float(src, n, dst);         // exact, same bits as the portable path
      if (mul != Acc(1)) ArrayMap<Acc>(dst, n) *= mul;
      return;
    }
  }
  if (stride == 1) {
    using Src = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
    if constexpr (std::is_same_v<T, Acc>) {
      if (mul == Acc(1))
        ArrayMap<Acc>(dst, n) = Src(src, n);
      else
        ArrayMap<Acc>(dst, n) = Src(src, n) * mul;
    } else if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      // fp16/bf16 -> float is exact; one more cast for double.
      if (mul == Acc(1))
        ArrayMap<Acc>(dst, n) = Src(src, n).template cast<float>().template cast<Acc>();
      else
        ArrayMap<Acc>(dst, n) = Src(src, n).template cast<float>().template cast<Acc>() * mul;
    } else {
      ArrayMap<Acc>(dst, n) = Src(src, n).template cast<Acc>() * mul;
    }
  } else {
    for (Index i = 0; i < n; ++i) dst[i] = convert<Acc>(src[i * stride]) * mul;
  }
}

template <class TO, class Acc>
inline TO to_output(Acc x) {
  if constexpr (std::is_same_v<TO, half> || std::is_same_v<TO, bfloat16>)
    return TO(static_cast<float>(x));
  else
    return static_cast<TO>(x);
}

/// Stores an Acc row into the output type.
template <class TO, class Acc>
inline void store_row(const Acc* src, Acc mul, Index n, TO* dst, Index stride) {
  if constexpr (std::is_same_v<Acc, float> && std::is_same_v<TO, half>) {
    if (stride == 1) {  // the same bits as the conversion below, vectorised
      simd::to_half(src, mul, n, dst);
      return;
    }
  }
  if (stride == 1) {
    using Dst = Eigen::Map<Eigen::Array<TO, Eigen::Dynamic, 1>>;
    using Src = Eigen::Map<const Eigen::Array<Acc, Eigen::Dynamic, 1>>;
    if constexpr (std::is_same_v<TO, Acc>)
      Dst(dst, n) = Src(src, n) * mul;
    else if constexpr (std::is_same_v<TO, half> || std::is_same_v<TO, bfloat16>)
      Dst(dst, n) = (Src(src, n) * mul).template cast<float>().template cast<TO>();
    else
      Dst(dst, n) = (Src(src, n) * mul).template cast<TO>();
  } else {
    for (Index i = 0; i < n; ++i) dst[i * stride] = to_output<TO>(src[i] * mul);
  }
}

/// A sequence resolved against its views: where its tokens start and how many there are.
struct ResolvedSeq {
  Index q_batch, q_off, q_len;  // view batch index, first token, length
  Index kv_batch, kv_off, kv_len;
};

/// Problem sizes after validation.
struct Geometry {
  Index batch = 0, num_heads = 0, num_kv_heads = 0, group = 1, head_size = 0, v_head_size = 0;
  Index q_tile = 0, kv_tile = 0, kv_split = 0;
  std::vector<ResolvedSeq> seqs;
};

/// Where the keys and values of every sequence live: pages of `page_size` consecutive tokens
/// (token stride, head stride and element stride are those of the engine's k / v views).
/// Contiguous views have one page per sequence; block tables (paged KV caches) and per-sequence
/// cache tensors (ATB kv tensorlist) have one page per block / tensor.
template <class TKV>
struct KvPages {
  std::vector<const TKV*> k, v;  // page starts (token 0, head 0, element 0)
  std::vector<Index> first;      // per sequence: index of its first page in k / v
  Index page_size = 1;           // tokens per page
};

/// One unit of work: kv heads [head_begin, head_end) of one sequence, one q tile, one kv range.
/// Sequences with a single q tile (decode) put all kv heads in one item, so each K/V row of a
/// token-major cache is read head after head from the same pages; others use one head per item.
struct WorkItem {
  Index seq, head_begin, head_end, q_begin, q_end, kv_begin, kv_end;
  Index partial;  // -1: single split, finalise directly; else index of its partial slot
};

/// The resolved problem: views, hooks and geometry.
template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
struct Engine {
  const AttentionInputs<TQ, TKV>& in;
  const AttentionOutputs<TO, TS>& out;
  const Variant& var;
  const Geometry& g;
  const KvPages<TKV>& pages;
  Acc scale;
  Index max_rows;     // stacked rows (group x q positions x kv heads) of the largest item
  simd::Level level;  // hand-vectorised level in use for this call (Portable: none)

  static constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  static constexpr bool kMapK = std::is_same_v<TKV, Acc>;
  /// The variant quantizes P before P·V (quantize_p hook).
  static constexpr bool kQuantP = has_quantize_p<Variant, Acc>::value;
  static constexpr bool kTwoPass = has_round_p<Variant, Acc>::value;
  static_assert(!(kQuantP && kTwoPass), "quantize_p and round_p do not combine");
  /// int8 q / k / v with quantized P: both products can run on the int8 kernels.
  static constexpr bool kI8 = kQuantP && std::is_same_v<Acc, float> &&
                              std::is_same_v<TQ, std::int8_t> && std::is_same_v<TKV, std::int8_t>;
  /// The int8 kernels are in use for this call (compiled in, level Avx512, unit element strides).
  bool i8() const {
    return kI8 && i8::enabled() && in.q.stride(3) == 1 && in.k.stride(3) == 1 &&
           in.v.stride(3) == 1 && g.head_size % 4 == 0;
  }
  /// Row blocks up to this height (decode: one query per head of the group) skip the GEMMs,
  /// whose packing and conversion buffers cost more than the products, and stream K/V rows
  /// through the hand-vectorised kernels instead (when compiled in and enabled).
  static constexpr Index kSmallRows = 8;
  bool small(Index rows) const {
    return !kQuantP && std::is_same_v<Acc, float> && level != simd::Level::Portable &&
           rows <= kSmallRows && in.k.stride(3) == 1 && in.v.stride(3) == 1;
  }
  /// Per-worker scratch, sized once per call (O(tile), independent of sequence lengths).
  /// Aligned to Eigen's packet size: Eigen's vectorised reductions and exp peel unaligned heads
  /// in scalar code, so an address-dependent alignment would make the bits depend on which
  /// worker (and which allocation) ran an item.
  struct Workspace {
    AlignedVector<Acc> q, s, k, v, o;
    std::vector<SoftmaxState<Acc>> st;
    std::vector<std::uint8_t> flags;
    std::vector<const TKV*> krow, vrow;  // the current tile's K / V rows (head 0, element 0)
    AlignedVector<Acc> aux, fac, pv;     // quantize_p: row state, tile factors, P·V of a tile
    // int8 kernels: q + 128, packed K and V tiles with their corrections, P + 128
    std::vector<std::uint8_t> q8, p8;
    std::vector<std::int8_t> kp, vp;
    std::vector<std::int32_t> kcorr, vcorr;
    // round_p variants: the item's hooked scores and mask flags, kept from the first pass
    AlignedVector<Acc> cache_s;
    std::vector<std::uint8_t> cache_f;
  };

  /// One kv head of an item: its rows of Q, O, softmax state, scores and mask flags inside the
  /// workspace (scores and flags: row stride ld()).
  struct Head {
    Index kv_head;
    Acc* q;
    Acc* o;
    SoftmaxState<Acc>* st;
    Acc* s;
    std::uint8_t* f;
    Acc* aux;  // quantize_p row state and tile factors (null without the hook)
    Acc* fac;
  };

  /// Row stride of the score and flag buffers: the tile width rounded up to 16 plus 16, so
  /// consecutive rows never sit a power of two apart (which maps them onto the same cache sets).
  Index ld() const { return (g.kv_tile + 15) / 16 * 16 + 16; }

  Workspace make_workspace() const {
    Workspace ws;
    const Index rows = max_rows;
    ws.q.resize(static_cast<size_t>(rows * g.head_size));
    ws.o.resize(static_cast<size_t>(rows * g.v_head_size));
    ws.st.resize(static_cast<size_t>(rows));
    ws.s.resize(static_cast<size_t>(rows * ld()));
    ws.flags.resize(static_cast<size_t>(rows * ld()));
    ws.k.resize(static_cast<size_t>(g.kv_tile * g.head_size));
    ws.v.resize(static_cast<size_t>(g.kv_tile * g.v_head_size));
    ws.krow.resize(static_cast<size_t>(g.kv_tile));
    ws.vrow.resize(static_cast<size_t>(g.kv_tile));
    if (kQuantP) {
      ws.aux.resize(static_cast<size_t>(rows));
      ws.fac.resize(static_cast<size_t>(rows));
      ws.pv.resize(static_cast<size_t>(rows * g.v_head_size));
    }
    if (i8()) {
      const Index tile16 = i8::round_up(g.kv_tile, 16), tile4 = i8::round_up(g.kv_tile, 4);
      const Index dv16 = i8::round_up(g.v_head_size, 16);
      ws.q8.resize(static_cast<size_t>(rows * g.head_size));
      ws.p8.resize(static_cast<size_t>(rows * tile4));
      ws.kp.resize(static_cast<size_t>(g.head_size * tile16));
      ws.kcorr.resize(static_cast<size_t>(tile16));
      ws.vp.resize(static_cast<size_t>(tile4 * dv16));
      ws.vcorr.resize(static_cast<size_t>(dv16));
    }
    return ws;
  }

  Head head(Workspace& ws, const WorkItem& it, Index hkv) const {
    const Index rows = g.group * (it.q_end - it.q_begin);
    const Index k = (hkv - it.head_begin) * rows;
    return {hkv,
            ws.q.data() + k * g.head_size,
            ws.o.data() + k * g.v_head_size,
            ws.st.data() + k,
            ws.s.data() + k * ld(),
            ws.flags.data() + k * ld(),
            kQuantP ? ws.aux.data() + k : nullptr,
            kQuantP ? ws.fac.data() + k : nullptr};
  }

  /// Resolves the K and V rows of keys [j0, j0 + cols) of sequence `seq` through its pages.
  void tile_rows(Workspace& ws, Index seq, Index j0, Index cols) const {
    Index page = pages.first[static_cast<size_t>(seq)] + j0 / pages.page_size;
    Index off = j0 % pages.page_size;
    for (Index c = 0; c < cols; ++c) {
      ws.krow[static_cast<size_t>(c)] = pages.k[static_cast<size_t>(page)] + off * in.k.stride(1);
      ws.vrow[static_cast<size_t>(c)] = pages.v[static_cast<size_t>(page)] + off * in.v.stride(1);
      if (++off == pages.page_size) {
        off = 0;
        ++page;
      }
    }
  }

  /// K or V rows of the current tile for kv head h as an Acc matrix: a Map into the input when
  /// the storage is Acc with a contiguous head dimension and the rows are evenly spaced (one
  /// page, or adjacent pages), else converted once into `buf`.
  ConstRowMap<Acc> kv_tile(const StridedView<const TKV, 4>& x, const std::vector<const TKV*>& row,
                           Index h, Index cols, Index width, AlignedVector<Acc>& buf) const {
    const Index hs = h * x.stride(2);
    if constexpr (kMapK) {
      bool even = x.stride(3) == 1;
      for (Index c = 1; even && c < cols; ++c)
        even = row[static_cast<size_t>(c)] == row[0] + c * x.stride(1);
      if (even)
        return ConstRowMap<Acc>(row[0] + hs, cols, width, Eigen::OuterStride<>(x.stride(1)));
    }
    for (Index c = 0; c < cols; ++c)
      load_row<Acc>(row[static_cast<size_t>(c)] + hs, x.stride(3), width, buf.data() + c * width,
                    Acc(1));
    return ConstRowMap<Acc>(buf.data(), cols, width, Eigen::OuterStride<>(width));
  }

  /// Raw scores q·k of one tile for heads [h0, h1) of an item. Small row blocks stream the keys
  /// token by token across the heads (contiguous memory in token-major caches) through the
  /// hand-vectorised kernels; larger ones use one Eigen GEMM per head.
  void raw_scores(Workspace& ws, const WorkItem& it, Index h0, Index h1, Index rows,
                  Index cols) const {
    if (small(rows)) {
      if constexpr (std::is_same_v<Acc, float>) {
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
                const TKV* k[kTokens];
                for (int t = 0; t < kTokens; ++t)
                  k[t] = ws.krow[static_cast<size_t>(c + t)] + h * in.k.stride(2);
                simd::dot_rows<V, R(), kTokens>(hd.q, g.head_size, k, g.head_size, hd.s + c, ld());
              }
            for (; c < cols; ++c)
              for (Index h = h0; h < h1; ++h) {
                const Head hd = head(ws, it, h);
                const TKV* k[1] = {ws.krow[static_cast<size_t>(c)] + h * in.k.stride(2)};
                simd::dot_rows<V, R(), 1>(hd.q, g.head_size, k, g.head_size, hd.s + c, ld());
              }
          });
        });
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
    for (Index h = h0; h < h1; ++h) {
      const Head hd = head(ws, it, h);
      ConstRowMap<Acc> Q(hd.q, rows, g.head_size, Eigen::OuterStride<>(g.head_size));
      RowMap<Acc> S(hd.s, rows, cols, Eigen::OuterStride<>(ld()));
      auto K = kv_tile(in.k, ws.krow, h, cols, g.head_size, ws.k);
      S.noalias() = Q * K.transpose();
    }
  }

  /// Mask and transform hooks on one head's raw scores: masked entries become -inf and are
  /// flagged, visible ones go through the transform hook.
  void apply_hooks(const Head& hd, const SeqInfo& si, Index q0, Index nq, Index j0, Index cols,
                   TileMask tm) const {
    const Index rows = g.group * nq;
    const bool partial = tm == TileMask::Partial;
    const bool transform = var.has_transform();
    if (!partial && !transform) {  // every position visible, raw scores used as they are
      for (Index r = 0; r < rows; ++r) flag_overflow(hd, r, hd.s + r * ld(), cols);
      return;
    }
    for (Index r = 0; r < rows; ++r) {
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
        flag_overflow(hd, r, srow + lo, hi - lo);
        if (transform) transform_span(si, c0, srow, lo, hi);
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
      bool done = false;  // transform_row may see masked positions: they are overwritten below
      if constexpr (has_transform_row<Variant, Acc>::value) {
        if (transform) {
          var.template transform_row<Acc>(si, c0, srow, cols);
          done = true;
        }
      }
      for (Index c = 0; c < cols; ++c) {
        if (frow[c])
          srow[c] = kNegInf;
        else if (transform && !done)
          srow[c] = var.template transform<Acc>(
              si, Coord{si.batch, i, j0 + c, c0.q_head, c0.kv_head}, srow[c]);
      }
    }
  }

  /// Marks row r when one of its n visible raw scores is not finite: scale·q·k overflowed the
  /// compute type (or an unmasked input holds inf / NaN), so the row's softmax is undefined and
  /// its result NaN (SoftmaxState::overflow) — whatever the other scores of the row.
  void flag_overflow(const Head& hd, Index r, const Acc* raw, Index n) const {
    // x · 0 is 0 for a finite x and NaN for ±inf / NaN: one vectorised pass, no branch.
    if (n > 0 && !((ArrayMap<Acc>(const_cast<Acc*>(raw), n) * Acc(0)).sum() == Acc(0)))
      hd.st[r].overflow = true;
  }

  /// The transform hook on the visible columns [lo, hi) of one row (c0: its first column).
  void transform_span(const SeqInfo& si, const Coord& c0, Acc* srow, Index lo, Index hi) const {
    if (hi <= lo) return;
    if constexpr (has_transform_row<Variant, Acc>::value) {
      var.template transform_row<Acc>(si, Coord{c0.batch, c0.q, c0.kv + lo, c0.q_head, c0.kv_head},
                                      srow + lo, hi - lo);
    } else {
      for (Index c = lo; c < hi; ++c)
        srow[c] = var.template transform<Acc>(
            si, Coord{c0.batch, c0.q, c0.kv + c, c0.q_head, c0.kv_head}, srow[c]);
    }
  }

  /// Gathers the q rows of one head into its workspace rows (pre-multiplied by the scale).
  void load_q(const Head& hd, const ResolvedSeq& s, Index q0, Index nq) const {
    for (Index gi = 0; gi < g.group; ++gi) {
      const Index h = hd.kv_head * g.group + gi;
      for (Index t = 0; t < nq; ++t) {
        const TQ* src = in.q.ptr(s.q_batch, s.q_off + q0 + t, h, 0);
        load_row<Acc>(src, in.q.stride(3), g.head_size, hd.q + (gi * nq + t) * g.head_size, scale);
      }
    }
  }

  /// True when row r of the tile has a visible position (SoftmaxState::visible: a row that saw
  /// visible keys but ends with l = 0, every visible score -inf after the hooks, is NaN, never
  /// the zero row of a masked one).
  bool tile_has_visible(const Head& hd, Index r, Index cols, bool partial) const {
    if (!partial) return cols > 0;
    const std::uint8_t* frow = hd.f + r * ld();
    return std::find(frow, frow + cols, std::uint8_t{0}) != frow + cols;
  }

  /// Online-softmax update of one head with the scores of one tile; leaves P in hd.s (with the
  /// quantize_p hook: the quantized P, and the tile's factor per row in hd.fac).
  void softmax_update(const Head& hd, const SeqInfo& si, Index rows, Index cols, bool partial,
                      Index q0, Index nq, Index j0) const {
    const Index dv = g.v_head_size;
    for (Index r = 0; r < rows; ++r) {
      Acc* srow = hd.s + r * ld();
      ArrayMap<Acc> row(srow, cols);
      SoftmaxState<Acc>& st = hd.st[r];
      const Acc mx = row.maxCoeff();
      const Acc m_new = std::max(st.m, mx);
      if (m_new == kNegInf) {  // nothing visible to this row yet, or only overflowed scores
        st.visible = st.visible || tile_has_visible(hd, r, cols, partial);
        row.setZero();
        if constexpr (kQuantP) hd.fac[r] = Acc(0);
        continue;
      }
      st.visible = true;  // a finite maximum is a visible score (masked ones are -inf)
      const Acc alpha = exp_diff(st.m, m_new);
      row = (row - m_new).exp();
      if (partial) {
        const std::uint8_t* frow = hd.f + r * ld();
        for (Index c = 0; c < cols; ++c)
          if (frow[c]) srow[c] = Acc(0);
      }
      Acc tile_sum;
      if constexpr (kQuantP) {
        const Coord c0{si.batch, q0 + r % nq, j0, hd.kv_head * g.group + r / nq, hd.kv_head};
        hd.fac[r] = var.template quantize_p<Acc>(c0, srow, cols, hd.aux[r], tile_sum);
      } else {
        tile_sum = row.sum();
      }
      st.l = st.l * alpha + tile_sum;
      st.m = m_new;
      if (alpha != Acc(1)) ArrayMap<Acc>(hd.o + r * dv, dv) *= alpha;
    }
  }

  /// O += P·V for heads [h0, h1) and one tile. A position masked for a row is never read for
  /// that row, so NaN/Inf stored there cannot leak (0 * NaN would).
  void accumulate_pv(Workspace& ws, const WorkItem& it, Index h0, Index h1, Index rows, Index cols,
                     bool partial) const {
    const Index dv = g.v_head_size;
    if (small(rows)) {  // stream V token by token across the heads, four tokens at a time
      if constexpr (std::is_same_v<Acc, float>) {
        auto vrow = [&](Index h, Index c) {
          return ws.vrow[static_cast<size_t>(c)] + h * in.v.stride(2);
        };
        auto seen_by = [&](const Head& hd, Index c) {
          Index n = 0;
          for (Index r = 0; r < rows; ++r) n += hd.f[r * ld() + c] == 0 ? 1 : 0;
          return n;
        };
        simd::with_vector(level, [&](auto vec) {
          using V = decltype(vec);
          simd::with_rows(rows, [&](auto R) {
            for (Index c = 0; c < cols; c += 4) {
              const Index n = std::min<Index>(4, cols - c);
              for (Index h = h0; h < h1; ++h) {
                const Head hd = head(ws, it, h);
                bool all = n == 4;
                for (Index k = 0; all && partial && k < 4; ++k) all = seen_by(hd, c + k) == rows;
                if (all) {
                  const TKV* v4[4] = {vrow(h, c), vrow(h, c + 1), vrow(h, c + 2), vrow(h, c + 3)};
                  simd::axpy_rows<V, R(), 4>(hd.s + c, ld(), v4, dv, hd.o, dv);
                  continue;
                }
                for (Index k = c; k < c + n; ++k) {
                  const Index seen = partial ? seen_by(hd, k) : rows;
                  const TKV* v1[1] = {vrow(h, k)};
                  if (seen == rows) {
                    simd::axpy_rows<V, R(), 1>(hd.s + k, ld(), v1, dv, hd.o, dv);
                  } else if (seen > 0) {
                    for (Index r = 0; r < rows; ++r)
                      if (hd.f[r * ld() + k] == 0)
                        simd::axpy_rows<V, 1, 1>(hd.s + r * ld() + k, 0, v1, dv, hd.o + r * dv, 0);
                  }
                }
              }
            }
          });
        });
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
      auto V = kv_tile(in.v, ws.vrow, h, cols, dv, ws.v);
      if (partial && !V.allFinite()) {
        if (kQuantP) T.setZero();
        for (Index r = 0; r < rows; ++r)
          for (Index c = 0; c < cols; ++c)
            if (hd.f[r * ld() + c] == 0) T.row(r) += P(r, c) * V.row(c);
      } else if (kQuantP) {
        T.noalias() = P * V;
      } else {
        T.noalias() += P * V;
      }
      if constexpr (kQuantP)
        for (Index r = 0; r < rows; ++r) O.row(r) += hd.fac[r] * T.row(r);
    }
  }

  /// Runs one item: online softmax over its kv range, leaving (state, unnormalised O) in ws.
  void run_item(Workspace& ws, const WorkItem& it) const {
    const ResolvedSeq& s = g.seqs[static_cast<size_t>(it.seq)];
    const SeqInfo si{it.seq, s.q_len, s.kv_len};
    const Index nq = it.q_end - it.q_begin;
    const Index rows = g.group * nq;
    const Index all_rows = rows * (it.head_end - it.head_begin);
    std::fill(ws.st.begin(), ws.st.begin() + all_rows, SoftmaxState<Acc>{});
    std::fill(ws.o.begin(), ws.o.begin() + all_rows * g.v_head_size, Acc(0));
    if (kQuantP) std::fill(ws.aux.begin(), ws.aux.begin() + all_rows, Acc(0));
    if (it.kv_end <= it.kv_begin) return;
    for (Index h = it.head_begin; h < it.head_end; ++h) load_q(head(ws, it, h), s, it.q_begin, nq);
    if constexpr (kI8) {
      if (i8()) {  // q + 128 as u8, the item's rows in head order
        std::uint8_t* q8 = ws.q8.data();
        for (Index h = it.head_begin; h < it.head_end; ++h)
          for (Index gi = 0; gi < g.group; ++gi)
            for (Index t = 0; t < nq; ++t, q8 += g.head_size) {
              const TQ* src = in.q.ptr(s.q_batch, s.q_off + it.q_begin + t, h * g.group + gi, 0);
              for (Index e = 0; e < g.head_size; ++e)
                q8[e] = static_cast<std::uint8_t>(static_cast<int>(src[e]) + 128);
            }
      }
    }
    // Small row blocks process all heads of the tile together (token-major streaming); GEMM
    // blocks one head at a time (its scores stay in cache between the two products).
    const Index step = small(rows) ? it.head_end - it.head_begin : 1;
    const Index span = it.kv_end - it.kv_begin;
    if constexpr (kTwoPass) {  // the second pass reads back exactly the tiles scored here
      const size_t n = static_cast<size_t>((it.head_end - it.head_begin) * rows * span);
      if (ws.cache_s.size() < n) ws.cache_s.resize(n), ws.cache_f.resize(n);
    }
    for (Index j0 = it.kv_begin; j0 < it.kv_end; j0 += g.kv_tile) {
      const Index cols = std::min(g.kv_tile, it.kv_end - j0);
      const TileMask tm = var.classify(si, it.q_begin, it.q_end, j0, j0 + cols);
      if (tm == TileMask::All) continue;
      const bool partial = tm == TileMask::Partial;
      tile_rows(ws, it.seq, j0, cols);
      for (Index h0 = it.head_begin; h0 < it.head_end; h0 += step) {
        const Index h1 = h0 + step;
        raw_scores(ws, it, h0, h1, rows, cols);
        for (Index h = h0; h < h1; ++h) {
          const Head hd = head(ws, it, h);
          apply_hooks(hd, si, it.q_begin, nq, j0, cols, tm);
          if constexpr (kTwoPass)
            for (Index r = 0; r < rows; ++r) {
              const size_t at =
                  static_cast<size_t>(((h - it.head_begin) * rows + r) * span + (j0 - it.kv_begin));
              const Acc* srow = hd.s + r * ld();
              std::copy_n(srow, cols, ws.cache_s.begin() + static_cast<std::ptrdiff_t>(at));
              if (partial)  // (masked scores are already -inf; unmasked tiles need no flags)
                std::copy_n(hd.f + r * ld(), cols,
                            ws.cache_f.begin() + static_cast<std::ptrdiff_t>(at));
            }
          softmax_update(hd, si, rows, cols, partial, it.q_begin, nq, j0);
        }
        if constexpr (!kTwoPass) accumulate_pv(ws, it, h0, h1, rows, cols, partial);
      }
    }
    if constexpr (kTwoPass) normalised_pass(ws, it);
  }

  /// The second pass of round_p variants, on the scores kept from the first: P = exp(s - m) / l
  /// per tile, written to the probs output when asked, rounded by the hook, then O += P·V (O
  /// ends normalised).
  void normalised_pass(Workspace& ws, const WorkItem& it) const {
    const ResolvedSeq& s = g.seqs[static_cast<size_t>(it.seq)];
    const SeqInfo si{it.seq, s.q_len, s.kv_len};
    const Index nq = it.q_end - it.q_begin;
    const Index rows = g.group * nq;
    const bool want_probs = !out.probs.absent();
    const Index span = it.kv_end - it.kv_begin;
    if (want_probs)
      for (Index hkv = it.head_begin; hkv < it.head_end; ++hkv)
        for (Index r = 0; r < rows; ++r)
          for (Index j = 0; j < s.kv_len; ++j)
            out.probs(s.q_batch, hkv * g.group + r / nq, s.q_off + it.q_begin + r % nq, j) = TS(0);
    const Index step = small(rows) ? it.head_end - it.head_begin : 1;
    for (Index j0 = it.kv_begin; j0 < it.kv_end; j0 += g.kv_tile) {
      const Index cols = std::min(g.kv_tile, it.kv_end - j0);
      const TileMask tm = var.classify(si, it.q_begin, it.q_end, j0, j0 + cols);
      if (tm == TileMask::All) continue;
      const bool partial = tm == TileMask::Partial;
      tile_rows(ws, it.seq, j0, cols);
      for (Index h0 = it.head_begin; h0 < it.head_end; h0 += step) {
        const Index h1 = h0 + step;
        for (Index h = h0; h < h1; ++h) {
          const Head hd = head(ws, it, h);
          for (Index r = 0; r < rows; ++r) {
            const size_t at =
                static_cast<size_t>(((h - it.head_begin) * rows + r) * span + (j0 - it.kv_begin));
            std::copy_n(ws.cache_s.begin() + static_cast<std::ptrdiff_t>(at), cols,
                        hd.s + r * ld());
            if (partial)
              std::copy_n(ws.cache_f.begin() + static_cast<std::ptrdiff_t>(at), cols,
                          hd.f + r * ld());
          }
          for (Index r = 0; r < rows; ++r) {
            Acc* srow = hd.s + r * ld();
            const SoftmaxState<Acc>& st = hd.st[r];
            const std::uint8_t* frow = hd.f + r * ld();
            const Acc inv = st.inv_l();
            const Index qh = h * g.group + r / nq, qi = it.q_begin + r % nq;
            ArrayMap<Acc> row(srow, cols);
            if (st.l == Acc(0) && !st.undefined()) {
              row.setZero();
            } else {
              row = (row - st.m).exp() * inv;
              if (partial)
                for (Index c = 0; c < cols; ++c)
                  if (frow[c]) srow[c] = Acc(0);
            }
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
    }
  }

  /// Writes the normalised output rows (and LSE) of a finished item; st / o hold its rows.
  void finalize(const WorkItem& it, const SoftmaxState<Acc>* st, const Acc* o) const {
    const ResolvedSeq& s = g.seqs[static_cast<size_t>(it.seq)];
    const Index nq = it.q_end - it.q_begin;
    Index r = 0;
    for (Index hkv = it.head_begin; hkv < it.head_end; ++hkv)
      for (Index gi = 0; gi < g.group; ++gi) {
        const Index h = hkv * g.group + gi;
        for (Index t = 0; t < nq; ++t, ++r) {
          const Index i = it.q_begin + t;
          // (two-pass rows leave normalised; an undefined row still gets its NaN)
          const Acc mul = kTwoPass && !st[r].undefined() ? Acc(1) : st[r].inv_l();
          store_row<TO>(o + r * g.v_head_size, mul, g.v_head_size,
                        out.o.ptr(s.q_batch, s.q_off + i, h, 0), out.o.stride(3));
          if (!out.lse.absent()) out.lse(s.q_batch, h, s.q_off + i) = static_cast<TS>(st[r].lse());
        }
      }
  }

  /// Debug pass after run_item: recomputes the scores and writes P = exp(s - m) / l.
  void write_probs(Workspace& ws, const WorkItem& it) const {
    const ResolvedSeq& s = g.seqs[static_cast<size_t>(it.seq)];
    const SeqInfo si{it.seq, s.q_len, s.kv_len};
    const Index nq = it.q_end - it.q_begin;
    const Index rows = g.group * nq;
    for (Index hkv = it.head_begin; hkv < it.head_end; ++hkv) {
      const Head hd = head(ws, it, hkv);
      for (Index r = 0; r < rows; ++r) {
        const Index h = hkv * g.group + r / nq;
        const Index i = it.q_begin + r % nq;
        for (Index j = 0; j < s.kv_len; ++j) out.probs(s.q_batch, h, s.q_off + i, j) = TS(0);
      }
      for (Index j0 = it.kv_begin; j0 < it.kv_end; j0 += g.kv_tile) {
        const Index cols = std::min(g.kv_tile, it.kv_end - j0);
        const TileMask tm = var.classify(si, it.q_begin, it.q_end, j0, j0 + cols);
        if (tm == TileMask::All) continue;
        tile_rows(ws, it.seq, j0, cols);
        raw_scores(ws, it, hkv, hkv + 1, rows, cols);
        apply_hooks(hd, si, it.q_begin, nq, j0, cols, tm);
        for (Index r = 0; r < rows; ++r) {
          const SoftmaxState<Acc>& st = hd.st[r];
          if (st.l == Acc(0) && !st.undefined()) continue;
          const Index h = hkv * g.group + r / nq;
          const Index i = it.q_begin + r % nq;
          const Acc* srow = hd.s + r * ld();
          const std::uint8_t* frow = hd.f + r * ld();
          const Acc inv = st.inv_l();
          for (Index c = 0; c < cols; ++c) {
            if (tm == TileMask::Partial && frow[c]) continue;
            out.probs(s.q_batch, h, s.q_off + i, j0 + c) =
                static_cast<TS>(std::exp(srow[c] - st.m) * inv);
          }
        }
      }
    }
  }
};

/// Most split-KV partials of one sequence.
inline constexpr Index kMaxSplits = 32;

/// Builds the item list: sequences in order, then kv heads, q tiles and kv splits.
/// max_rows: stacked rows of the largest item; split_rows: of the largest split item (the size
/// of one partial slot). Both follow the items, not the tile capacity, so that short sequences
/// (decode) get small buffers.
inline std::vector<WorkItem> make_items(const Geometry& g, Index& num_partials, bool allow_split,
                                        Index& max_rows, Index& split_rows) {
  std::vector<WorkItem> items;
  num_partials = 0;
  max_rows = 1;
  split_rows = 0;
  for (Index b = 0; b < static_cast<Index>(g.seqs.size()); ++b) {
    const ResolvedSeq& s = g.seqs[static_cast<size_t>(b)];
    if (s.q_len == 0) continue;
    const Index n_qt = (s.q_len + g.q_tile - 1) / g.q_tile;
    const Index heads = n_qt == 1 ? g.num_kv_heads : 1;
    const bool split = allow_split && g.kv_split > 0 && n_qt == 1 && s.kv_len > g.kv_split;
    for (Index h = 0; h < g.num_kv_heads; h += heads) {
      for (Index q0 = 0; q0 < s.q_len; q0 += g.q_tile) {
        const Index q1 = std::min(s.q_len, q0 + g.q_tile);
        const Index rows = g.group * (q1 - q0) * heads;
        max_rows = std::max(max_rows, rows);
        if (split) split_rows = std::max(split_rows, rows);
        if (!split) {
          items.push_back({b, h, h + heads, q0, q1, 0, s.kv_len, -1});
          continue;
        }
        // At most kMaxSplits partials per sequence, so the partial buffers do not grow with
        // the kv length; the split length depends on the problem only.
        const Index n_split = std::min(kMaxSplits, (s.kv_len + g.kv_split - 1) / g.kv_split);
        const Index len = (s.kv_len + n_split - 1) / n_split;
        for (Index k0 = 0; k0 < s.kv_len; k0 += len)
          items.push_back(
              {b, h, h + heads, q0, q1, k0, std::min(s.kv_len, k0 + len), num_partials++});
      }
    }
  }
  return items;
}

/// Runs the engine on validated inputs.
template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void run_attention(const AttentionInputs<TQ, TKV>& in, const AttentionParams& p,
                   const AttentionOutputs<TO, TS>& out, const Variant& var, const Geometry& g,
                   const KvPages<TKV>& pages) {
  using E = Engine<Acc, TQ, TKV, TO, TS, Variant>;
  const int threads = resolve_threads(p.num_threads);
  const bool want_probs = !out.probs.absent();
  Index num_partials = 0, max_rows = 1, split_rows = 0;
  std::vector<WorkItem> items =
      make_items(g, num_partials, /*allow_split=*/!want_probs && !E::kQuantP && !E::kTwoPass,
                 max_rows, split_rows);
  const E eng{in, out, var, g, pages, static_cast<Acc>(p.scale), max_rows, simd::level()};

  // Restrict every item to the keys its queries may see (e.g. causal), split items keep their
  // own range clipped to it.
  for (WorkItem& it : items) {
    const ResolvedSeq& s = g.seqs[static_cast<size_t>(it.seq)];
    const KvRange r = var.kv_range(SeqInfo{it.seq, s.q_len, s.kv_len}, it.q_begin, it.q_end);
    it.kv_begin = std::max(it.kv_begin, std::max<Index>(r.begin, 0));
    if (E::kQuantP) it.kv_begin -= it.kv_begin % g.kv_tile;  // the operator's block grid
    it.kv_end = std::min(it.kv_end, std::min(r.end, s.kv_len));
  }

  const Index rows = split_rows;  // rows of one partial slot
  const Index dv = g.v_head_size;
  // Partials of split items: unnormalised O rows then (m, l) per row.
  std::vector<Acc> part_o(static_cast<size_t>(num_partials * rows * dv));
  std::vector<SoftmaxState<Acc>> part_st(static_cast<size_t>(num_partials * rows));

  parallel_for(
      threads, static_cast<Index>(items.size()), [&] { return eng.make_workspace(); },
      [&](typename E::Workspace& ws, Index idx) {
        const WorkItem& it = items[static_cast<size_t>(idx)];
        eng.run_item(ws, it);
        if (it.partial < 0) {
          eng.finalize(it, ws.st.data(), ws.o.data());
          if (want_probs && !E::kTwoPass) eng.write_probs(ws, it);
        } else {
          const Index n = g.group * (it.q_end - it.q_begin) * (it.head_end - it.head_begin);
          std::copy(ws.o.begin(), ws.o.begin() + n * dv, part_o.begin() + it.partial * rows * dv);
          std::copy(ws.st.begin(), ws.st.begin() + n, part_st.begin() + it.partial * rows);
        }
      });
  if (num_partials == 0) return;

  // Merge split partials in split order (fixed, so the bits never depend on threads).
  std::vector<Index> first;  // index in `items` of the first split of each split group
  for (Index i = 0; i < static_cast<Index>(items.size()); ++i) {
    const WorkItem& it = items[static_cast<size_t>(i)];
    if (it.partial >= 0 && (i == 0 || items[static_cast<size_t>(i - 1)].partial < 0 ||
                            items[static_cast<size_t>(i - 1)].head_begin != it.head_begin ||
                            items[static_cast<size_t>(i - 1)].seq != it.seq ||
                            items[static_cast<size_t>(i - 1)].q_begin != it.q_begin))
      first.push_back(i);
  }
  struct MergeState {
    std::vector<Acc> o;
    std::vector<SoftmaxState<Acc>> st;
  };
  parallel_for(
      threads, static_cast<Index>(first.size()),
      [&] {
        return MergeState{std::vector<Acc>(static_cast<size_t>(rows * dv)),
                          std::vector<SoftmaxState<Acc>>(static_cast<size_t>(rows))};
      },
      [&](MergeState& ms, Index fi) {
        const Index i0 = first[static_cast<size_t>(fi)];
        const WorkItem& head = items[static_cast<size_t>(i0)];
        const Index n = g.group * (head.q_end - head.q_begin) * (head.head_end - head.head_begin);
        std::vector<Acc>& acc = ms.o;
        std::vector<SoftmaxState<Acc>>& st = ms.st;
        std::fill(acc.begin(), acc.end(), Acc(0));
        std::fill(st.begin(), st.end(), SoftmaxState<Acc>{});
        for (Index i = i0; i < static_cast<Index>(items.size()); ++i) {
          const WorkItem& it = items[static_cast<size_t>(i)];
          if (it.partial < 0 || it.seq != head.seq || it.head_begin != head.head_begin ||
              it.q_begin != head.q_begin)
            break;
          for (Index r = 0; r < n; ++r)
            merge_partial(st[static_cast<size_t>(r)], acc.data() + r * dv,
                          part_st[static_cast<size_t>(it.partial * rows + r)],
                          part_o.data() + (it.partial * rows + r) * dv, dv);
        }
        eng.finalize(head, st.data(), acc.data());
      });
}

}  // namespace attnref::detail
