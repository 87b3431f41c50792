#pragma once
/// The engine's work decomposition: sequences resolved against their views, where their keys
/// and values live (the K/V source: one page per contiguous sequence, one per block of a paged
/// cache or per tensor of a list), and the work items (sequence, kv heads, q tile, kv split),
/// which never depend on the thread count.

#include <algorithm>
#include <vector>

#include "attnref/core/types.hpp"

namespace attnref::detail {

/// A sequence resolved against its views: where its tokens start and how many there are.
struct ResolvedSeq {
  Index q_batch, q_off, q_len;  // view batch index, first token, length
  Index kv_batch, kv_off, kv_len;
};

/// Problem sizes after validation.
struct Geometry {
  /// head_size: the width of a score's dot product (split scores: D + R, the q / k heads' D
  /// followed by the rope part's R).
  Index batch = 0, num_heads = 0, num_kv_heads = 0, group = 1, head_size = 0, v_head_size = 0;
  Index rope_size = 0;  ///< R of split scores (q_rope / k_rope), else 0
  Index q_tile = 0, kv_tile = 0, kv_split = 0;
  bool kv_head_major = false;  ///< K's head stride exceeds its token stride ([B, N, S, D] caches)
  int threads = 1;             ///< workers (resolved: >= 1)
  std::vector<ResolvedSeq> seqs;
};

/// Where the keys and values of every sequence live: pages of `page_size` consecutive tokens
/// (token stride, head stride and element stride are those of the engine's k / v views).
/// Contiguous views have one page per sequence; block tables (paged KV caches) and per-sequence
/// cache tensors (ATB kv tensorlist) have one page per block / tensor.
template <class TKV>
struct KvPages {
  std::vector<const TKV*> k, v;  // page starts (token 0, head 0, element 0)
  std::vector<const TKV*> kr;    // split scores: the k_rope page of each k page (else empty)
  std::vector<Index> first;      // per sequence: index of its first page in k / v
  Index page_size = 1;           // tokens per page
};

/// Row blocks up to this height per kv head (decode: one query per head of the group) take the
/// small-row kernels, which stream K/V rows token by token across the heads of an item.
inline constexpr Index kSmallRows = 8;

/// One unit of work: kv heads [head_begin, head_end) of one sequence, one q tile, one kv range.
/// Sequences with a single q tile of at most kSmallRows rows per kv head (decode) over a
/// token-major cache put all kv heads in one item, so each K/V row is read head after head from
/// the same pages; others use one head per item (a head-major cache: each item then streams one
/// head's keys and values, contiguous runs). Taller row blocks work head by head anyway, and
/// one item per head lets the workers share a sequence (nsa/compress_attention/B:1 on two
/// threads: 1.58 -> 0.84 ms, AMD Zen 5). With up to kGroupRows rows per kv head (NSA's
/// branches: 16 query heads per kv head) and at least kSeqsPerWorker sequences per worker, the
/// heads share an item again: the workers then read different pages instead of the same ones
/// (nsa/compress_attention/B:20/cmpKV:4096 on two threads 19.1 -> 16.7 ms, one thread within
/// the noise). Which heads share an item never changes a row's arithmetic.
struct WorkItem {
  Index seq, head_begin, head_end, q_begin, q_end, kv_begin, kv_end;
  Index partial;  // -1: single split, finalise directly; else index of its partial slot
};

/// The resolved problem: views, hooks and geometry.

/// Rows per kv head up to which the heads of a sequence share an item when there are at least
/// kSeqsPerWorker sequences per worker (WorkItem).
inline constexpr Index kGroupRows = 16;
inline constexpr Index kSeqsPerWorker = 4;

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
  Index live = 0;  // sequences with queries
  for (const ResolvedSeq& s : g.seqs) live += s.q_len > 0 ? 1 : 0;
  const Index group_rows = live >= kSeqsPerWorker * g.threads ? kGroupRows : kSmallRows;
  for (Index b = 0; b < static_cast<Index>(g.seqs.size()); ++b) {
    const ResolvedSeq& s = g.seqs[static_cast<size_t>(b)];
    if (s.q_len == 0) continue;
    const Index n_qt = (s.q_len + g.q_tile - 1) / g.q_tile;
    const bool together = n_qt == 1 && !g.kv_head_major && g.group * s.q_len <= group_rows;
    const Index heads = together ? g.num_kv_heads : 1;
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

}  // namespace attnref::detail
