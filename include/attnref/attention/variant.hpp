#pragma once
/// Hooks of the attention engine ("variants", after FlashInfer's AttentionVariant).
///
/// The engine runs one tiled online-softmax loop; everything that makes one attention operator
/// differ from another enters through a variant object with this interface (duck-typed):
///
///   bool has_transform() const;                      // false: transform() is never called
///   KvRange kv_range(const SeqInfo& s, Index q_begin, Index q_end) const;
///       // a superset of the keys visible to queries [q_begin, q_end) of sequence s
///   TileMask classify(const SeqInfo& s, Index q_begin, Index q_end,
///                     Index kv_begin, Index kv_end) const;
///       // None: no position of the tile is masked; All: every position is masked (the tile is
///       // skipped, never computed); Partial: masked() is asked for every position
///   bool masked(const SeqInfo& s, const Coord& c) const;  // true = key c.kv hidden from c.q
///   template <class Acc> Acc transform(const SeqInfo& s, const Coord& c, Acc score) const;
///       // the scaled score -> the logit fed to softmax (bias, soft-cap, ...); called only for
///       // visible positions
///   template <class Acc> void transform_row(const SeqInfo& s, const Coord& c, Acc* row,
///                                           Index cols) const;   // optional
///       // transform() of the keys c.kv .. c.kv + cols - 1 of one query row, in place, giving
///       // the same values; lets a variant vectorise. It may see masked keys too: the engine
///       // overwrites their entries afterwards.
///   bool row_interval(const SeqInfo& s, const Coord& c, KvRange& visible) const;  // optional
///       // true when the keys masked() hides from query c.q are exactly those outside
///       // `visible` (then the engine masks partial tiles by range, without the predicate)
///   template <class Acc> Acc quantize_p(const Coord& c, Acc* row, Index cols, Acc& row_state,
///                                       Acc& sum) const;   // optional
///       // Quantized P·V (ATB's int8 Q/K/V path). Called for every row of every kv tile after
///       // the exponentials, c: the row's first key of the tile. `row` holds P̂ = exp(s - m)
///       // (0 for masked keys); the hook replaces it by the values that multiply V (integers),
///       // sets `sum` to the tile's share of the softmax denominator (its P̂ as the operator
///       // rounds them), may keep state across the tiles of one row in `row_state` (0 before
///       // the row's first tile) and returns the factor applied to the tile's P·V product before
///       // it is added to O. The product is computed in Acc: exact when P and V hold integers of
///       // at most 8 bits and kv_tile <= 1024 (every partial sum an integer below 2^24). With
///       // this hook the engine runs each row's tiles in order on the grid of kv_tile keys from
///       // key 0 (the operator's block grid) and never splits a kv range.
///   template <class Acc> void round_p(const Coord& c, Acc* row, Index cols) const;  // optional
///       // P·V with the normalised probabilities as the operator rounds them (NSA's P cast to
///       // fp16 / bf16 before P·V). The engine then runs two passes per item: the first finds
///       // each row's max and sum, the second recomputes the scores, forms P = exp(s - m) / l
///       // (0 for masked keys), writes it to the probs output when asked, lets the hook round
///       // `row` (the keys c.kv .. c.kv + cols - 1 of one row) and adds P·V to the (already
///       // normalised) output. Items are never split; not combinable with quantize_p.
///   template <class Acc> void item_probs(const SeqInfo& s, const ItemProbs<Acc>& p) const;
///       // optional, with round_p: the normalised probabilities of one finished work item of
///       // the two-pass mode (before round_p), handed over by the worker that ran the item while
///       // they are still in its cache (NSA's importance scores read them there instead of
///       // through a probs tensor of the whole batch in memory). Every kv head of an item comes
///       // with all its q heads, and items are never split, so each row is whole. Not called for
///       // an item without keys.
///   bool has_kv_dequant() const;                                   // optional, with:
///   void kv_dequant(const SeqInfo& s, Index kv, Index kv_head, KvAffine& k, KvAffine& v) const;
///       // Per-token (and per-head) dequantization as the keys and values are loaded (IFA's
///       // antiquant_mode 1, FIA's modes 1 and 3–5): element x of key kv, kv head kv_head of
///       // sequence s is read as (x + k.offset) · k.scale in the compute type, its value's as
///       // (x + v.offset) · v.scale. Tile by tile, for the heads of the item, into the engine's
///       // O(tile · heads) scratch: nothing proportional to the kv length. has_kv_dequant()
///       // false: never called.
///
///   bool has_q_transform() const;                                  // optional, with:
///   template <class Acc> Acc q_transform(const SeqInfo& s, Index q, Index q_head, Acc* row,
///                                        Index d) const;
///       // The query row as loaded (in the compute type, before the softmax scale), in place:
///       // ATB's qScale rounded to the data type, a per-channel key dequantization folded into
///       // q. Returns a constant the engine adds to every visible score of the row (after the
///       // scale, before transform()): a key offset's share of the score. Called once per row.
///   bool has_o_transform() const;                                  // optional, with:
///   template <class Acc> void o_transform(const SeqInfo& s, Index q, Index q_head, Acc* row,
///                                         Index dv) const;
///       // The normalised output row, in place, before it is stored (V's per-channel
///       // dequantization). Called for every output row the engine writes, rows without keys
///       // (zeros) included.
///   bool has_sink() const;                                          // optional, with:
///   double sink(Index q_head) const;
///       // A learnable sink logit per q head (FusedInferAttentionScore's learnable_sink): it joins
///       // every row's softmax denominator as exp(sink - m), m the row's max over its keys (the
///       // sink not included), with no value row; the lse output leaves it out. A row without
///       // keys stays 0.
///   template <class Acc> std::int8_t quantize_o(const SeqInfo& s, Index q_head, Index e,
///                                               Acc x) const;          // optional
///       // An int8 output (o of type int8 is allowed only with this hook): element e of the
///       // row of q head q_head, after o_transform.
///
/// All hooks share one coordinate: (batch, q position, kv position, q head, kv head), positions
/// counted from the start of the sequence. A masked position is never read after its score is
/// computed: its probability is exactly 0 and NaN/Inf in its key or value cannot reach the output.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "attnref/attention/params.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

