#pragma once
/// The sequence geometry shared by the DeepSeek sparse attention operators (lightning_indexer,
/// sparse_flash_attention): the query in BSND [B, S1, N1, D] or TND [T1, N1, D] with its
/// per-batch (BSND) or cumulative (TND) lengths, and the key side in BSND [B, S2, N2, D], TND
/// [T2, N2, D] (cumulative lengths) or PA_BSND [blockNum, blockSize, N2, D] through a block table
/// (per-batch lengths). Not part of the API.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/attention/paged_kv.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref::detail {

enum class DsaKv { BSND, TND, PA_BSND };

/// Where every batch's query rows and keys are.
struct DsaSeqs {
  bool q_tnd = false;
  DsaKv kv = DsaKv::BSND;
  Index B = 0, S1 = 0, rows = 0;       // S1: BSND's padded rows (0 with TND); rows: B·S1 or T1
  Index N1 = 0, N2 = 0, D = 0;         // query heads, key heads, head size
  std::vector<Index> q_len, q_row0;    // per batch: live rows, first row (in the query's rows)
  std::vector<Index> kv_len, kv_tok0;  // per batch: keys, first token row (BSND / TND)
  StridedView<const std::int32_t, 2> block_table{};
  Index block_size = 0;  // PA_BSND

  /// Token pos of batch b as a row of the key tensor flattened over its leading dimensions
  /// (the block table validated before).
  Index token(Index b, Index pos) const {
    if (kv != DsaKv::PA_BSND) return kv_tok0[static_cast<size_t>(b)] + pos;
    return Index{block_table(b, pos / block_size)} * block_size + pos % block_size;
  }
  /// The batch of every query row (padded BSND rows included).
  std::vector<Index> batch_of_rows() const {
    std::vector<Index> of(static_cast<size_t>(rows), 0);
    for (Index b = 0; b < B; ++b) {
      const Index n = q_tnd ? q_len[static_cast<size_t>(b)] : S1;
      for (Index i = 0; i < n; ++i) of[static_cast<size_t>(q_row0[static_cast<size_t>(b)] + i)] = b;
    }
    return of;
  }
  /// The keys query row i of batch b may see: [0, limit) (sparse_mode 3: rightDownCausal, the
  /// last live row sees every key; sparse_mode 0: every key). 0 for padded rows.
  Index limit(Index b, Index i, bool causal) const {
    const Index q = q_len[static_cast<size_t>(b)], s = kv_len[static_cast<size_t>(b)];
    if (i >= q) return 0;
    if (!causal) return s;
    const Index l = s - q + i + 1;
    return l < 0 ? 0 : l;
  }
};

/// Lengths: per batch in [0, cap] (BSND) or cumulative non-decreasing ending at `total` (TND).
inline std::vector<Index> dsa_lengths(const char* fn, const char* arg,
                                      const std::vector<std::int64_t>& v, bool cumulative,
                                      Index cap, Index total, std::vector<Index>* first) {
  std::vector<Index> len(v.size());
  Index prev = 0;
  for (size_t b = 0; b < v.size(); ++b) {
    const std::string a = std::string(arg) + "[" + std::to_string(b) + "]";
    if (cumulative) {
      ATTNREF_CHECK(v[b] >= prev && v[b] <= total, std::invalid_argument, fn, a,
                    "out of range (cumulative lengths)",
                    "[" + std::to_string(prev) + ", " + std::to_string(total) + "]",
                    std::to_string(v[b]));
      len[b] = static_cast<Index>(v[b]) - prev;
      if (first) first->push_back(prev);
      prev = static_cast<Index>(v[b]);
    } else {
      ATTNREF_CHECK(v[b] >= 0 && v[b] <= cap, std::invalid_argument, fn, a, "out of range",
                    "[0, " + std::to_string(cap) + "]", std::to_string(v[b]));
      len[b] = static_cast<Index>(v[b]);
    }
  }
  if (cumulative)
    ATTNREF_CHECK(prev == total, std::invalid_argument, fn, arg, "last value differs from T",
                  std::to_string(total), std::to_string(prev));
  return len;
}

/// The query ([B, S1, N1, D] or [T1, N1, D]) and its lengths (TND: required, cumulative; BSND:
/// optional, per batch, S1 each by default).
template <class T>
void dsa_query(const char* fn, const std::string& layout, const StridedView<const T>& q,
               const std::vector<std::int64_t>& lens, const char* lens_arg, DsaSeqs& s) {
  ATTNREF_CHECK(layout == "BSND" || layout == "TND", std::invalid_argument, fn,
                "params.layout_query", "not supported", "BSND or TND", layout);
  s.q_tnd = layout == "TND";
  const int rank = s.q_tnd ? 3 : 4;
  ATTNREF_CHECK(!q.absent() && q.rank() == rank && q.size(rank - 2) > 0 && q.size(rank - 1) > 0,
                std::invalid_argument, fn, "query.shape", "mismatch",
                s.q_tnd ? "[T1, N1, D]" : "[B, S1, N1, D]", shape_str(q));
  s.N1 = q.size(rank - 2), s.D = q.size(rank - 1);
  if (s.q_tnd) {
    ATTNREF_CHECK(!lens.empty(), std::invalid_argument, fn, lens_arg,
                  "required with TND (cumulative query lengths)", "B values", "none");
    s.B = static_cast<Index>(lens.size()), s.rows = q.size(0), s.S1 = 0;
    s.q_row0.clear();
    s.q_len = dsa_lengths(fn, lens_arg, lens, true, 0, s.rows, &s.q_row0);
    return;
  }
  s.B = q.size(0), s.S1 = q.size(1);
  s.rows = checked_mul(fn, "query.shape[0] * shape[1]", s.B, s.S1);
  ATTNREF_CHECK(s.B > 0, std::invalid_argument, fn, "query.shape[0]", "empty batch", ">= 1",
                shape_str(q));
  ATTNREF_CHECK(lens.empty() || static_cast<Index>(lens.size()) == s.B, std::invalid_argument, fn,
                lens_arg, "one per batch", std::to_string(s.B), std::to_string(lens.size()));
  s.q_len = lens.empty() ? std::vector<Index>(static_cast<size_t>(s.B), s.S1)
                         : dsa_lengths(fn, lens_arg, lens, false, s.S1, 0, nullptr);
  s.q_row0.resize(static_cast<size_t>(s.B));
  for (Index b = 0; b < s.B; ++b) s.q_row0[static_cast<size_t>(b)] = b * s.S1;
}

