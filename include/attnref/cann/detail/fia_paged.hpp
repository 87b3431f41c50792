#pragma once
/// FusedInferAttentionScore's paged K/V with Q_S > 1 (the prompt branch; block_table): the
/// vendor's checks, the engine's paged views, and the stand-ins the PromptFlashAttention plan
/// reads its key / value dims from. Not part of the API.
///
/// The rules (the vendor's PFA tiling, which the documents state only in part):
///   cache  [blockNum, blockSize, KV_N·D]; with a BNSD, BNSD_BSND or TND query also
///          [blockNum, KV_N, blockSize, D]; value the key's shape (TND: its own head size)
///   blocks a multiple of 128 in [128, 1024], params.block_size the cache's
///   lengths actual_seq_lengths_kv required, one per batch (non-TND: one value broadcasts) and
///          per batch even with TND (not cumulative: the tiling skips its cumulative checks and
///          the kernel its differencing when the cache is paged), each in [0, maxBlocks·blockSize]
///   S2     the mask's and pse's key extent: ceil(max kv length / blockSize)·blockSize
///   TND    sparse_mode 0 (no mask), 3 or 4
///   not    an int8 query, kv left padding, a shared prefix, tensor lists
///   int8 K / V (a floating query) take the rules of fia_prompt_aq.hpp's paged form
/// Every used block-table entry is checked (std::out_of_range), which the vendor does not do.

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/paged_kv.hpp"
#include "attnref/cann/detail/common.hpp"
#include "attnref/cann/detail/layouts.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref::detail {

/// A paged call of the prompt branch: the engine's cache, the plan's stand-ins (the logical
/// [B, S2, KV_N, D] in the query's layout; TND: [ΣL, KV_N, D]; zero strides over the cache,
/// never read) and the kv lengths as the plan reads them (TND: cumulative).
template <class T>
struct FiaPaged {
  PagedKvCache<const T> cache;
  StridedView<const T> key, value;
  std::vector<std::int64_t> kv_list;
};

/// The engine's [blockNum, blockSize, KV_N, D] view of a paged cache tensor (rank 4 only with
/// `four`), checked; d: the head size it must have (0: any; set to what it has).
template <class T>
StridedView<const T, 4> fia_paged_view(const char* fn, const char* arg,
                                       const StridedView<const T>& c, bool four, Index kvn,
                                       Index& d) {
  const bool ok = !c.absent() && (c.rank() == 3 || (four && c.rank() == 4)) &&
                  (c.rank() == 3 ? c.size(2) % kvn == 0 : c.size(1) == kvn);
  ATTNREF_CHECK(ok, std::invalid_argument, fn, std::string(arg) + ".shape",
                "not a paged cache for the layout",
                four ? "[blockNum, blockSize, KV_N * D] or [blockNum, KV_N, blockSize, D]"
                     : "[blockNum, blockSize, KV_N * D]",
                shape_str(c));
  const Index nb = c.size(0), bs = c.rank() == 3 ? c.size(1) : c.size(2);
  const Index w = c.rank() == 3 ? c.size(2) / kvn : c.size(3);
  ATTNREF_CHECK(d == 0 || w == d, std::invalid_argument, fn, std::string(arg) + ".shape",
                "head size differs from the query's", std::to_string(d), shape_str(c));
  d = w;
  if (c.rank() == 3)
    return StridedView<const T, 4>(c.data(), {nb, bs, kvn, w}, {bs * kvn * w, kvn * w, w, 1});
  return StridedView<const T, 4>(c.data(), {nb, bs, kvn, w}, {kvn * bs * w, w, bs * w, 1});
}

