#pragma once
/// A paged KV cache (ATB PagedAttention / vLLM / FlashInfer) as a value type of views, and the
/// converters between ATB's padded block table and the CSR form.
///
///   k            [numBlocks, blockSize, kvHeadNum, headSize]
///   v            [numBlocks, blockSize, kvHeadNum, headSizeV]
///   block_table  [batch (or numTokens), maxBlocksPerSeq] int32: token t of sequence b is row
///                t % blockSize of block block_table[b][t / blockSize]
///   context_lens [batch]: the tokens of each sequence
/// Entries past a sequence's last used block are never read (ATB pads with anything; -1 by
/// convention). CSR (FlashInfer's paged_kv_indptr / indices / last_page_len, vLLM's block lists):
/// sequence b owns indices[indptr[b] .. indptr[b + 1]) and its last page holds last_page_len[b]
/// tokens (1..blockSize; 0 only for a sequence without pages), so its length is
/// (pages − 1)·blockSize + last_page_len.

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

/// What a paged cache's pieces are called by its caller, for messages: PagedAttention says
/// "key_cache" and "block_tables", the engine "k" and "seq.kv", NSA "actual_cmp_kv_seq_len".
struct PagedNames {
  const char* k = "k";                                ///< the key pool
  const char* v = "v";                                ///< the value pool
  const char* table = "block_table";                  ///< the block table
  const char* lens = "context_lens";                  ///< the per-sequence lengths
  const char* block_size = "k.shape[1] (blockSize)";  ///< the block size's argument
  const char* bs_word = "blockSize";                  ///< the block size in a product
};

/// Where token t of a sequence lives.
struct PagedSlot {
  Index block;
  Index offset;
};

/// The one paged K/V representation: the engine (AttentionInputs::read_kv), SelfAttention
/// PREFIX_ENCODER, PagedAttention, IFA, MLA decode and the NSA operators each map their vendor
/// tensors onto it and validate it with validate(), the only block-table check in attnref.
template <class T>
struct PagedKvCache {
  StridedView<T, 4> k;
  StridedView<T, 4> v;
  StridedView<const std::int32_t, 2> block_table;
  std::vector<Index> context_lens;

  Index batch() const { return static_cast<Index>(context_lens.size()); }
  Index num_blocks() const { return k.size(0); }
  Index block_size() const { return k.size(1); }
  Index length(Index b) const { return context_lens[static_cast<size_t>(b)]; }
  /// Blocks sequence b uses: ceil(length / blockSize) (written so that it cannot overflow).
  Index blocks_used(Index b) const {
    return length(b) / block_size() + (length(b) % block_size() != 0 ? 1 : 0);
  }

  /// Token t of sequence b -> (block, offset); throws std::out_of_range for t outside
  /// [0, length(b)) or a block id outside [0, numBlocks).
  PagedSlot locate(Index b, Index t) const {
    constexpr const char* fn = "PagedKvCache::locate";
    ATTNREF_CHECK(b >= 0 && b < batch(), std::out_of_range, fn, "b", "out of range",
                  "[0, " + std::to_string(batch()) + ")", b);
    ATTNREF_CHECK(t >= 0 && t < length(b), std::out_of_range, fn, "t", "out of range",
                  "[0, " + std::to_string(length(b)) + ")", t);
    const Index j = t / block_size();
    const Index id = block_table(b, j);
    ATTNREF_CHECK(id >= 0 && id < num_blocks(), std::out_of_range, fn,
                  "block_table[" + std::to_string(b) + "][" + std::to_string(j) + "]",
                  "out of range", "[0, " + std::to_string(num_blocks()) + ")", id);
    return {id, t % block_size()};
  }

  /// The views (extents, spans, data), v's pool matching k's, a positive block size, a table
  /// [batch, maxBlocks] with one row per length, each length in [0, maxBlocks · blockSize]
  /// (checked product), and every entry a sequence uses (the first ceil(len / blockSize)) a block
  /// id in [0, numBlocks), else std::out_of_range. Entries past them are never read (ATB pads
  /// with anything, -1 by convention). `fn` and `names` name the caller and its arguments.
  void validate(const char* fn = "PagedKvCache::validate", const PagedNames& names = {}) const {
    const std::string t = names.table;
    detail::check_view(fn, names.k, k);
    detail::check_view(fn, names.v, v);
    detail::check_view(fn, names.table, block_table);
    ATTNREF_CHECK(v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2),
                  std::invalid_argument, fn, std::string(names.v) + ".shape",
                  std::string("mismatch with ") + names.k,
                  "[" + std::to_string(k.size(0)) + ", " + std::to_string(k.size(1)) + ", " +
                      std::to_string(k.size(2)) + ", headSizeV]",
                  detail::shape_str(v));
    ATTNREF_CHECK(block_size() > 0, std::invalid_argument, fn, names.block_size, "not positive",
                  ">= 1", block_size());
    ATTNREF_CHECK(block_table.size(0) == batch(), std::invalid_argument, fn, t + ".shape[0]",
                  std::string("mismatch with ") + names.lens, batch(), block_table.size(0));
    const std::string product = t + ".shape[1] * " + names.bs_word;
    const Index capacity =
        detail::checked_mul(fn, product.c_str(), block_table.size(1), block_size());
    for (Index b = 0; b < batch(); ++b) {
      const std::string arg = std::string(names.lens) + "[" + std::to_string(b) + "]";
      ATTNREF_CHECK(length(b) >= 0, std::invalid_argument, fn, arg, "negative", ">= 0", length(b));
      ATTNREF_CHECK(length(b) <= capacity, std::invalid_argument, fn, arg, "exceeds " + product,
                    "<= " + std::to_string(capacity), length(b));
      for (Index j = 0; j < blocks_used(b); ++j) {
        const Index id = block_table(b, j);
        ATTNREF_CHECK(id >= 0 && id < num_blocks(), std::out_of_range, fn,
                      t + "[" + std::to_string(b) + "][" + std::to_string(j) + "]", "out of range",
                      "[0, " + std::to_string(num_blocks()) + ")", id);
      }
    }
  }
};

