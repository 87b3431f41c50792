#pragma once
/// attnref::nsa_compress_with_cache — CANN aclnnNsaCompressWithCache: NSA's compression during
/// decode. Batch b holds act_seq_len[b] = s raw tokens in a paged cache; when its newest token
/// completes a compress block (s >= l and (s − l) % d == 0) the block's l tokens [s − l, s) are
/// compressed into one token, written at row slot_mapping[b] of the output cache:
///   output_cache[slot_mapping[b]][n][:] = Σ_{j<l} weight[j][n] · input[token s − l + j][n][:]
/// Batches whose newest token completes no block write nothing, and their slot is not read.
/// The sum is the vendor kernel's fp32 tree (see nsa_compress_block below), rounded once to T.
///
/// attnref::nsa_update_compressed_cache — the decode loop's bookkeeping on top of it: after a
/// step appended new_b raw tokens to sequence b (its length now sel_b), it compresses K and V of
/// every block that the new tokens completed, compressed tokens
/// [nsa_compressed_count(sel_b − new_b), nsa_compressed_count(sel_b)), into the paged compressed
/// caches that nsa_decode_step reads. With new_b = sel_b it compresses a whole prompt.

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/exec.hpp"
#include "attnref/core/types.hpp"
#include "attnref/detail/threading.hpp"
#include "attnref/nsa/compress.hpp"
#include "attnref/nsa/decode_step.hpp"

namespace attnref {

struct NsaCompressWithCacheParams {
  std::int64_t compress_block_size = 32;  ///< compressBlockSize l
  std::int64_t compress_stride = 16;      ///< compressStride d
  std::int64_t act_seq_len_type = 1;      ///< actSeqLenType (1: per-batch lengths, the only one)
  std::int64_t page_block_size = 128;     ///< pageBlockSize; must equal input.shape[1]
  std::string layout = "TND";             ///< layoutOptional (not read with a block table)
  bool strict = true;                     ///< the vendor's constraint list
};

template <class T>
struct NsaCompressWithCacheInputs {
  StridedView<const T> input{};                    ///< raw tokens [blockNum, pageBlockSize, N, D]
  StridedView<const T> weight{};                   ///< [l, N]
  StridedView<const std::int32_t> slot_mapping{};  ///< [B]: the output row of each batch
  std::vector<std::int64_t> act_seq_len{};         ///< [B] raw lengths (required)
  StridedView<const std::int32_t> block_table{};   ///< [B, maxBlocks] (required)

  template <class F>
  void for_each_view(F&& f) {
    f("input", input), f("weight", weight), f("slot_mapping", slot_mapping);
    f("block_table", block_table);
  }
};

template <class T>
struct NsaCompressWithCacheOutputs {
  StridedView<T> output_cache{};  ///< [result_len, N, D]: rows at the written slots change

  template <class F>
  void for_each_view(F&& f) {
    f("output_cache", output_cache);
  }
};

template <class T>
struct NsaCacheUpdateInputs {
  StridedView<const T> key{};                         ///< raw keys [numBlocks, pbs, KV_N·Dqk]
  StridedView<const T> value{};                       ///< raw values [numBlocks, pbs, KV_N·Dv]
  StridedView<const std::int32_t> block_table{};      ///< [B, maxBlocks] (raw cache)
  StridedView<const T> key_weight{};                  ///< [l, KV_N]
  StridedView<const T> value_weight{};                ///< [l, KV_N]
  StridedView<const std::int32_t> cmp_block_table{};  ///< [B, maxCmpBlocks]
  std::vector<std::int64_t> actual_sel_kv_seq_len{};  ///< [B] raw lengths after the append
  std::vector<std::int64_t> actual_new_kv_len{};      ///< [B] tokens appended (empty: 1 each)

  template <class F>
  void for_each_view(F&& f) {
    f("key", key), f("value", value), f("block_table", block_table);
    f("key_weight", key_weight), f("value_weight", value_weight);
    f("cmp_block_table", cmp_block_table);
  }
};

template <class T>
struct NsaCacheUpdateOutputs {
  StridedView<T> cmp_key{};    ///< [numCmpBlocks, cmp pbs, KV_N·Dqk], updated in place
  StridedView<T> cmp_value{};  ///< [numCmpBlocks, cmp pbs, KV_N·Dv], updated in place