/// Checks a paged call of the prompt branch and fills `f` (T: the cache's type, the query's or
/// int8); false without block_table.
template <class P, class In, class T>
bool fia_paged(const char* fn, const P& p, const In& in, Layout layout, FiaPaged<T>& f) {
  using L = Layout;
  using TQ = std::remove_const_t<typename decltype(in.query)::element_type>;
  if (in.block_table.absent()) return false;
  const bool tnd = layout == L::TND;
  ATTNREF_CHECK(!(std::is_same_v<TQ, std::int8_t>), std::invalid_argument, fn, "block_table",
                "given with an int8 query (the vendor's paged prompt branch has none)",
                "a floating query", "int8");
  ATTNREF_CHECK(in.key.size() == 1 && in.value.size() == 1, std::invalid_argument, fn,
                "key / value", "a paged cache is one tensor each", "one tensor each",
                std::to_string(in.key.size()) + " and " + std::to_string(in.value.size()));
  const Index n = static_cast<Index>(p.num_heads);
  const Index kvn = p.num_key_value_heads == 0 ? n : static_cast<Index>(p.num_key_value_heads);
  const auto qd = pfa_dims(fn, "query", in.query, layout, n);
  const bool four = layout == L::BNSD || layout == L::BNSD_BSND || tnd;
  Index dk = qd[3], dv = tnd ? 0 : qd[3];
  f.cache.k = fia_paged_view(fn, "key[0]", in.key[0], four, kvn, dk);
  f.cache.v = fia_paged_view(fn, "value[0]", in.value[0], four, kvn, dv);
  ATTNREF_CHECK(f.cache.v.size(0) == f.cache.k.size(0) && f.cache.v.size(1) == f.cache.k.size(1) &&
                    in.value[0].rank() == in.key[0].rank(),
                std::invalid_argument, fn, "value[0].shape", "blocks differ from the key's",
                shape_str(in.key[0]), shape_str(in.value[0]));
  const Index bs = f.cache.k.size(1);
  ATTNREF_CHECK(p.block_size == bs, std::invalid_argument, fn, "params.block_size",
                "differs from the cache's block size", std::to_string(bs),
                std::to_string(p.block_size));
  ATTNREF_CHECK(bs >= 128 && bs <= 1024 && bs % 128 == 0, std::invalid_argument, fn,
                "params.block_size", "not supported with Q_S > 1",
                "a multiple of 128 in [128, 1024]", std::to_string(bs));
  const Index B = tnd ? static_cast<Index>(in.actual_seq_lengths.size()) : qd[0];
  const auto& bt = in.block_table;
  ATTNREF_CHECK(bt.rank() == 2 && bt.size(0) == B, std::invalid_argument, fn, "block_table.shape",
                "mismatch", "[" + std::to_string(B) + ", maxBlocksPerSeq]", shape_str(bt));
  f.cache.block_table = StridedView<const std::int32_t, 2>(bt.data(), {B, bt.size(1)});
  const auto& kl = in.actual_seq_lengths_kv;
  ATTNREF_CHECK(!kl.empty(), std::invalid_argument, fn, "actual_seq_lengths_kv",
                "required with a paged cache", "kv lengths", "none");
  ATTNREF_CHECK(!tnd || static_cast<Index>(kl.size()) == B, std::invalid_argument, fn,
                "actual_seq_lengths_kv", "one length per batch with TND and a paged cache",
                std::to_string(B) + " values", std::to_string(kl.size()) + " values");
  const Index cols = checked_mul(fn, "block_table.shape[1] * blockSize", bt.size(1), bs);
  f.cache.context_lens = cann_lengths(fn, "actual_seq_lengths_kv", kl, B, cols);
  f.cache.validate(fn, {"key[0]", "value[0]", "block_table", "actual_seq_lengths_kv",
                        "params.block_size", "blockSize"});
  if (tnd) {
    ATTNREF_CHECK(p.sparse_mode == 0 || p.sparse_mode == 3 || p.sparse_mode == 4,
                  std::invalid_argument, fn, "params.sparse_mode",
                  "not supported with TND and a paged cache", "0, 3 or 4",
                  std::to_string(p.sparse_mode));
    ATTNREF_CHECK(p.sparse_mode != 0 || in.atten_mask.absent(), std::invalid_argument, fn,
                  "atten_mask", "given with sparse_mode 0, TND and a paged cache", "none",
                  shape_str(in.atten_mask));
  }
  // The stand-ins: S2 = the longest sequence's blocks (TND: the keys' total, cumulative lengths).
  Index longest = 0, total = 0;
  for (Index l : f.cache.context_lens) longest = std::max(longest, l), total += l;
  const Index S2 = (longest + bs - 1) / bs * bs;
  f.kv_list.clear();
  if (tnd)
    for (Index b = 0, cu = 0; b < B; ++b)
      f.kv_list.push_back(cu += f.cache.context_lens[static_cast<size_t>(b)]);
  else
    f.kv_list.assign(kl.begin(), kl.end());
  const Layout klay = layout == L::BNSD_BSND ? L::BNSD : layout;  // (the keys' own layout)
  const std::vector<Index> ks = pfa_shape(klay, {qd[0], tnd ? total : S2, kvn, dk});
  const std::vector<Index> vs = pfa_shape(klay, {qd[0], tnd ? total : S2, kvn, dv});
  f.key = StridedView<const T>(in.key[0].data(), ks, std::vector<Index>(ks.size(), 0));
  f.value = StridedView<const T>(in.value[0].data(), vs, std::vector<Index>(vs.size(), 0));
  return true;
}

}  // namespace attnref::detail