/// The CSR form of a block table.
struct CsrBlockTable {
  std::vector<std::int32_t> indptr;         ///< [batch + 1]
  std::vector<std::int32_t> indices;        ///< [indptr[batch]]
  std::vector<std::int32_t> last_page_len;  ///< [batch]
};

/// ATB's padded block table [batch, maxBlocks] and the context lengths -> CSR (the used entries
/// only; padding is dropped).
inline CsrBlockTable to_csr(const StridedView<const std::int32_t, 2>& block_table,
                            const std::vector<Index>& context_lens, Index block_size) {
  constexpr const char* fn = "to_csr";
  const Index batch = static_cast<Index>(context_lens.size());
  ATTNREF_CHECK(block_size > 0, std::invalid_argument, fn, "block_size", "not positive", ">= 1",
                block_size);
  ATTNREF_CHECK(block_table.size(0) == batch, std::invalid_argument, fn, "block_table.shape[0]",
                "mismatch with context_lens", batch, block_table.size(0));
  detail::check_view(fn, "block_table", block_table);
  const Index capacity =
      detail::checked_mul(fn, "maxBlocks * block_size", block_table.size(1), block_size);
  CsrBlockTable c;
  c.indptr.push_back(0);
  for (Index b = 0; b < batch; ++b) {
    const Index len = context_lens[static_cast<size_t>(b)];
    const std::string arg = "context_lens[" + std::to_string(b) + "]";
    ATTNREF_CHECK(len >= 0 && len <= capacity, std::invalid_argument, fn, arg, "out of range",
                  "[0, " + std::to_string(capacity) + "]", len);
    const Index pages = (len + block_size - 1) / block_size;
    for (Index j = 0; j < pages; ++j) c.indices.push_back(block_table(b, j));
    c.indptr.push_back(static_cast<std::int32_t>(c.indices.size()));
    c.last_page_len.push_back(
        static_cast<std::int32_t>(pages == 0 ? 0 : len - (pages - 1) * block_size));
  }
  return c;
}

/// CSR -> ATB's padded block table, row-major [batch, max_blocks] filled with `pad` past each
/// sequence's pages (max_blocks 0: the most pages of any sequence), and the context lengths.
struct PaddedBlockTable {
  std::vector<std::int32_t> table;  ///< [batch, max_blocks], row-major
  Index max_blocks = 0;
  std::vector<Index> context_lens;  ///< [batch]
};

inline PaddedBlockTable from_csr(const CsrBlockTable& c, Index block_size, Index max_blocks = 0,
                                 std::int32_t pad = -1) {
  constexpr const char* fn = "from_csr";
  ATTNREF_CHECK(!c.indptr.empty() && c.indptr[0] == 0, std::invalid_argument, fn, "indptr[0]",
                "not 0", 0, c.indptr.empty() ? -1 : c.indptr[0]);
  const Index batch = static_cast<Index>(c.indptr.size()) - 1;
  ATTNREF_CHECK(static_cast<Index>(c.last_page_len.size()) == batch, std::invalid_argument, fn,
                "last_page_len", "size mismatch with indptr", batch, c.last_page_len.size());
  ATTNREF_CHECK(block_size > 0, std::invalid_argument, fn, "block_size", "not positive", ">= 1",
                block_size);
  Index most = 0;
  for (Index b = 0; b < batch; ++b) {
    const Index lo = c.indptr[static_cast<size_t>(b)], hi = c.indptr[static_cast<size_t>(b + 1)];
    ATTNREF_CHECK(hi >= lo && hi <= static_cast<Index>(c.indices.size()), std::invalid_argument, fn,
                  "indptr[" + std::to_string(b + 1) + "]", "out of order or past indices",
                  "in [" + std::to_string(lo) + ", " + std::to_string(c.indices.size()) + "]", hi);
    const Index last = c.last_page_len[static_cast<size_t>(b)];
    ATTNREF_CHECK(hi == lo ? last == 0 : (last >= 1 && last <= block_size), std::invalid_argument,
                  fn, "last_page_len[" + std::to_string(b) + "]", "out of range",
                  hi == lo ? "0 (no pages)" : "[1, " + std::to_string(block_size) + "]", last);
    most = std::max(most, hi - lo);
  }
  if (max_blocks == 0) max_blocks = most;
  ATTNREF_CHECK(max_blocks >= most, std::invalid_argument, fn, "max_blocks",
                "smaller than a sequence's pages", ">= " + std::to_string(most), max_blocks);
  PaddedBlockTable p;
  p.max_blocks = max_blocks;
  p.table.assign(static_cast<size_t>(batch * max_blocks), pad);
  for (Index b = 0; b < batch; ++b) {
    const Index lo = c.indptr[static_cast<size_t>(b)], hi = c.indptr[static_cast<size_t>(b + 1)];
    for (Index j = lo; j < hi; ++j)
      p.table[static_cast<size_t>(b * max_blocks + j - lo)] = c.indices[static_cast<size_t>(j)];
    p.context_lens.push_back(
        hi == lo ? 0 : (hi - lo - 1) * block_size + c.last_page_len[static_cast<size_t>(b)]);
  }
  return p;
}

}  // namespace attnref