/// One point of the score matrix.
struct Coord {
  Index batch;
  Index q;
  Index kv;
  Index q_head;
  Index kv_head;
};

/// One sequence of the batch as the hooks see it.
struct SeqInfo {
  Index batch;
  Index q_len;
  Index kv_len;
};

/// The normalised probabilities of one work item (the item_probs hook): kv heads [head_begin,
/// head_end) with their `group` q heads each (q head h·group + gi), query positions [q_begin,
/// q_end), keys [kv_begin, kv_end) of the sequence. at(h, gi, q)[j] is P of key kv_begin + j;
/// the sequence's keys outside [kv_begin, kv_end) are masked for these rows (P 0).
template <class Acc>
struct ItemProbs {
  Index head_begin, head_end, group, q_begin, q_end, kv_begin, kv_end;
  const Acc* p;
  const Acc* at(Index h, Index gi, Index q) const {
    const Index nq = q_end - q_begin;
    return p + (((h - head_begin) * group + gi) * nq + (q - q_begin)) * (kv_end - kv_begin);
  }
};

/// Half-open key range [begin, end).
struct KvRange {
  Index begin;
  Index end;
};

/// The per-token affine map of a dequantized key or value: x -> (x + offset) · scale.
struct KvAffine {
  float scale = 1.0f;
  float offset = 0.0f;
};

/// True when V has the optional kv_dequant hook.
template <class V, class = void>
struct has_kv_dequant : std::false_type {};
template <class V>
struct has_kv_dequant<V, std::void_t<decltype(std::declval<const V&>().kv_dequant(
                             std::declval<const SeqInfo&>(), Index{}, Index{},
                             std::declval<KvAffine&>(), std::declval<KvAffine&>()))>>
    : std::true_type {};

