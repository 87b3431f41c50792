#pragma once
/// The engine's state for one call: the resolved problem (views, variant, geometry, pages), the
/// mode switches chosen once from the types and the variant (small-row SIMD, int8 kernels,
/// quantized P, two-pass rounded P), and the per-worker scratch. Its member functions are
/// defined by concern in products.hpp, p_stage.hpp and driver.hpp.

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "attnref/attention/params.hpp"
#include "attnref/attention/variant.hpp"
#include "attnref/core/softmax.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"
#include "attnref/detail/engine/kernels.hpp"
#include "attnref/detail/engine/rows.hpp"
#include "attnref/detail/engine/work.hpp"
#include "attnref/detail/gemm_i8.hpp"
#include "attnref/detail/simd.hpp"
#include "attnref/detail/simd_panel.hpp"
#include "attnref/detail/simd_rows.hpp"

namespace attnref::detail {

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
  /// The variant takes each finished item's probabilities (item_probs hook, two-pass only).
  static constexpr bool kItemProbs = has_item_probs<Variant, Acc>::value;
  static_assert(!kItemProbs || kTwoPass, "item_probs needs round_p (the two-pass mode)");
  /// int8 q / k / v with quantized P: both products can run on the int8 kernels.
  static constexpr bool kI8 = kQuantP && std::is_same_v<Acc, float> &&
                              std::is_same_v<TQ, std::int8_t> && std::is_same_v<TKV, std::int8_t>;
  /// The int8 kernels are in use for this call (compiled in, level Avx512, unit element strides;
  /// never with the kv_dequant hook, whose keys and values are no longer the stored int8).
  bool i8() const {
    return kI8 && i8::enabled() && in.q.stride(3) == 1 && in.k.stride(3) == 1 &&
           in.v.stride(3) == 1 && g.head_size % 4 == 0 && !dequant() && !q_transformed() &&
           !split();
  }
  /// Split scores (q_rope / k_rope): the key rows of a tile are gathered as [k | k_rope].
  bool split() const { return g.rope_size > 0; }
  /// The variant transforms the query rows as they are loaded (q_transform hook), and may add a
  /// per-row constant to the scores.
  static constexpr bool kQTransform = has_q_transform<Variant, Acc>::value;
  bool q_transformed() const {
    if constexpr (kQTransform)
      return var.has_q_transform();
    else
      return false;
  }
  /// The variant transforms the output rows before they are stored (o_transform hook), or
  /// quantizes them to int8 (quantize_o, required for an int8 output).
  static constexpr bool kOTransform = has_o_transform<Variant, Acc>::value;
  static constexpr bool kQuantO = std::is_same_v<TO, std::int8_t>;
  static_assert(!kQuantO || has_quantize_o<Variant, Acc>::value,
                "an int8 output needs the variant's quantize_o hook");
  bool o_transformed() const {
    if constexpr (kOTransform)
      return var.has_o_transform();
    else
      return false;
  }
  /// The variant adds a per-head sink logit to each row's softmax denominator (sink hook).
  static constexpr bool kSink = has_sink<Variant>::value;
  bool sunk() const {
    if constexpr (kSink)
      return var.has_sink();
    else
      return false;
  }
  /// The variant dequantizes keys and values per token as they are loaded (kv_dequant hook).
  static constexpr bool kKvDequant = has_kv_dequant<Variant>::value;
  bool dequant() const {
    if constexpr (kKvDequant)
      return var.has_kv_dequant();
    else
      return false;
  }
  /// The key rows of a tile are gathered into ws.k (key_tile) rather than read in place: the
  /// kv_dequant hook's per-token maps, or split scores' two sources.
  bool gathered() const { return dequant() || split(); }
  /// Row blocks up to kSmallRows (work.hpp; decode: one query per head of the group) skip the
  /// GEMMs, whose packing and conversion buffers cost more than the products, and stream K/V
  /// rows through the hand-vectorised kernels instead (when compiled in and enabled).
  bool small(Index rows) const {
    return !kQuantP && std::is_same_v<Acc, float> && level != simd::Level::Portable &&
           rows <= kSmallRows && in.k.stride(3) == 1 && in.v.stride(3) == 1;
  }
  /// Larger row blocks (prefill) on a hand-vectorised level use the register-blocked panel
  /// kernels (simd_panel.hpp) instead of Eigen's GEMM: the keys of a tile packed once per head
  /// and reused by every row block, no per-product packing of the other operand.
  bool panel(Index rows) const {
    return !kQuantP && std::is_same_v<Acc, float> && level != simd::Level::Portable &&
           rows > kSmallRows && in.k.stride(3) == 1 && in.v.stride(3) == 1 && !i8();
  }
  /// Panel items of at most one vector of rows per head (a decode step of a large query group:
  /// NSA's compressed branch, 16 rows) score with their rows in the vector lanes
  /// (simd::lane_scores, the same bits), the keys converted but never packed.
  bool lanes(Index rows) const {
    return panel(rows) && rows <= kernels::lane_width(level) && g.head_size <= simd::kLaneMaxN;
  }
  /// Items of one panel row block (rows <= kPanelRows: a decode step of a large query group,
  /// NSA's compressed branch) work on a tile only briefly for the bytes they read, and waited on
  /// each tile's rows from memory as the conversion first read them. Their panel kernels fetch
  /// the next tile into the second-level cache while they work on the current one
  /// (simd::LineStream): its keys during the scores, its values during P·V
  /// (nsa/compress_attention/B:20/cmpKV:4096 47.2 -> 36.2 ms on one thread, 27.3 -> 21.5 ms on
  /// two, AMD Zen 5). Taller items (prefill, MLA decode) read each tile long enough for the
  /// hardware prefetchers, and ran 1-3 % slower with the stream. Not for keys gathered into the
  /// workspace (kv_dequant, split scores).
  bool ahead(Index rows) const { return panel(rows) && rows <= kPanelRows && !gathered(); }
  /// Per-worker scratch, sized once per call (O(tile), independent of sequence lengths).
  /// Aligned to Eigen's packet size: Eigen's vectorised reductions and exp peel unaligned heads
  /// in scalar code, so an address-dependent alignment would make the bits depend on which
  /// worker (and which allocation) ran an item.
  struct Workspace {
    AlignedVector<Acc> q, s, k, v, o;
    AlignedVector<Acc> qb;  // q_transform: the score constant of each row
    std::vector<SoftmaxState<Acc>> st;
    std::vector<std::uint8_t> flags;
    std::vector<const TKV*> krow, vrow;     // the current tile's K / V rows (head 0, element 0)
    std::vector<const TKV*> kr_row;         // split scores: the tile's k_rope rows
    std::vector<const char*> knext, vnext;  // ahead(): the next tile's K / V rows (head 0)
    Index next_cols = 0;                    // keys of the next tile (0: none, or not ahead())
    bool next_values = false;               // the next tile: the item's first, values only
    std::vector<const TKV*> kfirst;         // small rows: the next tile's first keys (head 0)
    Index first_cols = 0;                   // how many (0: none, or rows gathered)
    std::vector<KvAffine> kdq, vdq;         // kv_dequant: the tile's maps, [head - dq_head0][token]
    Index dq_head0 = 0;                     // kv_dequant: the first kv head of the current item
    AlignedVector<Acc> aux, fac, pv;        // quantize_p: row state, tile factors, P·V of a tile
    AlignedVector<Acc> kpanel;              // panel kernels: packed keys (lanes: q, key rows)
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
    Acc* qb;  // q_transform: each row's score constant (null without the hook)
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
    if (q_transformed()) ws.qb.resize(static_cast<size_t>(rows));
    ws.s.resize(static_cast<size_t>(rows * ld()));
    ws.flags.resize(static_cast<size_t>(rows * ld()));
    ws.k.resize(static_cast<size_t>(g.kv_tile * g.head_size));
    ws.v.resize(static_cast<size_t>(g.kv_tile * g.v_head_size));
    ws.krow.resize(static_cast<size_t>(g.kv_tile));
    ws.vrow.resize(static_cast<size_t>(g.kv_tile));
    if (split()) ws.kr_row.resize(static_cast<size_t>(g.kv_tile));
    ws.kfirst.resize(static_cast<size_t>(kernels::kPrefetchTokens));
    if (panel(rows) && !gathered()) {  // (an item's rows per head may be fewer: ahead())
      ws.knext.resize(static_cast<size_t>(g.kv_tile));
      ws.vnext.resize(static_cast<size_t>(g.kv_tile));
    }
    if (dequant()) {  // (an item's heads: all kv heads at most)
      ws.kdq.resize(static_cast<size_t>(g.kv_tile * g.num_kv_heads));
      ws.vdq.resize(static_cast<size_t>(g.kv_tile * g.num_kv_heads));
    }
    if (panel(rows)) {
      ws.kpanel.resize(static_cast<size_t>(
          std::max((g.kv_tile + 15) / 16 * 16 * g.head_size, kernels::lane_buffer(g.head_size))));
    }
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
            kQuantP ? ws.fac.data() + k : nullptr,
            ws.qb.empty() ? nullptr : ws.qb.data() + k};
  }

  /// Resolves the K and V rows of keys [j0, j0 + cols) of item `it`'s sequence through its
  /// pages (and, with the kv_dequant hook, the maps of every head of the item), and those of the
  /// next tile, or with `wrap` after the last tile the item's first (ws.next_values): the first
  /// pass of the two-pass mode then fetches the values the second starts with
  /// (nsa/compress_attention/B:20: 0.98 and 0.97 of the time on one thread, 0.95 and 0.96 on
  /// two, medians of two A/B runs, AMD Zen 5).
  void tile_rows(Workspace& ws, const WorkItem& it, Index j0, Index cols, bool wrap) const {
    const Index seq = it.seq;
    if constexpr (kKvDequant) {
      if (dequant()) {
        const ResolvedSeq& s = g.seqs[static_cast<size_t>(seq)];
        ws.dq_head0 = it.head_begin;
        for (Index h = it.head_begin; h < it.head_end; ++h)
          for (Index c = 0; c < cols; ++c) {
            const size_t at = static_cast<size_t>((h - it.head_begin) * g.kv_tile + c);
            var.kv_dequant(SeqInfo{seq, s.q_len, s.kv_len}, j0 + c, h, ws.kdq[at], ws.vdq[at]);
          }
      }
    }
    const Index ks = in.k.stride(1), vs = in.v.stride(1);
    walk_pages(seq, j0, cols, [&](Index c, Index n, size_t page, Index off) {
      fill_rows(ws.krow.data() + c, pages.k[page] + off * ks, ks, n);
      fill_rows(ws.vrow.data() + c, pages.v[page] + off * vs, vs, n);
      if (split()) {
        const Index rs = in.k_rope.stride(1);
        fill_rows(ws.kr_row.data() + c, pages.kr[page] + off * rs, rs, n);
      }
    });
    const Index rows = g.group * (it.q_end - it.q_begin), j1 = j0 + g.kv_tile;  // (next tile)
    ws.first_cols = 0;
    if (small(rows) && !gathered()) {  // fetched by small_pv's last block (kernels::NextRows)
      ws.first_cols = std::max<Index>(0, std::min(kernels::kPrefetchTokens, it.kv_end - j1));
      walk_pages(seq, j1, ws.first_cols, [&](Index c, Index n, size_t page, Index off) {
        fill_rows(ws.kfirst.data() + c, pages.k[page] + off * ks, ks, n);
      });
    }
    ws.next_cols = 0;
    if (!ahead(rows)) return;
    ws.next_values = wrap && j1 >= it.kv_end;
    const Index jn = ws.next_values ? it.kv_begin : j1;
    ws.next_cols = std::max<Index>(0, std::min(g.kv_tile, it.kv_end - jn));
    walk_pages(seq, jn, ws.next_cols, [&](Index c, Index n, size_t page, Index off) {
      fill_rows(ws.knext.data() + c, pages.k[page] + off * ks, ks, n);
      fill_rows(ws.vnext.data() + c, pages.v[page] + off * vs, vs, n);
    });
  }

  /// f(c, n, page, off) for every run of keys j0 + c .. j0 + c + n - 1 (c < cols) of sequence
  /// seq that lies in one page: its page index and the run's first row there. One call per page;
  /// the callers resolve a run's rows in a plain loop (fill_rows). Resolved key by key, with a
  /// page check per key, the rows of head-major decode's tiles (one kv head per item, 256 keys a
  /// tile) took most of run_item's own time (decode_bnsd/f16/B:1/KV:4096 0.616 -> 0.581 ms on one
  /// thread, AMD Zen 5).
  template <class F>
  void walk_pages(Index seq, Index j0, Index cols, F&& f) const {
    size_t page = static_cast<size_t>(pages.first[static_cast<size_t>(seq)] + j0 / pages.page_size);
    Index off = j0 % pages.page_size;
    for (Index c = 0; c < cols; ++page, off = 0) {
      const Index n = std::min(cols - c, pages.page_size - off);
      f(c, n, page, off);
      c += n;
    }
  }

  /// dst[i] = base + i·stride (as P: the row pointer, or its address as bytes), i < n.
  template <class P, class T>
  static void fill_rows(P* dst, const T* base, Index stride, Index n) {
    for (Index i = 0; i < n; ++i) dst[i] = reinterpret_cast<P>(base + i * stride);
  }

  /// The next tile's keys (or values) of kv head h, as lines for the panel kernels to fetch
  /// ahead (empty unless ahead(), and for the item's last tile); values only when
  /// ws.next_values.
  simd::LineStream next_lines(const Workspace& ws, bool keys, Index h) const {
    keys = keys && !ws.next_values;
    const StridedView<const TKV, 4>& x = keys ? in.k : in.v;
    const Index bytes = static_cast<Index>(sizeof(TKV));
    return {(keys ? ws.knext : ws.vnext).data(), ws.next_cols, h * x.stride(2) * bytes,
            (keys ? g.head_size : g.v_head_size) * bytes};
  }

  /// Calls f(j0, cols, tm) for every kv tile [j0, j0 + cols) of an item that is not fully
  /// masked (tm: TileMask None or Partial), after resolving its K / V rows (tile_rows). `wrap`:
  /// the two-pass mode's first pass, whose last tile fetches the first tile's values ahead.
  template <class F>
  void for_each_tile(Workspace& ws, const WorkItem& it, const SeqInfo& si, bool wrap, F&& f) const {
    for (Index j0 = it.kv_begin; j0 < it.kv_end; j0 += g.kv_tile) {
      const Index cols = std::min(g.kv_tile, it.kv_end - j0);
      const TileMask tm = var.classify(si, it.q_begin, it.q_end, j0, j0 + cols);
      if (tm == TileMask::All) continue;
      tile_rows(ws, it, j0, cols, wrap);
      f(j0, cols, tm);
    }
  }

  /// Rows gathered from anywhere (sparse attention's selected tokens, paged blocks) are fetched
  /// kGatherAhead rows ahead of their conversion, which the hardware prefetcher cannot guess;
  /// fp16 / bf16 / int8 rows only, as the small-row kernels (kernels::kPrefetchRows).
  static constexpr Index kGatherAhead = 4;
  static bool scattered(const std::vector<const TKV*>& row, Index cols, Index token_stride) {
    return kernels::kPrefetchRows<TKV> && cols > kGatherAhead &&
           row[static_cast<size_t>(cols - 1)] != row[0] + (cols - 1) * token_stride;
  }

  /// K or V rows of the current tile for kv head h as an Acc matrix: a Map into the input when
  /// the storage is Acc with a contiguous head dimension and the rows are evenly spaced (one
  /// page, or adjacent pages), else converted once into `buf`. `dq` (kv_dequant: the tile's
  /// per-token maps, else null) converts element x of row c to (x + dq[c].offset) · dq[c].scale.
  /// With `dense`, rows are mapped only when they are adjacent (row stride == width): the panel
  /// kernels read a tile many times, and rows a large power of two apart share cache sets.
  ConstRowMap<Acc> kv_tile(const StridedView<const TKV, 4>& x, const std::vector<const TKV*>& row,
                           Index h, Index cols, Index width, AlignedVector<Acc>& buf,
                           const KvAffine* dq = nullptr, bool dense = false) const {
    const Index hs = h * x.stride(2);
    if constexpr (kMapK) {
      bool even = x.stride(3) == 1 && dq == nullptr && (!dense || x.stride(1) == width);
      for (Index c = 1; even && c < cols; ++c)
        even = row[static_cast<size_t>(c)] == row[0] + c * x.stride(1);
      if (even)
        return ConstRowMap<Acc>(row[0] + hs, cols, width, Eigen::OuterStride<>(x.stride(1)));
    }
    const bool ahead = scattered(row, cols, x.stride(1));
    for (Index c = 0; c < cols; ++c) {
      Acc* dst = buf.data() + c * width;
      const TKV* src = row[static_cast<size_t>(c)] + hs;
      if (ahead && c + kGatherAhead < cols)
        kernels::prefetch_row(row[static_cast<size_t>(c + kGatherAhead)] + hs, width * x.stride(3));
      if (dq == nullptr) {
        load_row<Acc>(src, x.stride(3), width, dst, Acc(1));
        continue;
      }
      const Acc scale = static_cast<Acc>(dq[c].scale), offset = static_cast<Acc>(dq[c].offset);
      for (Index e = 0; e < width; ++e)
        dst[e] = (convert<Acc>(src[e * x.stride(3)]) + offset) * scale;
    }
    return ConstRowMap<Acc>(buf.data(), cols, width, Eigen::OuterStride<>(width));
  }

  /// The current tile's keys of kv head h, g.head_size wide (kv_tile; split scores: each row
  /// gathered as [k | k_rope] into ws.k, a copy of O(tile), never of the cache). `dense` as
  /// kv_tile's.
  /// kv_dequant: the current tile's key / value maps of kv head h (null without the hook).
  const KvAffine* kmaps(const Workspace& ws, Index h) const {
    return dequant() ? ws.kdq.data() + (h - ws.dq_head0) * g.kv_tile : nullptr;
  }
  const KvAffine* vmaps(const Workspace& ws, Index h) const {
    return dequant() ? ws.vdq.data() + (h - ws.dq_head0) * g.kv_tile : nullptr;
  }

  ConstRowMap<Acc> key_tile(Workspace& ws, Index h, Index cols, bool dense = false) const {
    const KvAffine* dq = kmaps(ws, h);
    if (!split()) return kv_tile(in.k, ws.krow, h, cols, g.head_size, ws.k, dq, dense);
    // (split scores never come with the kv_dequant hook: run_attention rejects the pair)
    const Index d = g.head_size - g.rope_size, r = g.rope_size, n = g.head_size;
    const Index hs = h * in.k.stride(2), hr = h * in.k_rope.stride(2);
    const bool ahead = scattered(ws.krow, cols, in.k.stride(1));
    for (Index c = 0; c < cols; ++c) {
      Acc* dst = ws.k.data() + c * n;
      if (ahead && c + kGatherAhead < cols) {
        const size_t a = static_cast<size_t>(c + kGatherAhead);
        kernels::prefetch_row(ws.krow[a] + hs, d * in.k.stride(3));
        kernels::prefetch_row(ws.kr_row[a] + hr, r * in.k_rope.stride(3));
      }
      load_row<Acc>(ws.krow[static_cast<size_t>(c)] + hs, in.k.stride(3), d, dst, Acc(1));
      load_row<Acc>(ws.kr_row[static_cast<size_t>(c)] + hr, in.k_rope.stride(3), r, dst + d,
                    Acc(1));
    }
    return ConstRowMap<Acc>(ws.k.data(), cols, n, Eigen::OuterStride<>(n));
  }

  /// Gathers the q rows of one head into its workspace rows (pre-multiplied by the scale; with
  /// the q_transform hook, transformed before the scale, each row's score constant in hd.qb).
  void load_q(const Head& hd, const SeqInfo& si, const ResolvedSeq& s, Index q0, Index nq) const {
    const bool hook = q_transformed();
    for (Index gi = 0; gi < g.group; ++gi) {
      const Index h = hd.kv_head * g.group + gi;
      for (Index t = 0; t < nq; ++t) {
        const TQ* src = in.q.ptr(s.q_batch, s.q_off + q0 + t, h, 0);
        Acc* row = hd.q + (gi * nq + t) * g.head_size;
        const Index d = g.head_size - g.rope_size;
        if (split())  // [q | q_rope]
          load_row<Acc>(in.q_rope.ptr(s.q_batch, s.q_off + q0 + t, h, 0), in.q_rope.stride(3),
                        g.rope_size, row + d, hook ? Acc(1) : scale);
        if (!hook) {
          load_row<Acc>(src, in.q.stride(3), d, row, scale);
          continue;
        }
        load_row<Acc>(src, in.q.stride(3), d, row, Acc(1));
        if constexpr (kQTransform)
          hd.qb[gi * nq + t] = var.template q_transform<Acc>(si, q0 + t, h, row, g.head_size);
        if (scale != Acc(1)) ArrayMap<Acc>(row, g.head_size) *= scale;
      }
    }
  }

  // The score and P·V products (engine/products.hpp).
  /// Raw scores q·k of one tile for heads [h0, h1) of an item. Small row blocks stream the keys
  /// token by token across the heads (contiguous memory in token-major caches) through the
  /// hand-vectorised kernels; larger ones the int8, panel or (portable level) Eigen GEMM modes.
  void raw_scores(Workspace& ws, const WorkItem& it, Index h0, Index h1, Index rows,
                  Index cols) const;
  /// O += P·V for heads [h0, h1) and one tile. A position masked for a row is never read for
  /// that row, so NaN/Inf stored there cannot leak (0 * NaN would).
  void accumulate_pv(Workspace& ws, const WorkItem& it, Index h0, Index h1, Index rows, Index cols,
                     bool partial) const;

  /// t (rows of dv, stride dv) += P·V on rows [r0, r1) of head hd, skipping each row's masked
  /// keys (flag set): a tile whose values hold inf / NaN, where a masked 0 · NaN would leak.
  void masked_pv(const Head& hd, const ConstRowMap<Acc>& V, Acc* t, Index r0, Index r1,
                 Index cols) const;
  /// The panel kernels: packs head hd's keys of the current tile into ws.kpanel (gathers them
  /// into ws.k first when gathered(); packs nothing when lanes(rows)).
  void pack_panel(Workspace& ws, const Head& hd, Index cols, Index rows) const;
  /// Scores of rows [r0, r1) of head hd (of `rows` per head) against the tile's keys [c0, c1):
  /// the panel kernel on ws.kpanel, or the lane kernel on the key rows when lanes(rows).
  void tile_scores(Workspace& ws, const Head& hd, Index rows, Index r0, Index r1, Index c0,
                   Index c1, const simd::LineStream& ahead) const;
  /// Rows per step of panel_tile: a block of scores (rows x ld() floats) that stays in the
  /// first-level cache between the score product, the P stage and P·V.
  static constexpr Index kPanelRows = 24;
  /// One tile of kv head h in the panel mode: keys packed and values resolved once, then for
  /// each block of kPanelRows rows the scores, the hooks, the softmax update and O += P·V.
  void panel_tile(Workspace& ws, const WorkItem& it, const SeqInfo& si, Index h, Index j0,
                  Index cols, TileMask tm) const;
  /// The heads [h0, h1) of an item as the small-row kernels see them (Acc float only).
  kernels::HeadBlock block(Workspace& ws, const WorkItem& it, Index h0, Index h1, Index rows,
                           Index cols) const {
    const Head hd = head(ws, it, h0);
    return {h0, h1, rows, cols, hd.q, g.head_size, hd.s, hd.f, ld(), hd.o, g.v_head_size};
  }
  /// The current tile's K or V rows in the cache (ws.krow / ws.vrow of `x`), or dense in a
  /// workspace buffer of row stride `width` (the tile dequantized by kv_tile).
  static kernels::TileRows<TKV> cache_rows(const std::vector<const TKV*>& row,
                                           const StridedView<const TKV, 4>& x) {
    return {row.data(), x.stride(2), nullptr, 0};
  }
  static kernels::TileRows<Acc> dense_rows(const AlignedVector<Acc>& buf, Index width) {
    return {nullptr, 0, buf.data(), width};
  }

  // The P stage: mask / transform hooks, online softmax, the rounded-P second pass
  // (engine/p_stage.hpp).
  /// Mask and transform hooks on rows [r0, r1) of one head's raw scores: masked entries become
  /// -inf and are flagged, visible ones go through the transform hook.
  void apply_hooks(const Head& hd, const SeqInfo& si, Index q0, Index nq, Index j0, Index cols,
                   TileMask tm, Index r0, Index r1) const;
  /// The columns [c0, c1) of a partial tile that rows [r0, r1) of one head can see: the union
  /// of the rows' row_interval ranges, widened to 16-key blocks (every column when a row has
  /// no interval; c0 == c1 when no row sees any). The panel products skip the rest.
  void visible_columns(const Head& hd, const SeqInfo& si, Index q0, Index nq, Index j0, Index cols,
                       Index r0, Index r1, Index& c0, Index& c1) const;
  /// Marks row r when one of its n visible raw scores is not finite: scale·q·k overflowed the
  /// compute type (or an unmasked input holds inf / NaN), so the row's softmax is undefined and
  /// its result NaN (SoftmaxState::overflow) — whatever the other scores of the row.
  void flag_overflow(const Head& hd, Index r, const Acc* raw, Index n) const;
  /// The transform hook on the visible columns [lo, hi) of one row (c0: its first column),
  /// after adding the row's q_transform constant `bias` (null: none).
  void transform_span(const SeqInfo& si, const Coord& c0, Acc* srow, Index lo, Index hi,
                      const Acc* bias = nullptr) const;
  /// True when row r of the tile has a visible position (SoftmaxState::visible: a row that saw
  /// visible keys but ends with l = 0, every visible score -inf after the hooks, is NaN, never
  /// the zero row of a masked one).
  bool tile_has_visible(const Head& hd, Index r, Index cols, bool partial) const;
  /// Online-softmax update of rows [r0, r1) of one head with the scores of one tile; leaves P
  /// in hd.s (with the quantize_p hook: the quantized P, and the tile's factor per row in
  /// hd.fac).
  void softmax_update(const Head& hd, const SeqInfo& si, Index r0, Index r1, Index cols,
                      bool partial, Index q0, Index nq, Index j0) const;
  /// The second pass of round_p variants, on the scores kept from the first: P = exp(s - m) / l
  /// per tile, written to the probs output when asked, rounded by the hook, then O += P·V (O
  /// ends normalised).
  void normalised_pass(Workspace& ws, const WorkItem& it) const;

  // One item from its Q rows to its output rows (engine/driver.hpp).
  /// Runs one item: online softmax over its kv range, leaving (state, unnormalised O) in ws.
  void run_item(Workspace& ws, const WorkItem& it) const;
  /// Writes the normalised output rows (and LSE) of a finished item; st / o hold its rows (o is
  /// normalised in place when the output hooks need the row).
  void finalize(const WorkItem& it, const SoftmaxState<Acc>* st, Acc* o) const;
  /// Debug pass after run_item: recomputes the scores and writes P = exp(s - m) / l.
  void write_probs(Workspace& ws, const WorkItem& it) const;
};

}  // namespace attnref::detail
