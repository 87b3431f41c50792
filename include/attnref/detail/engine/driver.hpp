#pragma once
/// The engine's driver: one work item from its Q rows through the kv tiles (products, hooks,
/// online softmax) to its output rows, the debug probabilities, and run_attention, which builds
/// the items, runs them on the workers and merges the split-KV partials in split order.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "attnref/core/error.hpp"
#include "attnref/core/softmax.hpp"
#include "attnref/detail/engine/p_stage.hpp"
#include "attnref/detail/engine/products.hpp"
#include "attnref/detail/engine/state.hpp"
#include "attnref/detail/engine/work.hpp"
#include "attnref/detail/threading.hpp"

namespace attnref::detail {

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::run_item(Workspace& ws, const WorkItem& it) const {
  const ResolvedSeq& s = g.seqs[static_cast<size_t>(it.seq)];
  const SeqInfo si{it.seq, s.q_len, s.kv_len};
  const Index nq = it.q_end - it.q_begin;
  const Index rows = g.group * nq;
  const Index all_rows = rows * (it.head_end - it.head_begin);
  std::fill(ws.st.begin(), ws.st.begin() + all_rows, SoftmaxState<Acc>{});
  std::fill(ws.o.begin(), ws.o.begin() + all_rows * g.v_head_size, Acc(0));
  if (kQuantP) std::fill(ws.aux.begin(), ws.aux.begin() + all_rows, Acc(0));
  if (it.kv_end <= it.kv_begin) return;
  // (the int8 kernels read the rows as u8 from ws.q8; only the small-row kernels need floats)
  const bool q8_only = kI8 && i8() && !small(rows);
  if (!q8_only)
    for (Index h = it.head_begin; h < it.head_end; ++h)
      load_q(head(ws, it, h), si, s, it.q_begin, nq);
  if constexpr (kI8) {
    if (i8()) {  // q + 128 as u8 (the sign bit flipped), the item's rows in head order
      std::uint8_t* q8 = ws.q8.data();
      const Index n = g.head_size;
      for (Index h = it.head_begin; h < it.head_end; ++h)
        for (Index gi = 0; gi < g.group; ++gi)
          for (Index t = 0; t < nq; ++t, q8 += n) {
            const TQ* src = in.q.ptr(s.q_batch, s.q_off + it.q_begin + t, h * g.group + gi, 0);
            for (Index e = 0; e < n; ++e)
              q8[e] = static_cast<std::uint8_t>(static_cast<std::uint8_t>(src[e]) ^ 0x80u);
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
  for_each_tile(ws, it, si, kTwoPass, [&](Index j0, Index cols, TileMask tm) {
    const bool partial = tm == TileMask::Partial;
    if (!kTwoPass && panel(rows)) {  // both products and the P stage, row block by row block
      for (Index h = it.head_begin; h < it.head_end; ++h) panel_tile(ws, it, si, h, j0, cols, tm);
      return;
    }
    for (Index h0 = it.head_begin; h0 < it.head_end; h0 += step) {
      const Index h1 = h0 + step;
      raw_scores(ws, it, h0, h1, rows, cols);
      for (Index h = h0; h < h1; ++h) {
        const Head hd = head(ws, it, h);
        apply_hooks(hd, si, it.q_begin, nq, j0, cols, tm, 0, rows);
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
        softmax_update(hd, si, 0, rows, cols, partial, it.q_begin, nq, j0);
      }
      if constexpr (!kTwoPass) accumulate_pv(ws, it, h0, h1, rows, cols, partial);
    }
  });
  if constexpr (kTwoPass) normalised_pass(ws, it);
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::finalize(const WorkItem& it,
                                                     const SoftmaxState<Acc>* st, Acc* o) const {
  const ResolvedSeq& s = g.seqs[static_cast<size_t>(it.seq)];
  const SeqInfo si{it.seq, s.q_len, s.kv_len};
  const Index nq = it.q_end - it.q_begin, dv = g.v_head_size;
  const bool hooked = kQuantO || o_transformed();
  Index r = 0;
  for (Index hkv = it.head_begin; hkv < it.head_end; ++hkv)
    for (Index gi = 0; gi < g.group; ++gi) {
      const Index h = hkv * g.group + gi;
      for (Index t = 0; t < nq; ++t, ++r) {
        const Index i = it.q_begin + t;
        // (two-pass rows leave normalised; an undefined row still gets its NaN)
        Acc mul = kTwoPass && !st[r].undefined() ? Acc(1) : st[r].inv_l();
        if constexpr (kSink)
          if (sunk() && st[r].l != Acc(0) && !st[r].undefined()) {  // l + exp(sink - m)
            const Acc e = std::exp(static_cast<Acc>(var.sink(h)) - st[r].m);
            mul = (kTwoPass ? st[r].l : Acc(1)) / (st[r].l + e);
          }
        Acc* row = o + r * dv;
        TO* dst = out.o.ptr(s.q_batch, s.q_off + i, h, 0);
        if (!hooked) {
          store_row<TO>(row, mul, dv, dst, out.o.stride(3));
        } else {  // the output hooks see the normalised row
          for (Index e = 0; e < dv; ++e) row[e] *= mul;
          if constexpr (kOTransform)
            if (o_transformed()) var.template o_transform<Acc>(si, i, h, row, dv);
          if constexpr (kQuantO) {
            for (Index e = 0; e < dv; ++e)
              dst[e * out.o.stride(3)] = var.template quantize_o<Acc>(si, h, e, row[e]);
          } else {
            store_row<TO>(row, Acc(1), dv, dst, out.o.stride(3));
          }
        }
        if (!out.lse.absent()) out.lse(s.q_batch, h, s.q_off + i) = static_cast<TS>(st[r].lse());
      }
    }
}

template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void Engine<Acc, TQ, TKV, TO, TS, Variant>::write_probs(Workspace& ws, const WorkItem& it) const {
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
    for_each_tile(ws, it, si, false, [&](Index j0, Index cols, TileMask tm) {
      raw_scores(ws, it, hkv, hkv + 1, rows, cols);
      apply_hooks(hd, si, it.q_begin, nq, j0, cols, tm, 0, rows);
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
    });
  }
}

/// Runs the engine on validated inputs.
template <class Acc, class TQ, class TKV, class TO, class TS, class Variant>
void run_attention(const AttentionInputs<TQ, TKV>& in, const AttentionParams& p,
                   const AttentionOutputs<TO, TS>& out, const Variant& var, const Geometry& g,
                   const KvPages<TKV>& pages) {
  using E = Engine<Acc, TQ, TKV, TO, TS, Variant>;
  const int threads = g.threads;
  const bool want_probs = !out.probs.absent();
  Index num_partials = 0, max_rows = 1, split_rows = 0;
  std::vector<WorkItem> items =
      make_items(g, num_partials, /*allow_split=*/!want_probs && !E::kQuantP && !E::kTwoPass,
                 max_rows, split_rows);
  const E eng{in, out, var, g, pages, static_cast<Acc>(p.scale), max_rows, simd::level()};
  ATTNREF_CHECK(!(eng.split() && eng.dequant()), std::invalid_argument, "attention_with", "k_rope",
                "split scores with the kv_dequant hook (not supported)", "no kv_dequant hook",
                "a kv_dequant hook");

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