/// True when V has the optional sink hook.
template <class V, class = void>
struct has_sink : std::false_type {};
template <class V>
struct has_sink<V, std::void_t<decltype(std::declval<const V&>().sink(Index{}))>> : std::true_type {
};

/// True when V has the optional q_transform hook for accumulator Acc.
template <class V, class Acc, class = void>
struct has_q_transform : std::false_type {};
template <class V, class Acc>
struct has_q_transform<
    V, Acc,
    std::void_t<decltype(std::declval<const V&>().template q_transform<Acc>(
        std::declval<const SeqInfo&>(), Index{}, Index{}, std::declval<Acc*>(), Index{}))>>
    : std::true_type {};

/// True when V has the optional o_transform hook for accumulator Acc.
template <class V, class Acc, class = void>
struct has_o_transform : std::false_type {};
template <class V, class Acc>
struct has_o_transform<
    V, Acc,
    std::void_t<decltype(std::declval<const V&>().template o_transform<Acc>(
        std::declval<const SeqInfo&>(), Index{}, Index{}, std::declval<Acc*>(), Index{}))>>
    : std::true_type {};

/// True when V has the optional quantize_o hook for accumulator Acc.
template <class V, class Acc, class = void>
struct has_quantize_o : std::false_type {};
template <class V, class Acc>
struct has_quantize_o<V, Acc,
                      std::void_t<decltype(std::declval<const V&>().template quantize_o<Acc>(
                          std::declval<const SeqInfo&>(), Index{}, Index{}, Acc{}))>>
    : std::true_type {};

/// True when V has the optional transform_row hook for accumulator Acc.
template <class V, class Acc, class = void>
struct has_transform_row : std::false_type {};
template <class V, class Acc>
struct has_transform_row<V, Acc,
                         std::void_t<decltype(std::declval<const V&>().template transform_row<Acc>(
                             std::declval<const SeqInfo&>(), std::declval<const Coord&>(),
                             std::declval<Acc*>(), Index{}))>> : std::true_type {};

/// True when V has the optional row_interval hook.
template <class V, class = void>
struct has_row_interval : std::false_type {};
template <class V>
struct has_row_interval<V, std::void_t<decltype(std::declval<const V&>().row_interval(
                               std::declval<const SeqInfo&>(), std::declval<const Coord&>(),
                               std::declval<KvRange&>()))>> : std::true_type {};

/// True when V has the optional quantize_p hook for accumulator Acc.
template <class V, class Acc, class = void>
struct has_quantize_p : std::false_type {};
template <class V, class Acc>
struct has_quantize_p<V, Acc,
                      std::void_t<decltype(std::declval<const V&>().template quantize_p<Acc>(
                          std::declval<const Coord&>(), std::declval<Acc*>(), Index{},
                          std::declval<Acc&>(), std::declval<Acc&>()))>> : std::true_type {};

/// True when V has the optional round_p hook for accumulator Acc.
template <class V, class Acc, class = void>
struct has_round_p : std::false_type {};
template <class V, class Acc>
struct has_round_p<V, Acc,
                   std::void_t<decltype(std::declval<const V&>().template round_p<Acc>(
                       std::declval<const Coord&>(), std::declval<Acc*>(), Index{}))>>
    : std::true_type {};

/// True when V has the optional item_probs hook for accumulator Acc.
template <class V, class Acc, class = void>
struct has_item_probs : std::false_type {};
template <class V, class Acc>
struct has_item_probs<V, Acc,
                      std::void_t<decltype(std::declval<const V&>().template item_probs<Acc>(
                          std::declval<const SeqInfo&>(), std::declval<const ItemProbs<Acc>&>()))>>
    : std::true_type {};

enum class TileMask { None, All, Partial };

/// Causal predicate and tile classification (one small, separately tested piece).
struct CausalHook {
  CausalMode mode = CausalMode::None;
  /// Sliding window (needs a causal mode): W keys per query, its own position included — key j
  /// visible to query i iff i' - W < j <= i' with i' = i + offset. 0 = no window.
  Index window = 0;