/// The key ([B, S2, N2, D], [T2, N2, D] or [blockNum, blockSize, N2, D] with block_table
/// [B, maxBlocks]) and its lengths (TND: cumulative; PA_BSND: per batch; both required; BSND:
/// optional, S2 each by default). Every block-table entry a batch uses must lie in
/// [0, blockNum) (std::out_of_range).
template <class T>
void dsa_keys(const char* fn, const std::string& layout, const char* layout_arg,
              const char* key_arg, const StridedView<const T>& k,
              const StridedView<const std::int32_t>& bt, const std::vector<std::int64_t>& lens,
              const char* lens_arg, DsaSeqs& s) {
  ATTNREF_CHECK(layout == "BSND" || layout == "TND" || layout == "PA_BSND", std::invalid_argument,
                fn, layout_arg, "not supported", "BSND, TND or PA_BSND", layout);
  s.kv = layout == "TND" ? DsaKv::TND : layout == "PA_BSND" ? DsaKv::PA_BSND : DsaKv::BSND;
  const int rank = s.kv == DsaKv::TND ? 3 : 4;
  const std::string karg = std::string(key_arg) + ".shape";
  ATTNREF_CHECK(!k.absent() && k.rank() == rank && k.size(rank - 2) > 0 && k.size(rank - 1) > 0,
                std::invalid_argument, fn, karg, "mismatch",
                s.kv == DsaKv::TND       ? "[T2, N2, D]"
                : s.kv == DsaKv::PA_BSND ? "[blockNum, blockSize, N2, D]"
                                         : "[B, S2, N2, D]",
                shape_str(k));
  s.N2 = k.size(rank - 2);
  const bool paged = s.kv == DsaKv::PA_BSND;
  ATTNREF_CHECK(paged != bt.absent(), std::invalid_argument, fn, "block_table",
                paged ? "required with PA_BSND" : "only with PA_BSND",
                paged ? "[B, maxBlocks]" : "none", shape_str(bt));
  if (s.kv != DsaKv::BSND)
    ATTNREF_CHECK(!lens.empty(), std::invalid_argument, fn, lens_arg,
                  "required with " + layout + " keys", "B values", "none");
  ATTNREF_CHECK(lens.empty() || static_cast<Index>(lens.size()) == s.B, std::invalid_argument, fn,
                lens_arg, "one per batch", std::to_string(s.B), std::to_string(lens.size()));
  s.kv_tok0.clear();
  if (s.kv == DsaKv::TND) {
    s.kv_len = dsa_lengths(fn, lens_arg, lens, true, 0, k.size(0), &s.kv_tok0);
    return;
  }
  if (s.kv == DsaKv::BSND) {
    ATTNREF_CHECK(k.size(0) == s.B, std::invalid_argument, fn, karg + "[0]",
                  "differs from the query's batch", std::to_string(s.B), shape_str(k));
    const Index S2 = k.size(1);
    s.kv_len = lens.empty() ? std::vector<Index>(static_cast<size_t>(s.B), S2)
                            : dsa_lengths(fn, lens_arg, lens, false, S2, 0, nullptr);
    for (Index b = 0; b < s.B; ++b) s.kv_tok0.push_back(b * S2);
    return;
  }
  ATTNREF_CHECK(bt.rank() == 2 && bt.size(0) == s.B && bt.size(1) > 0, std::invalid_argument, fn,
                "block_table.shape", "mismatch", "[" + std::to_string(s.B) + ", maxBlocks]",
                shape_str(bt));
  s.block_size = k.size(1);
  s.block_table = StridedView<const std::int32_t, 2>(bt.data(), {bt.size(0), bt.size(1)});
  const Index cap = checked_mul(fn, "block_table.shape[1] * blockSize", bt.size(1), k.size(1));
  s.kv_len = dsa_lengths(fn, lens_arg, lens, false, cap, 0, nullptr);
  // Every entry a batch uses: the one block-table check (PagedKvCache::validate).
  const StridedView<const T, 4> pool(k.data(), {k.size(0), k.size(1), k.size(2), k.size(3)});
  PagedKvCache<const T>{pool, pool, s.block_table, s.kv_len}.validate(
      fn, {key_arg, key_arg, "block_table", lens_arg, "key.shape[1] (blockSize)", "blockSize"});
}

/// A tensor laid out like the key ([.., N2, width] with the key's leading dimensions).
template <class T>
void dsa_like_key(const char* fn, const char* arg, const StridedView<const T>& t,
                  const StridedView<const T>& key, Index width) {
  Dims want = key.shape();
  want[want.size() - 1] = width;
  std::string w = "[";
  for (int i = 0; i < want.size(); ++i) w += (i ? ", " : "") + std::to_string(want[i]);
  ATTNREF_CHECK(!t.absent() && t.shape() == want, std::invalid_argument, fn,
                std::string(arg) + ".shape", "mismatch with the key", w + "]", shape_str(t));
}

}  // namespace attnref::detail