  template <class F>
  void for_each_view(F&& f) {
    f("cmp_key", cmp_key), f("cmp_value", cmp_value);
  }
};

namespace detail {

/// One compressed token to write: batch b's raw tokens [end − l, end) into output row `row`.
struct NsaCompressWrite {
  Index batch = 0, end = 0, row = 0;
};

/// The vendor kernel's in-place halving sum of rows r[0, n) of `width` floats (its ReduceBlock
/// with the first step at a = ceil_pow2(n) / 2): r[i] += r[i + a] for i < n − a, then
/// r[i] += r[i + a] for i < a with a halved down to 1. The result is r[0]; n = 1 leaves it.
inline void nsa_halving_sum(float* r, Index n, Index width) {
  if (n < 2) return;
  Index a = 1;
  while (2 * a < n) a *= 2;
  for (;;) {
    const Index pairs = std::min(a, n - a);
    for (Index i = 0; i < pairs * width; ++i) r[i] += r[a * width + i];
    if (a == 1) return;
    n = a;
    a /= 2;
  }
}

/// One compressed token of one head, as the vendor's kernel sums it: the products
/// p_j = fp32(w_j) · fp32(x_j) (exact for fp16 / bf16), each run of 8 tokens reduced by
/// nsa_halving_sum (a last run of l % 8 tokens likewise), the run sums reduced the same way, and
/// the result rounded once (to nearest even) to T. `rows[j]` points at token j's D elements;
/// `scratch` holds (l + 8) · D floats.
template <class T>
void nsa_compress_block(const T* const* rows, const float* w, Index l, Index D, float* scratch,
                        T* out) {
  constexpr Index run = 8;
  const Index runs = (l + run - 1) / run;
  float* sums = scratch + run * D;  // run t's sum at row t (t < runs <= l)
  for (Index t = 0; t < runs; ++t) {
    const Index n = std::min(run, l - t * run);
    for (Index j = 0; j < n; ++j) {
      const T* x = rows[t * run + j];
      const float wj = w[t * run + j];
      for (Index e = 0; e < D; ++e) scratch[j * D + e] = wj * static_cast<float>(x[e]);
    }
    nsa_halving_sum(scratch, n, D);
    std::copy_n(scratch, D, sums + t * D);
  }
  nsa_halving_sum(sums, runs, D);
  for (Index e = 0; e < D; ++e) out[e] = T(sums[e]);
}

/// Runs the writes on dense views: input [blocks, page, N, D], weight [l, N] (T), table
/// [B, maxBlocks], out [rows, N, D]. Each write is one work item; the bits do not depend on
/// the thread count.
template <class T>
void nsa_compress_writes(const std::vector<NsaCompressWrite>& writes,
                         const StridedView<const T>& in, const StridedView<const T>& weight,
                         const StridedView<const std::int32_t>& table, Index l,
                         const StridedView<T>& out, const ExecConfig& exec) {
  const Index page = in.size(1), N = in.size(2), D = in.size(3), mb = table.size(1);
  std::vector<float> w(static_cast<size_t>(l * N));
  for (Index i = 0; i < l * N; ++i)
    w[static_cast<size_t>(i)] = static_cast<float>(weight.data()[i]);
  struct Scratch {
    std::vector<float> sums, w;
    std::vector<const T*> rows;
  };
  parallel_for(
      resolve_threads(exec.threads), static_cast<Index>(writes.size()),
      [&] {
        return Scratch{std::vector<float>(static_cast<size_t>((l + 8) * D)),
                       std::vector<float>(static_cast<size_t>(l)),
                       std::vector<const T*>(static_cast<size_t>(l))};
      },
      [&](Scratch& s, Index k) {
        const NsaCompressWrite& wr = writes[static_cast<size_t>(k)];
        for (Index n = 0; n < N; ++n) {
          for (Index j = 0; j < l; ++j) {
            const Index t = wr.end - l + j;
            const Index block = table.data()[wr.batch * mb + t / page];
            s.rows[static_cast<size_t>(j)] = in.data() + ((block * page + t % page) * N + n) * D;
            s.w[static_cast<size_t>(j)] = w[static_cast<size_t>(j * N + n)];
          }
          nsa_compress_block(s.rows.data(), s.w.data(), l, D, s.sums.data(),
                             out.data() + (wr.row * N + n) * D);
        }
      });
}

/// The writes' index data, checked before anything is written: every raw page a write reads is
/// a block of the cache (std::out_of_range naming `table_name`), and no two writes share an
/// output row (std::invalid_argument naming `rows_name`: the result would depend on their order).
inline void nsa_check_writes(const char* fn, const std::vector<NsaCompressWrite>& writes,
                             const StridedView<const std::int32_t>& table, const char* table_name,
                             Index blocks, Index page, Index l, const char* rows_name) {
  const Index mb = table.size(1);
  for (const NsaCompressWrite& w : writes)
    for (Index pg = (w.end - l) / page; pg <= (w.end - 1) / page; ++pg) {
      const std::int32_t e = table.data()[w.batch * mb + pg];
      ATTNREF_CHECK(
          e >= 0 && e < blocks, std::out_of_range, fn,
          std::string(table_name) + "[" + std::to_string(w.batch) + "][" + std::to_string(pg) + "]",
          "out of range", "[0, " + std::to_string(blocks) + ")", e);
    }
  std::vector<NsaCompressWrite> by_row = writes;
  std::sort(by_row.begin(), by_row.end(),
            [](const NsaCompressWrite& a, const NsaCompressWrite& b) { return a.row < b.row; });
  for (size_t i = 1; i < by_row.size(); ++i)
    ATTNREF_CHECK(by_row[i].row != by_row[i - 1].row, std::invalid_argument, fn, rows_name,
                  "maps two writes to one output row", "distinct rows",
                  "row " + std::to_string(by_row[i].row) + " for batches " +
                      std::to_string(by_row[i - 1].batch) + " and " +
                      std::to_string(by_row[i].batch));
}

/// The vendor rules of aclnnNsaCompressWithCache (strict mode only): l a multiple of 16 up to
/// 64, d 16, 32, 48 or 64; N <= 64, and even above 50; D a multiple of 16 up to 256; pages of
/// 64 or 128 tokens; B <= 2048; result_len > (blockNum · pageBlockSize − l) / d.
struct NsaCacheRuleNames {
  const char* heads;
  const char* head_size;
  const char* rows;
};

inline void nsa_compress_cache_rules(const char* fn, bool strict, Index l, Index d, Index N,
                                     Index D, Index page, Index B, Index blocks, Index out_rows,
                                     const NsaCacheRuleNames& names) {
  if (!strict) return;
  const std::string rule = "not supported (vendor rule; params.strict = false relaxes it)";
  ATTNREF_CHECK(l % 16 == 0 && l <= 64 && d % 16 == 0 && d <= 64, std::invalid_argument, fn,
                "params.compress_block_size / compress_stride", rule,
                "l a multiple of 16 up to 64, d 16, 32, 48 or 64",
                std::to_string(l) + " / " + std::to_string(d));
  ATTNREF_CHECK(N <= 64 && (N <= 50 || N % 2 == 0), std::invalid_argument, fn, names.heads, rule,
                "N <= 64, even above 50", N);
  ATTNREF_CHECK(D % 16 == 0 && D <= 256, std::invalid_argument, fn, names.head_size, rule,
                "a multiple of 16 up to 256", D);
  ATTNREF_CHECK(page == 64 || page == 128, std::invalid_argument, fn, "params.page_block_size",
                rule, "64 or 128", page);
  ATTNREF_CHECK(B <= 2048, std::invalid_argument, fn, "batch", rule, "B <= 2048", B);
  const Index pool = checked_mul(fn, "raw cache tokens", blocks, page);
  if (pool >= l)
    ATTNREF_CHECK(out_rows > (pool - l) / d, std::invalid_argument, fn, names.rows,
                  "too small (vendor rule; params.strict = false relaxes it)",
                  "> (blockNum * pageBlockSize - l) / d = " + std::to_string((pool - l) / d),
                  out_rows);
}

/// Shapes of a [rank]-d view, for the checks below.
template <class V>
bool nsa_has_shape(const V& v, const std::vector<Index>& shape) {
  return !v.absent() && v.shape() == Dims(shape);
}

/// nsa_compress_with_cache's checks (on dense stand-ins), then its writes: the batches whose
/// newest token completes a block.
template <class T>
std::vector<NsaCompressWrite> nsa_compress_with_cache_plan(
    const NsaCompressWithCacheParams& p, const NsaCompressWithCacheInputs<T>& in,
    const NsaCompressWithCacheOutputs<T>& out) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "nsa_compress_with_cache: half or bfloat16 (float: attnref extension)");
  constexpr const char* fn = "nsa_compress_with_cache";
  const Index l = p.compress_block_size, d = p.compress_stride, page = p.page_block_size;
  std::string lay = p.layout;
  for (char& c : lay) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  ATTNREF_CHECK(lay == "BSH" || lay == "SBH" || lay == "BSND" || lay == "BNSD" || lay == "TND",
                std::invalid_argument, fn, "params.layout", "not supported",
                "BSH, SBH, BSND, BNSD or TND (not read with a block table)", p.layout);
  ATTNREF_CHECK(p.act_seq_len_type == 1, std::invalid_argument, fn, "params.act_seq_len_type",
                "not supported", "1 (per-batch lengths)", p.act_seq_len_type);
  ATTNREF_CHECK(d >= 1 && l >= d, std::invalid_argument, fn,
                "params.compress_block_size / compress_stride",
                "need compress_block_size >= compress_stride >= 1", "l >= d >= 1",
                std::to_string(l) + " / " + std::to_string(d));
  const auto& x = in.input;
  ATTNREF_CHECK(!x.absent() && x.rank() == 4 && x.size(2) > 0 && x.size(3) > 0,
                std::invalid_argument, fn, "input.shape", "not [blockNum, pageBlockSize, N, D]",
                "[blockNum, pageBlockSize, N, D]", shape_str(x));
  ATTNREF_CHECK(page >= 1 && x.size(1) == page, std::invalid_argument, fn, "input.shape[1]",
                "differs from params.page_block_size", page, x.size(1));
  const Index blocks = x.size(0), N = x.size(2), D = x.size(3);
  ATTNREF_CHECK(nsa_has_shape(in.weight, {l, N}), std::invalid_argument, fn, "weight.shape",
                "mismatch", shape_str(Dims{l, N}), shape_str(in.weight));
  const Index B = static_cast<Index>(in.act_seq_len.size());
  ATTNREF_CHECK(B > 0, std::invalid_argument, fn, "act_seq_len", "required", "B lengths", "none");
  ATTNREF_CHECK(nsa_has_shape(in.slot_mapping, {B}), std::invalid_argument, fn,
                "slot_mapping.shape", "mismatch", shape_str(Dims{B}), shape_str(in.slot_mapping));
  const auto& bt = in.block_table;
  ATTNREF_CHECK(!bt.absent() && bt.rank() == 2 && bt.size(0) == B, std::invalid_argument, fn,
                "block_table.shape", "required: [B, maxBlocks]",
                "[" + std::to_string(B) + ", maxBlocks]", shape_str(bt));
  const auto& o = out.output_cache;
  ATTNREF_CHECK(!o.absent() && o.rank() == 3 && o.size(1) == N && o.size(2) == D,
                std::invalid_argument, fn, "output_cache.shape", "mismatch",
                "[result_len, " + std::to_string(N) + ", " + std::to_string(D) + "]", shape_str(o));
  const Index cap = checked_mul(fn, "block_table.shape[1] * page_block_size", bt.size(1), page);
  for (Index b = 0; b < B; ++b) {
    const std::int64_t s = in.act_seq_len[static_cast<size_t>(b)];
    ATTNREF_CHECK(s >= 0 && s <= cap, std::invalid_argument, fn,
                  "act_seq_len[" + std::to_string(b) + "]", "out of range",
                  "[0, maxBlocks * pageBlockSize = " + std::to_string(cap) + "]", s);
  }
  nsa_compress_cache_rules(fn, p.strict, l, d, N, D, page, B, blocks, o.size(0),
                           {"input.shape[2]", "input.shape[3]", "output_cache.shape[0]"});
  std::vector<NsaCompressWrite> writes;
  for (Index b = 0; b < B; ++b) {
    const Index s = in.act_seq_len[static_cast<size_t>(b)];
    if (s < l || (s - l) % d != 0) continue;  // no block ends at the newest token
    const std::int32_t slot = in.slot_mapping.data()[b];
    ATTNREF_CHECK(slot >= 0 && slot < o.size(0), std::out_of_range, fn,
                  "slot_mapping[" + std::to_string(b) + "]", "out of range",
                  "[0, " + std::to_string(o.size(0)) + ")", slot);
    writes.push_back({b, s, slot});
  }
  nsa_check_writes(fn, writes, bt, "block_table", blocks, page, l, "slot_mapping");
  return writes;
}