  /// Offset added to the query position: key j visible iff j <= i + offset.
  Index offset(const SeqInfo& s) const {
    return mode == CausalMode::BottomRight ? s.kv_len - s.q_len : 0;
  }
  bool masked(const SeqInfo& s, Index i, Index j) const {
    if (mode == CausalMode::None) return false;
    const Index last = i + offset(s);
    return j > last || (window > 0 && j <= last - window);
  }
  /// The keys query i sees: [i' - window + 1, i'] (or [0, i']) within [0, kv_len).
  KvRange visible(const SeqInfo& s, Index i) const {
    if (mode == CausalMode::None) return {0, s.kv_len};
    const Index last = i + offset(s);
    const Index first = window > 0 ? last - window + 1 : 0;
    const Index end = std::clamp<Index>(last + 1, 0, s.kv_len);
    return {std::clamp<Index>(first, 0, end), end};
  }
  KvRange kv_range(const SeqInfo& s, Index q_begin, Index q_end) const {
    if (mode == CausalMode::None || q_end <= q_begin) return {0, s.kv_len};
    const Index off = offset(s);
    const Index last = q_end - 1 + off;  // last key visible to the last query
    const Index first = window > 0 ? q_begin + off - window + 1 : 0;  // first key of the first
    return {std::clamp<Index>(first, 0, s.kv_len), std::clamp<Index>(last + 1, 0, s.kv_len)};
  }
  TileMask classify(const SeqInfo& s, Index q_begin, Index q_end, Index kv_begin,
                    Index kv_end) const {
    if (mode == CausalMode::None) return TileMask::None;
    const Index off = offset(s);
    if (kv_begin > q_end - 1 + off) return TileMask::All;
    if (window > 0 && kv_end - 1 <= q_begin + off - window) return TileMask::All;
    const bool below = kv_end - 1 <= q_begin + off;
    const bool inside = window == 0 || kv_begin > q_end - 1 + off - window;
    return below && inside ? TileMask::None : TileMask::Partial;
  }
};

/// The engine's built-in variant: causal masking plus the optional custom masks of the inputs
/// (boolean: nonzero = masked; additive: added to the scaled score, -inf = masked).
struct DefaultVariant {
  CausalHook causal{};
  StridedView<const float, 4> mask_add{};
  StridedView<const std::uint8_t, 4> mask_bool{};

  bool has_custom_mask() const { return !mask_add.absent() || !mask_bool.absent(); }
  bool has_transform() const { return !mask_add.absent(); }

  KvRange kv_range(const SeqInfo& s, Index q_begin, Index q_end) const {
    return causal.kv_range(s, q_begin, q_end);
  }
  TileMask classify(const SeqInfo& s, Index q_begin, Index q_end, Index kv_begin,
                    Index kv_end) const {
    const TileMask c = causal.classify(s, q_begin, q_end, kv_begin, kv_end);
    if (c == TileMask::All || !has_custom_mask()) return c;
    return TileMask::Partial;
  }
  bool row_interval(const SeqInfo& s, const Coord& c, KvRange& visible) const {
    if (has_custom_mask()) return false;
    visible = causal.visible(s, c.q);
    return true;
  }
  bool masked(const SeqInfo& s, const Coord& c) const {
    if (causal.masked(s, c.q, c.kv)) return true;
    if (!mask_bool.absent() && at(mask_bool, c) != 0) return true;
    if (!mask_add.absent() && at(mask_add, c) == -std::numeric_limits<float>::infinity())
      return true;
    return false;
  }
  template <class Acc>
  Acc transform(const SeqInfo&, const Coord& c, Acc score) const {
    if (mask_add.absent()) return score;
    return score + static_cast<Acc>(at(mask_add, c));
  }

 private:
  template <class V>
  static typename V::value_type at(const V& m, const Coord& c) {
    const Index b = m.size(0) == 1 ? 0 : c.batch;
    const Index h = m.size(1) == 1 ? 0 : c.q_head;
    return m(b, h, c.q, c.kv);
  }
};

}  // namespace attnref
