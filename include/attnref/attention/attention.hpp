#pragma once
/// attnref::attention — scaled dot-product attention on the one tiled engine.
///
///   O[b, i, h, :] = sum_j P[b, h, i, j] V[b, j, h / G, :]
///   P[b, h, i, :] = softmax_j( logit(b, i, j, h) ),  logit = scale * q·k (+ additive mask)
/// over the keys j visible to query i (causal mode, boolean mask, additive -inf), with
/// G = N_q / N_kv (contiguous GQA groups). Shapes: attention/params.hpp.
///
/// Defined edge cases (never NaN from the engine itself):
///   * kv length 0, or a query row with no visible key: output row 0, LSE -inf, probs row 0;
///   * masked positions are never read after their score: NaN/Inf stored in a masked key or
///     value cannot reach the output;
///   * rows beyond a sequence's q length (padding of non-packed views) are not written.
///
/// Bad input throws std::invalid_argument before anything is written (message
/// "attnref::attention: <argument> <what>: expected <x>, got <y>").

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "attnref/attention/paged_kv.hpp"
#include "attnref/attention/params.hpp"
#include "attnref/attention/variant.hpp"
#include "attnref/core/error.hpp"
#include "attnref/detail/engine.hpp"

namespace attnref {

namespace detail {

inline void check_lengths(const char* fn, const char* name, const std::vector<Index>& lens,
                          Index batch, Index extent, const char* extent_name) {
  ATTNREF_CHECK(static_cast<Index>(lens.size()) == batch, std::invalid_argument, fn, name,
                "size mismatch", batch, lens.size());
  for (size_t b = 0; b < lens.size(); ++b) {
    const std::string arg = std::string(name) + "[" + std::to_string(b) + "]";
    ATTNREF_CHECK(lens[b] >= 0, std::invalid_argument, fn, arg, "negative", ">= 0", lens[b]);
    ATTNREF_CHECK(lens[b] <= extent, std::invalid_argument, fn, arg,
                  std::string("exceeds ") + extent_name, "<= " + std::to_string(extent), lens[b]);
  }
}

inline void check_cu(const char* fn, const char* name, const std::vector<Index>& cu, Index batch,
                     Index tokens, const char* tokens_name) {
  ATTNREF_CHECK(static_cast<Index>(cu.size()) == batch + 1, std::invalid_argument, fn, name,
                "size mismatch", batch + 1, cu.size());
  ATTNREF_CHECK(cu[0] >= 0, std::invalid_argument, fn, std::string(name) + "[0]", "negative",
                ">= 0", cu[0]);
  for (size_t b = 1; b < cu.size(); ++b) {
    const std::string arg = std::string(name) + "[" + std::to_string(b) + "]";
    ATTNREF_CHECK(cu[b] >= cu[b - 1], std::invalid_argument, fn, arg, "not non-decreasing",
                  ">= " + std::to_string(cu[b - 1]), cu[b]);
  }
  ATTNREF_CHECK(cu.back() <= tokens, std::invalid_argument, fn,
                std::string(name) + "[" + std::to_string(batch) + "]",
                std::string("exceeds ") + tokens_name, "<= " + std::to_string(tokens), cu.back());
}

template <class A, int RA, class B, int RB>
inline void check_no_overlap(const char* fn, const char* out_name, const StridedView<A, RA>& out,
                             const char* in_name, const StridedView<B, RB>& in) {
  ATTNREF_CHECK(!overlaps(out, in), std::invalid_argument, fn, out_name, "overlaps an input",
                std::string("memory disjoint from ") + in_name, "overlapping memory");
}

/// check_no_overlap of `out` against each (name, input view) pair.
template <class A, int RA>
inline void check_out_overlaps(const char*, const char*, const StridedView<A, RA>&) {}
template <class A, int RA, class B, int RB, class... Rest>
inline void check_out_overlaps(const char* fn, const char* out_name, const StridedView<A, RA>& out,
                               const char* in_name, const StridedView<B, RB>& in,
                               const Rest&... rest) {
  check_no_overlap(fn, out_name, out, in_name, in);
  check_out_overlaps(fn, out_name, out, rest...);
}

template <class M>
inline void check_mask(const char* fn, const char* name, const M& m, Index batch, Index num_heads,
                       Index max_q, Index max_kv) {
  if (m.absent()) return;
  const std::string n(name);
  ATTNREF_CHECK(m.size(0) == 1 || m.size(0) == batch, std::invalid_argument, fn, n + ".shape[0]",
                "mismatch", "1 or " + std::to_string(batch), m.size(0));
  ATTNREF_CHECK(m.size(1) == 1 || m.size(1) == num_heads, std::invalid_argument, fn,
                n + ".shape[1]", "mismatch", "1 or " + std::to_string(num_heads), m.size(1));
  ATTNREF_CHECK(m.size(2) >= max_q, std::invalid_argument, fn, n + ".shape[2]",
                "smaller than the longest q sequence", ">= " + std::to_string(max_q), m.size(2));
  ATTNREF_CHECK(m.size(3) >= max_kv, std::invalid_argument, fn, n + ".shape[3]",
                "smaller than the longest kv sequence", ">= " + std::to_string(max_kv), m.size(3));
}

/// Compile-time element-type rules of the engine. int8 inputs are taken as their integer
/// values (exact in float: |q·k| <= 127² · D stays below 2^24 for D <= 1024); the quantized
/// operators apply their scales through the hooks.
template <class Acc, class TQ, class TKV, class TO, class TS>
constexpr void check_types() {
  static_assert(is_compute_type_v<Acc>, "Acc must be float or double");
  static_assert(is_storage_type_v<TQ> && is_storage_type_v<TKV>,
                "q/k/v storage: float, double, half, bfloat16 or int8");
  static_assert(is_storage_type_v<TO>,
                "o storage: float, double, half or bfloat16 (int8 with a quantize_o hook)");
  static_assert(std::is_floating_point_v<TS>, "lse / probs must be float or double");
}

template <class TQ, class TKV>
void resolve_rope(const char* fn, const AttentionInputs<TQ, TKV>& in, Geometry& g);

/// The views (extents, spans, data), the heads and head sizes, and the params.
template <class TQ, class TKV, class TO, class TS>
void resolve_heads(const char* fn, const AttentionInputs<TQ, TKV>& in, const AttentionParams& p,
                   const AttentionOutputs<TO, TS>& out, Geometry& g) {
  const auto& q = in.q;
  const auto& k = in.k;
  const auto& v = in.v;
  // Every view first: extents >= 0, sizes and spans within 64 bits, data where there are
  // elements (so no size computed below can overflow).
  check_view(fn, "q", q);
  check_view(fn, "k", k);
  check_view(fn, "v", v);
  check_view(fn, "o", out.o);
  check_view(fn, "lse", out.lse);
  check_view(fn, "probs", out.probs);
  check_view(fn, "mask_add", in.mask_add);
  check_view(fn, "mask_bool", in.mask_bool);
  check_view(fn, "block_table", in.block_table);
  g.num_heads = q.size(2);
  g.num_kv_heads = k.size(2);
  g.head_size = q.size(3);
  g.v_head_size = v.size(3);
  ATTNREF_CHECK(g.num_heads > 0, std::invalid_argument, fn, "q.shape[2] (num_heads)",
                "not positive", ">= 1", g.num_heads);
  ATTNREF_CHECK(g.head_size > 0, std::invalid_argument, fn, "q.shape[3] (head_size)",
                "not positive", ">= 1", g.head_size);
  ATTNREF_CHECK(g.num_kv_heads > 0, std::invalid_argument, fn, "k.shape[2] (num_kv_heads)",
                "not positive", ">= 1", g.num_kv_heads);
  ATTNREF_CHECK(g.v_head_size > 0, std::invalid_argument, fn, "v.shape[3] (v_head_size)",
                "not positive", ">= 1", g.v_head_size);
  ATTNREF_CHECK(k.size(3) == g.head_size, std::invalid_argument, fn, "k.shape[3] (head_size)",
                "mismatch with q", g.head_size, k.size(3));
  ATTNREF_CHECK(v.size(2) == g.num_kv_heads, std::invalid_argument, fn, "v.shape[2] (num_kv_heads)",
                "mismatch with k", g.num_kv_heads, v.size(2));
  ATTNREF_CHECK(v.size(1) == k.size(1), std::invalid_argument, fn, "v.shape[1] (kv sequence)",
                "mismatch with k", k.size(1), v.size(1));
  ATTNREF_CHECK(v.size(0) == k.size(0), std::invalid_argument, fn, "v.shape[0] (batch)",
                "mismatch with k", k.size(0), v.size(0));
  ATTNREF_CHECK(g.num_heads % g.num_kv_heads == 0, std::invalid_argument, fn,
                "q.shape[2] (num_heads)", "not a multiple of num_kv_heads",
                "a multiple of " + std::to_string(g.num_kv_heads), g.num_heads);
  g.group = g.num_heads / g.num_kv_heads;
  ATTNREF_CHECK(std::isfinite(p.scale), std::invalid_argument, fn, "params.scale", "not finite",
                "a finite value", p.scale);
  ATTNREF_CHECK(p.window >= 0, std::invalid_argument, fn, "params.window", "negative", ">= 0",
                p.window);
  ATTNREF_CHECK(p.window == 0 || p.causal != CausalMode::None, std::invalid_argument, fn,
                "params.window", "set without a causal mode",
                "CausalMode::TopLeft or BottomRight with a window", "CausalMode::None");
  resolve_rope(fn, in, g);
}

/// Split scores: q_rope / k_rope both or neither, with q's / k's extents and one R > 0;
/// g.head_size becomes D + R.
template <class TQ, class TKV>
void resolve_rope(const char* fn, const AttentionInputs<TQ, TKV>& in, Geometry& g) {
  const auto& qr = in.q_rope;
  const auto& kr = in.k_rope;
  check_view(fn, "q_rope", qr);
  check_view(fn, "k_rope", kr);
  ATTNREF_CHECK(qr.absent() == kr.absent(), std::invalid_argument, fn, "q_rope / k_rope",
                "one given without the other", "both or neither",
                qr.absent() ? "k_rope only" : "q_rope only");
  if (qr.absent()) return;
  const auto& q = in.q;
  const auto& k = in.k;
  ATTNREF_CHECK(qr.size(0) == q.size(0) && qr.size(1) == q.size(1) && qr.size(2) == q.size(2),
                std::invalid_argument, fn, "q_rope.shape", "mismatch with q",
                "[" + std::to_string(q.size(0)) + ", " + std::to_string(q.size(1)) + ", " +
                    std::to_string(q.size(2)) + ", R]",
                shape_str(qr));
  ATTNREF_CHECK(kr.size(0) == k.size(0) && kr.size(1) == k.size(1) && kr.size(2) == k.size(2),
                std::invalid_argument, fn, "k_rope.shape", "mismatch with k",
                "[" + std::to_string(k.size(0)) + ", " + std::to_string(k.size(1)) + ", " +
                    std::to_string(k.size(2)) + ", R]",
                shape_str(kr));
  ATTNREF_CHECK(qr.size(3) > 0, std::invalid_argument, fn, "q_rope.shape[3] (R)", "not positive",
                ">= 1", qr.size(3));
  ATTNREF_CHECK(kr.size(3) == qr.size(3), std::invalid_argument, fn, "k_rope.shape[3] (R)",
                "mismatch with q_rope", qr.size(3), kr.size(3));
  g.rope_size = qr.size(3);
  g.head_size += g.rope_size;
}

/// Left-padded views: seq.q_start / seq.kv_start move each sequence's first token (q_off /
/// kv_off), checked to keep it inside its row of a padded view (not packed, not paged).
inline void apply_starts(const char* fn, const char* name, const std::vector<Index>& start,
                         bool padded, Index extent, Geometry& g, bool q_side) {
  if (start.empty()) return;
  ATTNREF_CHECK(padded, std::invalid_argument, fn, name, "given with a packed (cu) or paged view",
                "empty", start.size());
  ATTNREF_CHECK(static_cast<Index>(start.size()) == g.batch, std::invalid_argument, fn, name,
                "size mismatch", g.batch, start.size());
  for (size_t b = 0; b < start.size(); ++b) {
    ResolvedSeq& s = g.seqs[b];
    const Index len = q_side ? s.q_len : s.kv_len;
    ATTNREF_CHECK(start[b] >= 0 && start[b] <= extent - len, std::invalid_argument, fn,
                  std::string(name) + "[" + std::to_string(b) + "]",
                  "puts the sequence outside its view", "[0, " + std::to_string(extent - len) + "]",
                  start[b]);
    (q_side ? s.q_off : s.kv_off) = start[b];
  }
}

/// The sequence structure (padded, packed with cu offsets, or paged through a validated cache):
/// g.batch and g.seqs; max_q / max_kv: the longest query and kv lengths.
template <class TQ, class TKV>
void resolve_seqs(const char* fn, const AttentionInputs<TQ, TKV>& in, Geometry& g, Index& max_q,
                  Index& max_kv) {
  max_q = 0;
  max_kv = 0;
  const auto& q = in.q;
  const auto& k = in.k;
  const auto& seq = in.seq;
  // Sequence structure.
  const bool q_packed = !seq.q_cu.empty();
  const bool kv_packed = !seq.kv_cu.empty();
  if (q_packed) {
    ATTNREF_CHECK(q.size(0) == 1, std::invalid_argument, fn, "q.shape[0]",
                  "must be 1 for packed (TND) q with q_cu", 1, q.size(0));
    ATTNREF_CHECK(seq.q.empty(), std::invalid_argument, fn, "seq.q", "given together with seq.q_cu",
                  "empty", seq.q.size());
    g.batch = static_cast<Index>(seq.q_cu.size()) - 1;
    ATTNREF_CHECK(g.batch >= 0, std::invalid_argument, fn, "seq.q_cu", "size mismatch",
                  ">= 1 entries", 0);
    check_cu(fn, "seq.q_cu", seq.q_cu, g.batch, q.size(1), "q.shape[1] (tokens)");
  } else {
    g.batch = q.size(0);
    if (!seq.q.empty()) check_lengths(fn, "seq.q", seq.q, g.batch, q.size(1), "q.shape[1]");
  }
  const bool paged = !in.block_table.absent();
  if (paged) {
    const auto& bt = in.block_table;
    ATTNREF_CHECK(!kv_packed, std::invalid_argument, fn, "seq.kv_cu", "given with a block table",
                  "empty", seq.kv_cu.size());
    ATTNREF_CHECK(bt.size(0) == g.batch, std::invalid_argument, fn, "block_table.shape[0]",
                  "mismatch with the batch", g.batch, bt.size(0));
    ATTNREF_CHECK(!seq.kv.empty(), std::invalid_argument, fn, "seq.kv",
                  "missing with a block table", "the kv length of every sequence", "empty");
    ATTNREF_CHECK(static_cast<Index>(seq.kv.size()) == g.batch, std::invalid_argument, fn, "seq.kv",
                  "size mismatch", g.batch, seq.kv.size());
    in.paged_kv().validate(
        fn, {"k", "v", "block_table", "seq.kv", "k.shape[1] (block_size)", "block_size"});
  } else if (kv_packed) {
    ATTNREF_CHECK(k.size(0) == 1, std::invalid_argument, fn, "k.shape[0]",
                  "must be 1 for packed (TND) kv with kv_cu", 1, k.size(0));
    ATTNREF_CHECK(seq.kv.empty(), std::invalid_argument, fn, "seq.kv",
                  "given together with seq.kv_cu", "empty", seq.kv.size());
    check_cu(fn, "seq.kv_cu", seq.kv_cu, g.batch, k.size(1), "k.shape[1] (tokens)");
  } else {
    ATTNREF_CHECK(k.size(0) == g.batch, std::invalid_argument, fn, "k.shape[0] (batch)",
                  "mismatch with q", g.batch, k.size(0));
    if (!seq.kv.empty()) check_lengths(fn, "seq.kv", seq.kv, g.batch, k.size(1), "k.shape[1]");
  }
  g.seqs.resize(static_cast<size_t>(g.batch));
  for (Index b = 0; b < g.batch; ++b) {
    ResolvedSeq& s = g.seqs[static_cast<size_t>(b)];
    const size_t ub = static_cast<size_t>(b);
    if (q_packed)
      s = {0, seq.q_cu[ub], seq.q_cu[ub + 1] - seq.q_cu[ub], 0, 0, 0};
    else
      s = {b, 0, seq.q.empty() ? q.size(1) : seq.q[ub], 0, 0, 0};
    if (paged) {
      s.kv_batch = b;
      s.kv_off = 0;
      s.kv_len = seq.kv[ub];
    } else if (kv_packed) {
      s.kv_batch = 0;
      s.kv_off = seq.kv_cu[ub];
      s.kv_len = seq.kv_cu[ub + 1] - seq.kv_cu[ub];
    } else {
      s.kv_batch = b;
      s.kv_off = 0;
      s.kv_len = seq.kv.empty() ? k.size(1) : seq.kv[ub];
    }
    max_q = std::max(max_q, s.q_len);
    max_kv = std::max(max_kv, s.kv_len);
  }
  apply_starts(fn, "seq.q_start", seq.q_start, !q_packed, q.size(1), g, true);
  apply_starts(fn, "seq.kv_start", seq.kv_start, !paged && !kv_packed, k.size(1), g, false);
}

/// The outputs' shapes, the masks' extents, and no output overlapping an input or another output.
template <class TQ, class TKV, class TO, class TS>
void resolve_outputs(const char* fn, const AttentionInputs<TQ, TKV>& in,
                     const AttentionOutputs<TO, TS>& out, const Geometry& g, Index max_q,
                     Index max_kv, bool kv_template) {
  const auto& q = in.q;
  const auto& k = in.k;
  const auto& v = in.v;
  // Outputs.
  const std::array<Index, 4> o_shape{q.size(0), q.size(1), g.num_heads, g.v_head_size};
  ATTNREF_CHECK(out.o.shape() == o_shape, std::invalid_argument, fn, "o.shape", "mismatch",
                shape_str<4>(o_shape), shape_str(out.o));
  if (!out.lse.absent()) {
    const std::array<Index, 3> want{q.size(0), g.num_heads, q.size(1)};
    ATTNREF_CHECK(out.lse.shape() == want, std::invalid_argument, fn, "lse.shape", "mismatch",
                  shape_str<3>(want), shape_str(out.lse));
  }
  if (!out.probs.absent()) {
    ATTNREF_CHECK(out.probs.size(0) == q.size(0) && out.probs.size(1) == g.num_heads &&
                      out.probs.size(2) == q.size(1) && out.probs.size(3) >= max_kv,
                  std::invalid_argument, fn, "probs.shape", "mismatch",
                  "[" + std::to_string(q.size(0)) + ", " + std::to_string(g.num_heads) + ", " +
                      std::to_string(q.size(1)) + ", >= " + std::to_string(max_kv) + "]",
                  shape_str(out.probs));
  }
  check_mask(fn, "mask_add", in.mask_add, g.batch, g.num_heads, max_q, max_kv);
  check_mask(fn, "mask_bool", in.mask_bool, g.batch, g.num_heads, max_q, max_kv);
  // (kv_template: k / v only give the strides of caller-built pages, the caller checks the
  // pages' memory)
  const auto no_kv = [kv_template](const auto& x) {
    return kv_template ? std::decay_t<decltype(x)>{} : x;
  };
  check_no_overlap(fn, "o", out.o, "q", q);
  check_no_overlap(fn, "o", out.o, "q_rope", in.q_rope);
  check_no_overlap(fn, "o", out.o, "k_rope", no_kv(in.k_rope));
  check_no_overlap(fn, "lse", out.lse, "q_rope", in.q_rope);
  check_no_overlap(fn, "lse", out.lse, "k_rope", no_kv(in.k_rope));
  check_no_overlap(fn, "probs", out.probs, "q_rope", in.q_rope);
  check_no_overlap(fn, "probs", out.probs, "k_rope", no_kv(in.k_rope));
  check_no_overlap(fn, "o", out.o, "k", no_kv(k));
  check_no_overlap(fn, "o", out.o, "v", no_kv(v));
  check_no_overlap(fn, "o", out.o, "mask_add", in.mask_add);
  check_no_overlap(fn, "o", out.o, "mask_bool", in.mask_bool);
  check_no_overlap(fn, "lse", out.lse, "q", q);
  check_no_overlap(fn, "lse", out.lse, "k", no_kv(k));
  check_no_overlap(fn, "lse", out.lse, "v", no_kv(v));
  check_no_overlap(fn, "lse", out.lse, "o", out.o);
  check_no_overlap(fn, "probs", out.probs, "q", q);
  check_no_overlap(fn, "probs", out.probs, "k", no_kv(k));
  check_no_overlap(fn, "probs", out.probs, "v", no_kv(v));
  check_no_overlap(fn, "probs", out.probs, "o", out.o);
  check_no_overlap(fn, "probs", out.probs, "lse", out.lse);
  check_no_overlap(fn, "o", out.o, "block_table", in.block_table);
  check_no_overlap(fn, "lse", out.lse, "block_table", in.block_table);
  check_no_overlap(fn, "probs", out.probs, "block_table", in.block_table);
}

/// Validates everything and resolves the geometry (throws before any output is written).
template <class TQ, class TKV, class TO, class TS>
Geometry resolve(const char* fn, const AttentionInputs<TQ, TKV>& in, const AttentionParams& p,
                 const AttentionOutputs<TO, TS>& out, const ExecConfig& exec,
                 bool kv_template = false) {
  Geometry g;
  check_exec(fn, exec);
  resolve_heads(fn, in, p, out, g);
  Index max_q = 0, max_kv = 0;
  resolve_seqs(fn, in, g, max_q, max_kv);
  resolve_outputs(fn, in, out, g, max_q, max_kv, kv_template);
  // Tiling (depends on the problem only, never on threads).
  // A requested tile longer than every sequence is the whole sequence (the same work, and no
  // size arithmetic on a tile of 2^62 rows).
  g.q_tile = exec.q_tile > 0 ? std::min(exec.q_tile, std::max<Index>(1, max_q))
                             : std::max<Index>(1, 256 / g.group);
  g.kv_tile = exec.kv_tile > 0 ? std::min(exec.kv_tile, std::max<Index>(1, max_kv)) : 256;
  g.kv_split = exec.kv_split < 0 ? 0 : (exec.kv_split > 0 ? exec.kv_split : 512);
  g.threads = resolve_threads(exec.threads);
  g.kv_head_major = std::abs(in.k.stride(2)) > std::abs(in.k.stride(1));
  return g;
}

/// The pages of the engine's K/V views: one per sequence for contiguous and packed views, one
/// per block-table entry for paged views.
template <class TQ, class TKV>
KvPages<TKV> make_pages(const AttentionInputs<TQ, TKV>& in, const Geometry& g) {
  KvPages<TKV> pg;
  const Index n = static_cast<Index>(g.seqs.size());
  pg.first.resize(static_cast<size_t>(n));
  if (!in.block_table.absent()) {
    pg.page_size = in.k.size(1);
    for (Index b = 0; b < n; ++b) {
      pg.first[static_cast<size_t>(b)] = static_cast<Index>(pg.k.size());
      const Index blocks =
          (g.seqs[static_cast<size_t>(b)].kv_len + pg.page_size - 1) / pg.page_size;
      for (Index j = 0; j < blocks; ++j) {
        const Index id = in.block_table(b, j);
        pg.k.push_back(in.k.data() + id * in.k.stride(0));
        pg.v.push_back(in.v.data() + id * in.v.stride(0));
        if (g.rope_size > 0) pg.kr.push_back(in.k_rope.data() + id * in.k_rope.stride(0));
      }
    }
    return pg;
  }
  Index longest = 1;
  for (const ResolvedSeq& s : g.seqs) longest = std::max(longest, s.kv_len);
  pg.page_size = longest;
  for (Index b = 0; b < n; ++b) {
    const ResolvedSeq& s = g.seqs[static_cast<size_t>(b)];
    pg.first[static_cast<size_t>(b)] = b;
    // An empty view may have no data at all: its pages are never read.
    const bool none = in.k.data() == nullptr || in.v.data() == nullptr;
    pg.k.push_back(none ? nullptr
                        : in.k.data() + s.kv_batch * in.k.stride(0) + s.kv_off * in.k.stride(1));
    pg.v.push_back(none ? nullptr
                        : in.v.data() + s.kv_batch * in.v.stride(0) + s.kv_off * in.v.stride(1));
    if (g.rope_size > 0)
      pg.kr.push_back(none || in.k_rope.data() == nullptr
                          ? nullptr
                          : in.k_rope.data() + s.kv_batch * in.k_rope.stride(0) +
                                s.kv_off * in.k_rope.stride(1));
  }
  return pg;
}

}  // namespace detail

/// Checks inputs, params, outputs and execution config of attention() without computing
/// anything.
template <class TQ, class TKV, class TO, class TS>
void validate(const AttentionInputs<TQ, TKV>& in, const AttentionParams& params,
              const AttentionOutputs<TO, TS>& out, const ExecConfig& exec = {}) {
  (void)detail::resolve("attention", in, params, out, exec);
}

/// Attention with the built-in hooks (causal mode and the inputs' custom masks).
/// Acc = float (default) or double selects the compute type.
template <class Acc = float, class TQ, class TKV, class TO, class TS>
void attention(const AttentionInputs<TQ, TKV>& in, const AttentionParams& params,
               const AttentionOutputs<TO, TS>& out, const ExecConfig& exec = {}) {
  detail::check_types<Acc, TQ, TKV, TO, TS>();
  const detail::Geometry g = detail::resolve("attention", in, params, out, exec);
  DefaultVariant var;
  var.causal.mode = params.causal;
  var.causal.window = params.window;
  var.mask_add = in.mask_add;
  var.mask_bool = in.mask_bool;
  detail::run_attention<Acc>(in, params, out, var, g, detail::make_pages(in, g));
}

/// Attention with caller-supplied hooks (see attention/variant.hpp); operators map their
/// parameters onto the engine this way. The variant replaces the built-in hooks entirely, so the
/// inputs' custom masks and params.causal must be unset (the variant owns masking).
template <class Acc = float, class Variant, class TQ, class TKV, class TO, class TS>
void attention_with(const Variant& variant, const AttentionInputs<TQ, TKV>& in,
                    const AttentionParams& params, const AttentionOutputs<TO, TS>& out,
                    const ExecConfig& exec = {}) {
  detail::check_types<Acc, TQ, TKV, TO, TS>();
  const detail::Geometry g = detail::resolve("attention_with", in, params, out, exec);
  ATTNREF_CHECK(in.mask_add.absent() && in.mask_bool.absent(), std::invalid_argument,
                "attention_with", "inputs.mask_add/mask_bool", "given with a custom variant",
                "absent (the variant owns masking)", "present");
  ATTNREF_CHECK(params.causal == CausalMode::None, std::invalid_argument, "attention_with",
                "params.causal", "set with a custom variant", "CausalMode::None", "a causal mode");
  detail::run_attention<Acc>(in, params, out, variant, g, detail::make_pages(in, g));
}

namespace detail {

/// attention_with() over caller-built pages (e.g. one cache tensor per sequence, ATB's kv
/// tensorlist). `in.k` / `in.v` give the shape and the token / head / element strides of every
/// page; the pages' memory is the caller's to validate.
template <class Acc = float, class Variant, class TQ, class TKV, class TO, class TS>
void attention_with_pages(const Variant& variant, const AttentionInputs<TQ, TKV>& in,
                          const AttentionParams& params, const AttentionOutputs<TO, TS>& out,
                          const KvPages<TKV>& pages, const ExecConfig& exec = {}) {
  check_types<Acc, TQ, TKV, TO, TS>();
  const Geometry g = resolve("attention_with", in, params, out, exec, /*kv_template=*/true);
  ATTNREF_CHECK(static_cast<Index>(pages.first.size()) == g.batch, std::invalid_argument,
                "attention_with", "pages.first", "size mismatch", g.batch, pages.first.size());
  ATTNREF_CHECK(g.rope_size == 0 || pages.kr.size() == pages.k.size(), std::invalid_argument,
                "attention_with", "pages.kr", "size mismatch (split scores)", pages.k.size(),
                pages.kr.size());
  run_attention<Acc>(in, params, out, variant, g, pages);
}

}  // namespace detail

}  // namespace attnref