/// nsa_update_compressed_cache's checks (on dense stand-ins), then its writes: every block
/// completed by the new tokens, K and V alike. Sets Dqk and Dv.
template <class T>
std::vector<NsaCompressWrite> nsa_update_plan(const NsaDecodeParams& p,
                                              const NsaCacheUpdateInputs<T>& in,
                                              const NsaCacheUpdateOutputs<T>& out, Index& Dqk,
                                              Index& Dv) {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "nsa_update_compressed_cache: half or bfloat16 (float: attnref extension)");
  constexpr const char* fn = "nsa_update_compressed_cache";
  const Index l = p.compress_block_size, d = p.compress_block_stride, KVN = p.num_key_value_heads;
  const Index page = p.page_block_size, cpage = p.cmp_page_block_size;
  ATTNREF_CHECK(d >= 1 && l >= d, std::invalid_argument, fn,
                "params.compress_block_size / compress_block_stride",
                "need compress_block_size >= compress_block_stride >= 1", "l >= d >= 1",
                std::to_string(l) + " / " + std::to_string(d));
  ATTNREF_CHECK(KVN >= 1, std::invalid_argument, fn, "params.num_key_value_heads", "not positive",
                ">= 1", KVN);
  ATTNREF_CHECK(page >= 1 && cpage >= 1, std::invalid_argument, fn,
                "params.page_block_size / cmp_page_block_size", "not positive", ">= 1",
                std::to_string(page) + " / " + std::to_string(cpage));
  const Index B = static_cast<Index>(in.actual_sel_kv_seq_len.size());
  ATTNREF_CHECK(B > 0, std::invalid_argument, fn, "actual_sel_kv_seq_len", "required", "B lengths",
                "none");
  const auto& k = in.key;
  ATTNREF_CHECK(
      !k.absent() && k.rank() == 3 && k.size(1) == page && k.size(2) > 0 && k.size(2) % KVN == 0,
      std::invalid_argument, fn, "key.shape", "mismatch",
      "[numBlocks, " + std::to_string(page) + ", KV_N * Dqk]", shape_str(k));
  const Index nb = k.size(0);
  Dqk = k.size(2) / KVN;
  const auto& v = in.value;
  ATTNREF_CHECK(!v.absent() && v.rank() == 3 && v.size(0) == nb && v.size(1) == page &&
                    v.size(2) > 0 && v.size(2) % KVN == 0,
                std::invalid_argument, fn, "value.shape", "mismatch",
                "[" + std::to_string(nb) + ", " + std::to_string(page) + ", KV_N * Dv]",
                shape_str(v));
  Dv = v.size(2) / KVN;
  const Index cnb = out.cmp_key.absent() ? 0 : out.cmp_key.size(0);
  ATTNREF_CHECK(nsa_has_shape(out.cmp_key, {cnb, cpage, KVN * Dqk}), std::invalid_argument, fn,
                "cmp_key.shape", "mismatch", shape_str(Dims{cnb, cpage, KVN * Dqk}),
                shape_str(out.cmp_key));
  ATTNREF_CHECK(nsa_has_shape(out.cmp_value, {cnb, cpage, KVN * Dv}), std::invalid_argument, fn,
                "cmp_value.shape", "mismatch", shape_str(Dims{cnb, cpage, KVN * Dv}),
                shape_str(out.cmp_value));
  for (const auto& [name, w] : {std::pair{"key_weight.shape", &in.key_weight},
                                std::pair{"value_weight.shape", &in.value_weight}})
    ATTNREF_CHECK(nsa_has_shape(*w, {l, KVN}), std::invalid_argument, fn, name, "mismatch",
                  shape_str(Dims{l, KVN}), shape_str(*w));
  const auto& bt = in.block_table;
  const auto& cbt = in.cmp_block_table;
  for (const auto& [name, t] :
       {std::pair{"block_table.shape", &bt}, std::pair{"cmp_block_table.shape", &cbt}})
    ATTNREF_CHECK(!t->absent() && t->rank() == 2 && t->size(0) == B, std::invalid_argument, fn,
                  name, "required: [B, maxBlocks]", "[" + std::to_string(B) + ", maxBlocks]",
                  shape_str(*t));
  const auto& nw = in.actual_new_kv_len;
  ATTNREF_CHECK(nw.empty() || static_cast<Index>(nw.size()) == B, std::invalid_argument, fn,
                "actual_new_kv_len", "size mismatch", B, nw.size());
  const Index cap = checked_mul(fn, "block_table.shape[1] * page_block_size", bt.size(1), page);
  const Index ccap =
      checked_mul(fn, "cmp_block_table.shape[1] * cmp_page_block_size", cbt.size(1), cpage);
  const Index rows = checked_mul(fn, "cmp_key rows", cnb, cpage);
  nsa_compress_cache_rules(fn, p.strict, l, d, KVN, Dqk, page, B, nb, rows,
                           {"params.num_key_value_heads", "Dqk", "cmp_key rows"});
  nsa_compress_cache_rules(fn, p.strict, l, d, KVN, Dv, page, B, nb, rows,
                           {"params.num_key_value_heads", "Dv", "cmp_value rows"});
  std::vector<NsaCompressWrite> writes;
  for (Index b = 0; b < B; ++b) {
    const std::string at = "[" + std::to_string(b) + "]";
    const Index s = in.actual_sel_kv_seq_len[static_cast<size_t>(b)];
    const Index n = nw.empty() ? 1 : nw[static_cast<size_t>(b)];
    ATTNREF_CHECK(s >= 0 && s <= cap, std::invalid_argument, fn, "actual_sel_kv_seq_len" + at,
                  "out of range", "[0, maxBlocks * page_block_size = " + std::to_string(cap) + "]",
                  s);
    if (nw.empty())
      ATTNREF_CHECK(s >= 1, std::invalid_argument, fn, "actual_sel_kv_seq_len" + at,
                    "holds no token, but actual_new_kv_len is empty (one new token each)",
                    ">= 1, or actual_new_kv_len with 0 for this sequence", s);
    ATTNREF_CHECK(n >= 0 && n <= s, std::invalid_argument, fn, "actual_new_kv_len" + at,
                  "out of range", "[0, actual_sel_kv_seq_len = " + std::to_string(s) + "]", n);
    const Index c1 = nsa_compressed_count(s, l, d);
    ATTNREF_CHECK(c1 <= ccap, std::invalid_argument, fn, "actual_sel_kv_seq_len" + at,
                  "needs more compressed tokens than cmp_block_table holds",
                  "(sel - l) / d + 1 <= " + std::to_string(ccap),
                  std::to_string(s) + " (" + std::to_string(c1) + " compressed)");
    for (Index i = nsa_compressed_count(s - n, l, d); i < c1; ++i) {
      const std::int32_t e = cbt.data()[b * cbt.size(1) + i / cpage];
      ATTNREF_CHECK(e >= 0 && e < cnb, std::out_of_range, fn,
                    "cmp_block_table" + at + "[" + std::to_string(i / cpage) + "]", "out of range",
                    "[0, " + std::to_string(cnb) + ")", e);
      writes.push_back({b, i * d + l, e * cpage + i % cpage});
    }
  }
  nsa_check_writes(fn, writes, bt, "block_table", nb, page, l, "cmp_block_table");
  return writes;
}

}  // namespace detail

/// Every check of nsa_compress_with_cache() (params, tensors, index data, execution config),
/// without computing or writing anything.
template <class T>
void validate(const NsaCompressWithCacheParams& p, const NsaCompressWithCacheInputs<T>& in,
              const NsaCompressWithCacheOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::check_exec("nsa_compress_with_cache", exec);
  detail::dense_call("nsa_compress_with_cache", in, out, false,
                     [&](const auto& din, const auto& dout) {
                       (void)detail::nsa_compress_with_cache_plan(p, din, dout);
                     });
}

/// aclnnNsaCompressWithCache (see the top of this file): input [blockNum, pageBlockSize, N, D]
/// read through block_table, weight [l, N], slot_mapping [B], act_seq_len [B] (per-batch
/// lengths), output_cache [result_len, N, D] written in place. T: half or bfloat16 (float:
/// attnref extension). validate -> plan -> run.
template <class T>
void nsa_compress_with_cache(const NsaCompressWithCacheParams& p,
                             const NsaCompressWithCacheInputs<T>& in,
                             const NsaCompressWithCacheOutputs<T>& out,
                             const ExecConfig& exec = {}) {
  constexpr const char* fn = "nsa_compress_with_cache";
  detail::check_exec(fn, exec);
  detail::dense_call(fn, in, out, true, [&](const auto& din, const auto& dout) {
    const auto writes = detail::nsa_compress_with_cache_plan(p, din, dout);
    detail::nsa_compress_writes<T>(writes, din.input, din.weight, din.block_table,
                                   p.compress_block_size, dout.output_cache, exec);
  });
}

/// Every check of nsa_update_compressed_cache(), without computing or writing anything.
template <class T>
void validate(const NsaDecodeParams& p, const NsaCacheUpdateInputs<T>& in,
              const NsaCacheUpdateOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::check_exec("nsa_update_compressed_cache", exec);
  detail::dense_call("nsa_update_compressed_cache", in, out, false,
                     [&](const auto& din, const auto& dout) {
                       Index Dqk = 0, Dv = 0;
                       (void)detail::nsa_update_plan(p, din, dout, Dqk, Dv);
                     });
}

/// Brings the paged compressed caches of nsa_decode_step up to date after new raw tokens were
/// appended (see the top of this file): K with key_weight, V with value_weight, each compressed
/// token as nsa_compress_with_cache computes it, at its place in cmp_block_table.
/// validate -> plan -> run.
template <class T>
void nsa_update_compressed_cache(const NsaDecodeParams& p, const NsaCacheUpdateInputs<T>& in,
                                 const NsaCacheUpdateOutputs<T>& out, const ExecConfig& exec = {}) {
  constexpr const char* fn = "nsa_update_compressed_cache";
  detail::check_exec(fn, exec);
  detail::dense_call(fn, in, out, true, [&](const auto& din, const auto& dout) {
    Index Dqk = 0, Dv = 0;
    const auto writes = detail::nsa_update_plan(p, din, dout, Dqk, Dv);
    const Index KVN = p.num_key_value_heads, nb = din.key.size(0), pbs = p.page_block_size;
    const Index rows = dout.cmp_key.size(0) * dout.cmp_key.size(1);
    const Index l = p.compress_block_size;
    detail::nsa_compress_writes<T>(
        writes, StridedView<const T>(din.key.data(), {nb, pbs, KVN, Dqk}), din.key_weight,
        din.block_table, l, StridedView<T>(dout.cmp_key.data(), {rows, KVN, Dqk}), exec);
    detail::nsa_compress_writes<T>(
        writes, StridedView<const T>(din.value.data(), {nb, pbs, KVN, Dv}), din.value_weight,
        din.block_table, l, StridedView<T>(dout.cmp_value.data(), {rows, KVN, Dv}), exec);
  });
}

}  // namespace attnref
