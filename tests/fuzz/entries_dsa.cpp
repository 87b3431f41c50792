// Fuzz entries "sparse_flash_attention" and "lightning_indexer" (DeepSeek sparse attention, float
// data, params.strict = false unless a case draws the vendor's shapes) against ref::dsa.
// Both draw the geometry of dsa/detail/sequences.hpp: a BSND query (per-batch lengths given or
// not, 0 included; padded rows NaN) or a TND one (cumulative lengths, 0-row batches), keys in
// BSND (lengths given or not, NaN past them), TND (cumulative) or PA_BSND (a shuffled block pool
// of any block size, NaN in every row no batch owns, -1 in the table past each batch's blocks),
// 1 to 3 batches, N2 in {1, 2, 4} dividing N1 <= 8, D 1-40, sparse_mode 0 or 3 (keys 0-40, query
// rows above the keys included: rows that see nothing).
// sparse_flash_attention: Dr 1-12, K 1-6 slots, sparse_block_size 1-8 (rarely 2^30), value
// absent, the key's memory or its own tensor; per live (row, key head) a list of blocks of the
// batch's keys (distinct or repeated, past the row's causal limit included, valid ones first,
// -1 after, sometimes all -1), garbage in the padded BSND rows' lists; random engine tiling; the
// output against ref::dsa::sparse_attention (tolerance 2e-4 · (1 + |want|)), padded rows 0.
// lightning_indexer: sparse_count 1-50 (often past the keys), return_value (not with PA_BSND),
// sparse_values given without it (never written); per row the index list checked against
// ref::dsa::indexer_scores / indexer_topk: the -1 tail exactly, distinct keys inside the row's
// limit, and at every position a key whose reference score is within 1e-4 · (1 + |s|) of the
// reference top-k's (so only near-ties may swap), the values within the same tolerance of the
// reference scores, -inf in the tail; padded rows all -1.
// Rare cases draw the vendor's shapes with params.strict (SFA: N2 1, N1 a power of 2, D 512,
// Dr 64, power-of-2 block sizes, blockSize 16 or 32, paired layouts, V the key; LI: D 128, N2 1,
// paired layouts) and must be accepted, or break one vendor rule and must be rejected; every
// defined edit (all -1 lists, blocks past every limit, 2^30-token blocks, more slots than
// blocks, all-equal indexer scores in the exact tie order, repeated keys, ...) must be accepted.
// Perturbations (each rejection with its exception type: index data and block-table entries
// std::out_of_range, a valid index entry after -1 std::invalid_argument, the rest
// std::invalid_argument; outputs untouched; validate() agreeing): every tensor's shape, null data,
// negative and overflowing extents, lengths out of range, of the wrong count, not cumulative, not
// ending at T, missing, the block table missing, misplaced, misshapen or pointing out of the pool,
// unknown layouts and modes, pre / next tokens, attention_mode, softmax_lse, scale, block sizes,
// sparse_count, return_value with PA_BSND, outputs overlapping inputs, a negative exec config.
//
// Entries "quant_lightning_indexer", "kv_quant_sparse_flash_attention" and "dsa_step" draw the
// same geometry (params.strict = false unless a case draws the vendor's shapes):
// quant_lightning_indexer: int8 query / key over the full range (extremes often), half weights,
// half query / key dequant scales of either sign (powers of 2 or arbitrary, fp16 subnormals
// included); 127 in every unused int8 row, NaN in unused scale / weight rows. Per row: the -1 tail
// exactly, distinct keys inside the limit, at every position a key whose score is within
// 1e-5 of the magnitude of ref::dsa::quant_indexer_topk's key's (scores: this file's copy of the
// reference's double + fp16 formula), descending, nothing left out scoring higher; a quarter of
// the cases (small integers, power-of-2 positive scales: every fp32 step exact) must equal the
// reference's lists exactly.
// kv_quant_sparse_flash_attention: bfloat16 queries (half: in the unit tests); nope = tile · 1..4,
// tile 4-16, rope 2-8; packed rows (int8 latent, rope values in T, fp32 tile scales of either
// sign), all 0xFF bytes in unused rows; value / key / value dequant scales absent or junk (never
// read); the output against ref::dsa::sparse_attention over the rows dequantized here from the
// documented layout (tolerance 3e-2 · (1 + |want|); the helper also takes half: 4e-3).
// dsa_step (float): its own index geometry (Ni heads, Di) beside the latent one (N1, D, Dr), one
// cache head, sparse_indices output present or absent; == lightning_indexer then
// sparse_flash_attention (sparse_block_size 1) called directly, bit for bit (indices included),
// and both halves against ref::dsa as the two entries above check them. Rejections name dsa_step
// (its halves' with "(in <half>)").

#include <attnref/attnref.hpp>
#include <limits>
#include <type_traits>

#include "fuzz/fuzz.hpp"
#include "reference/dsa.hpp"
#include "support/cast.hpp"
#include "support/views.hpp"

namespace fuzz_dsa {

using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;
using R = fuzz::Rng;
using i32 = std::int32_t;
using i64 = std::int64_t;
using Shape = std::vector<Index>;
using support::z;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 333.0f;
constexpr i32 kIdxSentinel = 12345;

// The exception a must-reject perturbation must raise.
// (kNone: a defined input, which must be accepted.)
enum class Want { kAny, kInvalid, kRange, kNone };

// The sequence geometry both operators share (dsa/detail/sequences.hpp).
struct Geo {
  std::string ql = "BSND", kl = "BSND";  // query / key layouts
  Index B = 1, S1 = 0, T1 = 0, N1 = 1, N2 = 1, D = 1;
  Index S2 = 0, T2 = 0, bs = 1, nb = 0, mb = 1;  // BSND keys: S2; TND: T2; PA_BSND: bs, nb, mb
  bool causal = false;
  std::vector<Index> qlen, klen, q0, k0;  // per batch: lengths, first query row / key token
  std::vector<i32> table;                 // PA_BSND [B, mb]
  attnref::ExecConfig ex;
  Want want = Want::kAny;

  bool qtnd() const { return ql == "TND"; }
  bool paged() const { return kl == "PA_BSND"; }
  Index rows() const { return qtnd() ? T1 : B * S1; }
  Index rows_of(Index b) const { return qtnd() ? qlen[z(b)] : S1; }  // the batch's query rows
  Index tokens() const { return paged() ? nb * bs : kl == "TND" ? T2 : B * S2; }
  // Key token t of batch b as a row of the key tensor flattened over its leading dimensions.
  Index tok(Index b, Index t) const {
    return paged() ? Index{table[z(b * mb + t / bs)]} * bs + t % bs : k0[z(b)] + t;
  }
  Index pblocks(Index b) const { return (klen[z(b)] + bs - 1) / bs; }  // pool blocks of batch b
  Shape qshape(Index heads, Index w) const {
    return qtnd() ? Shape{T1, heads, w} : Shape{B, S1, heads, w};
  }
  Shape kshape(Index w) const {
    if (kl == "TND") return {T2, N2, w};
    if (paged()) return {nb, bs, N2, w};
    return {B, S2, N2, w};
  }
  // The keys [0, limit) live row i of batch b sees.
  Index limit(Index b, Index i) const {
    if (!causal) return klen[z(b)];
    return std::max<Index>(0, klen[z(b)] - qlen[z(b)] + i + 1);
  }
};

std::vector<i64> cumulative(std::vector<Index>& first, const std::vector<Index>& len) {
  std::vector<i64> out;
  Index at = 0;
  first.clear();
  for (Index l : len) first.push_back(at), at += l, out.push_back(at);
  return out;
}

// Lengths and tables (layouts, B, heads and D set before); qlens / klens: the lengths given.
void draw_geo(Geo& g, R& r, Index kv_max, std::vector<i64>& qlens, std::vector<i64>& klens) {
  g.qlen.clear(), g.klen.clear(), g.q0.clear(), g.k0.clear(), g.table.clear();
  qlens.clear(), klens.clear();
  if (g.qtnd()) {
    for (Index b = 0; b < g.B; ++b) g.qlen.push_back(r.chance(0.15) ? 0 : r.range(1, 4));
    qlens = cumulative(g.q0, g.qlen);
    g.T1 = static_cast<Index>(qlens.back()), g.S1 = 0;
  } else {
    g.S1 = r.range(1, 5);
    const bool given = r.chance(0.6);
    for (Index b = 0; b < g.B; ++b) {
      g.qlen.push_back(!given ? g.S1 : r.chance(0.15) ? 0 : r.range(0, g.S1));
      g.q0.push_back(b * g.S1);
    }
    if (given) qlens.assign(g.qlen.begin(), g.qlen.end());
  }
  for (Index b = 0; b < g.B; ++b)
    g.klen.push_back(r.chance(0.1) ? 0 : r.chance(0.2) ? r.range(1, 4) : r.range(1, kv_max));
  if (g.kl == "TND") {
    klens = cumulative(g.k0, g.klen);
    g.T2 = static_cast<Index>(klens.back());
  } else if (g.kl == "BSND") {
    const bool given = r.chance(0.6);
    g.S2 = *std::max_element(g.klen.begin(), g.klen.end()) + r.range(0, 2);
    if (!given) g.klen.assign(z(g.B), g.S2);
    for (Index b = 0; b < g.B; ++b) g.k0.push_back(b * g.S2);
    if (given) klens.assign(g.klen.begin(), g.klen.end());
  } else {  // a shuffled pool, spare blocks, -1 past each batch's blocks
    Index used = 0, most = 0;
    for (Index b = 0; b < g.B; ++b) used += g.pblocks(b), most = std::max(most, g.pblocks(b));
    g.mb = std::max<Index>(1, most + r.range(0, 1));
    g.nb = used + r.range(0, 2);
    std::vector<i32> ids(z(g.nb));
    for (Index i = 0; i < g.nb; ++i) ids[z(i)] = static_cast<i32>(i);
    std::shuffle(ids.begin(), ids.end(), r.g);
    g.table.assign(z(g.B * g.mb), -1);
    Index next = 0;
    for (Index b = 0; b < g.B; ++b)
      for (Index j = 0; j < g.pblocks(b); ++j) g.table[z(b * g.mb + j)] = ids[z(next++)];
    klens.assign(g.klen.begin(), g.klen.end());
  }
  if (g.table.empty()) g.table.assign(1, -1);  // (a buffer for "block table given")
}

// A key-side tensor of width w per head: normal draws in every row a batch owns, NaN elsewhere.
void fill_keys(const Geo& g, R& r, Index w, std::vector<float>& buf) {
  buf.assign(z(std::max<Index>(1, g.tokens() * g.N2 * w)), kNaN);
  for (Index b = 0; b < g.B; ++b)
    for (Index t = 0; t < g.klen[z(b)]; ++t)
      for (Index e = 0; e < g.N2 * w; ++e) buf[z(g.tok(b, t) * g.N2 * w + e)] = r.normal();
}

// A query-side tensor of hw values per row: normal draws in live rows, NaN in padded ones.
void fill_rows(const Geo& g, R& r, Index hw, std::vector<float>& buf) {
  buf.assign(z(std::max<Index>(1, g.rows() * hw)), kNaN);
  for (Index b = 0; b < g.B; ++b)
    for (Index i = 0; i < g.qlen[z(b)]; ++i)
      for (Index e = 0; e < hw; ++e) buf[z((g.q0[z(b)] + i) * hw + e)] = r.normal();
}

void draw_exec(Geo& g, R& r) {
  if (r.chance(0.3)) g.ex.kv_tile = r.range(1, 16);
  if (r.chance(0.3)) g.ex.q_tile = r.range(1, 4);
  if (r.chance(0.3)) g.ex.kv_split = r.chance(0.3) ? -1 : r.range(1, 16);
}

// One of `list`, at random.
template <class X>
X pick(R& r, const std::vector<X>& list) {
  return list[z(r.range(0, static_cast<Index>(list.size()) - 1))];
}

// Heads: N2 in {1, 2, 4}, N1 = N2 · G <= 8.
void draw_heads(Geo& g, R& r) {
  g.N2 = pick<Index>(r, {1, 1, 2, 4});
  g.N1 = g.N2 * r.range(1, 8 / g.N2);
}

// What a rebuilt case must have: the vendor's shapes (strict), one of its rules broken (>= 0).
struct Vendor {
  bool on = false;
  int broken = -1;
};

// ---- SparseFlashAttention ---------------------------------------------------------------------

struct Sfa : Geo {
  Index Dr = 1, K = 1, sbs = 1;
  int value_mode = 0;  // 0 absent, 1 the key's view, 2 its own tensor
  std::vector<float> q, qr, k, v, kr, o;
  std::vector<i32> idx;
  std::vector<i64> qlens, klens;
  attnref::SparseFlashAttentionParams p;
  attnref::SparseFlashAttentionInputs<float> in;
  attnref::SparseFlashAttentionOutputs<float> out;
};

std::vector<i64>& klens_of(Sfa& c) { return c.in.actual_seq_lengths_kv; }
std::string& klayout_of(Sfa& c) { return c.p.layout_kv; }

// SFA blocks of batch b's keys.
template <class C>
Index sblocks(const C& c, Index b) {
  return (c.klen[z(b)] + c.sbs - 1) / c.sbs;
}

// The index lists: per live (row, key head) up to K blocks of the batch (distinct, or repeats
// allowed), valid first, -1 after, sometimes all -1 (past_limit: only blocks past the row's
// causal limit); garbage in the padded rows (not read).
template <class C>
void fill_lists(C& c, R& r, bool past_limit = false) {
  c.idx.assign(z(std::max<Index>(1, c.rows() * c.N2 * c.K)), -1);
  for (Index b = 0; b < c.B; ++b)
    for (Index i = 0; i < c.rows_of(b); ++i)
      for (Index g = 0; g < c.N2; ++g) {
        i32* list = c.idx.data() + ((c.q0[z(b)] + i) * c.N2 + g) * c.K;
        if (i >= c.qlen[z(b)]) {
          for (Index e = 0; e < c.K; ++e) list[e] = static_cast<i32>(r.range(-9, 1 << 30));
          continue;
        }
        const Index lo = past_limit ? (c.limit(b, i) + c.sbs - 1) / c.sbs : 0;
        std::vector<i32> blocks;
        for (Index j = lo; j < sblocks(c, b); ++j) blocks.push_back(static_cast<i32>(j));
        if (blocks.empty() || r.chance(0.08)) continue;
        const Index n = r.range(0, c.K);
        std::vector<i32> got;
        if (r.chance(0.25)) {  // repeats allowed
          for (Index e = 0; e < n; ++e) got.push_back(pick(r, blocks));
        } else {
          std::shuffle(blocks.begin(), blocks.end(), r.g);
          got.assign(blocks.begin(), blocks.begin() + std::min<Index>(n, blocks.size()));
        }
        std::copy(got.begin(), got.end(), list);
      }
}

void set_views(Sfa& c) {
  using CF = StridedView<const float>;
  c.in = {};
  c.in.query = CF(c.q.data(), c.qshape(c.N1, c.D));
  c.in.query_rope = CF(c.qr.data(), c.qshape(c.N1, c.Dr));
  c.in.key = CF(c.k.data(), c.kshape(c.D));
  c.in.key_rope = CF(c.kr.data(), c.kshape(c.Dr));
  if (c.value_mode == 1) c.in.value = c.in.key;
  if (c.value_mode == 2) c.in.value = CF(c.v.data(), c.kshape(c.D));
  c.in.sparse_indices = StridedView<const i32>(c.idx.data(), c.qshape(c.N2, c.K));
  if (c.paged()) c.in.block_table = StridedView<const i32>(c.table.data(), {c.B, c.mb});
  c.in.actual_seq_lengths_query = c.qlens;
  c.in.actual_seq_lengths_kv = c.klens;
  c.out.attention_out = StridedView<float>(c.o.data(), c.qshape(c.N1, c.D));
}

void draw_sfa(Sfa& c, R& r, Vendor f) {
  static const std::vector<std::string> kls{"BSND", "TND", "PA_BSND"};
  c.ql = r.chance(0.4) ? "TND" : "BSND";
  c.kl = f.broken == 4 || f.broken == 5 ? "PA_BSND" : pick(r, kls);
  if (f.on && !c.paged()) c.kl = c.ql;  // paired layouts, or (rule 7) not
  if (f.broken == 7) c.kl = c.ql == "TND" ? "BSND" : "TND";
  c.B = r.range(1, 3);
  Index kv_max = 40;
  if (!f.on) {
    draw_heads(c, r);
    c.D = r.range(1, 40), c.Dr = r.range(1, 12), c.K = r.range(1, 6), c.sbs = r.range(1, 8);
    c.bs = r.range(1, 8);
    c.value_mode = static_cast<int>(r.range(0, 2));
  } else {  // the vendor's shapes (N2 1, N1 a power of 2, D 512, Dr 64), or one rule broken
    kv_max = 24;
    c.N2 = f.broken == 0 ? 2 : 1;
    c.N1 = f.broken == 1 ? pick<Index>(r, {3, 5, 6}) : c.N2 * pick<Index>(r, {1, 2, 4});
    c.D = f.broken == 2 && r.chance(0.5) ? 256 : 512;
    c.Dr = f.broken == 2 && c.D == 512 ? 32 : 64;
    c.K = r.range(1, 4);
    c.sbs = f.broken == 3 ? pick<Index>(r, {3, 6, 256}) : pick<Index>(r, {1, 2, 4, 8, 16});
    c.bs = f.broken == 4 ? pick<Index>(r, {8, 24}) : pick<Index>(r, {16, 32});
    if (f.broken == 5) c.bs = 16, c.sbs = 32;
    c.value_mode = f.broken == 6 ? 2 : static_cast<int>(r.range(0, 1));
  }
  draw_geo(c, r, kv_max, c.qlens, c.klens);
  c.causal = r.chance(0.5);
  fill_rows(c, r, c.N1 * c.D, c.q);
  fill_rows(c, r, c.N1 * c.Dr, c.qr);
  fill_keys(c, r, c.D, c.k);
  fill_keys(c, r, c.Dr, c.kr);
  if (c.value_mode == 2) fill_keys(c, r, c.D, c.v);
  fill_lists(c, r);
  c.o.assign(z(std::max<Index>(1, c.rows() * c.N1 * c.D)), kSentinel);
  c.p = {};
  c.p.scale_value =
      std::uniform_real_distribution<double>(0.5, 2.0)(r.g) / std::sqrt(double(c.D + c.Dr));
  c.p.sparse_block_size = c.sbs;
  c.p.layout_query = c.ql, c.p.layout_kv = c.kl;
  c.p.sparse_mode = c.causal ? 3 : 0;
  c.p.strict = f.on;
  draw_exec(c, r);
  set_views(c);
}

void build_sfa(Sfa& c, R& r) { draw_sfa(c, r, {}); }

// The rows of batch b of a query-side buffer (hw values per row) as doubles.
void rows_of(const Geo& g, Index b, const std::vector<float>& x, Index hw,
             std::vector<double>& to) {
  for (Index i = 0; i < g.qlen[z(b)]; ++i)
    for (Index e = 0; e < hw; ++e) to.push_back(x[z((g.q0[z(b)] + i) * hw + e)]);
}
// The key rows of batch b of a key-side buffer (N2 · w per token) as doubles.
std::vector<double> keys_of(const Geo& g, Index b, const std::vector<float>& x, Index w) {
  std::vector<double> to;
  for (Index t = 0; t < g.klen[z(b)]; ++t)
    for (Index e = 0; e < g.N2 * w; ++e) to.push_back(x[z(g.tok(b, t) * g.N2 * w + e)]);
  return to;
}

// "" when the padded BSND rows of x (hw values per row) all hold `want`.
template <class X>
std::string padded_hold(const Geo& g, const std::vector<X>& x, Index hw, X want, const char* what) {
  for (Index b = 0; b < g.B && !g.qtnd(); ++b)
    for (Index i = g.qlen[z(b)]; i < g.S1; ++i)
      for (Index e = 0; e < hw; ++e)
        if (!(x[z((g.q0[z(b)] + i) * hw + e)] == want))
          return std::string("padded row (b ") + std::to_string(b) + ", i " + std::to_string(i) +
                 "): " + what;
  return "";
}

std::string verify_sfa(const Sfa& c) {
  ref::dsa::Shape sh;
  sh.N1 = static_cast<int>(c.N1), sh.N2 = static_cast<int>(c.N2);
  sh.D = static_cast<int>(c.D), sh.Dr = static_cast<int>(c.Dr), sh.causal = c.causal;
  std::vector<double> got, want;
  for (Index b = 0; b < c.B; ++b) {
    ref::dsa::Batch x;
    x.q_len = static_cast<int>(c.qlen[z(b)]), x.kv_len = static_cast<long>(c.klen[z(b)]);
    rows_of(c, b, c.q, c.N1 * c.D, x.q);
    rows_of(c, b, c.qr, c.N1 * c.Dr, x.qr);
    x.k = keys_of(c, b, c.k, c.D), x.kr = keys_of(c, b, c.kr, c.Dr);
    x.v = c.value_mode == 2 ? keys_of(c, b, c.v, c.D) : x.k;
    for (Index i = 0; i < c.qlen[z(b)]; ++i) {
      const Index row = c.q0[z(b)] + i;
      x.idx.insert(x.idx.end(), c.idx.begin() + row * c.N2 * c.K,
                   c.idx.begin() + (row + 1) * c.N2 * c.K);
    }
    rows_of(c, b, c.o, c.N1 * c.D, got);
    const auto o = ref::dsa::sparse_attention(sh, x, static_cast<long>(c.K),
                                              static_cast<long>(c.sbs), c.p.scale_value);
    want.insert(want.end(), o.begin(), o.end());
  }
  const std::string m = padded_hold(c, c.o, c.N1 * c.D, 0.0f, "not 0");
  return m.empty() ? fuzz::compare(got, want, 2e-4) : m;
}

// ---- LightningIndexer -------------------------------------------------------------------------

struct Li : Geo {
  Index count = 1;
  bool values_given = false;
  bool exact = false;  // every score exactly equal in fp32: the order must be the reference's
  std::vector<float> q, k, w, val;
  std::vector<i32> idx;
  std::vector<i64> qlens, klens;
  attnref::LightningIndexerParams p;
  attnref::LightningIndexerInputs<float> in;
  attnref::LightningIndexerOutputs<float> out;
};

std::vector<i64>& klens_of(Li& c) { return c.in.actual_seq_lengths_key; }
std::string& klayout_of(Li& c) { return c.p.layout_key; }

void set_views(Li& c) {
  using CF = StridedView<const float>;
  c.in = {}, c.out = {};
  c.in.query = CF(c.q.data(), c.qshape(c.N1, c.D));
  c.in.key = CF(c.k.data(), c.kshape(c.D));
  Shape ws = c.qshape(c.N1, 1);
  ws.pop_back();
  c.in.weights = CF(c.w.data(), ws);
  if (c.paged()) c.in.block_table = StridedView<const i32>(c.table.data(), {c.B, c.mb});
  c.in.actual_seq_lengths_query = c.qlens;
  c.in.actual_seq_lengths_key = c.klens;
  c.out.sparse_indices = StridedView<i32>(c.idx.data(), c.qshape(c.N2, c.count));
  if (c.values_given)
    c.out.sparse_values = StridedView<float>(c.val.data(), c.qshape(c.N2, c.count));
}

// The two indexers' layouts, heads, lengths, causality and top-k count: free shapes, or the
// vendor's (D 128, N2 1, N1 <= 64, paired layouts) with rule f.broken broken.
template <class C>
void draw_indexer_shape(C& c, R& r, Vendor f) {
  static const std::vector<std::string> kls{"BSND", "TND", "PA_BSND"};
  c.ql = r.chance(0.4) ? "TND" : "BSND";
  c.kl = pick(r, kls);
  c.B = r.range(1, 3);
  if (!f.on) {
    draw_heads(c, r);
    c.D = r.range(1, 40);
    c.bs = r.range(1, 8);
  } else {
    if (f.broken == 0) c.kl = c.ql == "TND" ? "BSND" : "TND";
    if (f.broken == 4) c.kl = "PA_BSND";
    if (f.broken != 0 && !c.paged()) c.kl = c.ql;
    c.N2 = f.broken == 2 ? 2 : 1;
    c.N1 = f.broken == 3 ? r.range(65, 68) : c.N2 * (r.chance(0.1) ? 64 : r.range(1, 8));
    c.D = f.broken == 1 ? pick<Index>(r, {64, 130}) : 128;
    c.bs = f.broken == 4 ? pick<Index>(r, {8, 24}) : pick<Index>(r, {16, 32});
  }
  draw_geo(c, r, 40, c.qlens, c.klens);
  c.causal = r.chance(0.5);
  c.count = r.chance(0.3) ? r.range(1, 3) : r.chance(0.6) ? r.range(4, 12) : r.range(13, 50);
}

void draw_li(Li& c, R& r, Vendor f) {
  draw_indexer_shape(c, r, f);
  if (f.broken == 5) c.count = r.chance(0.5) ? r.range(2049, 2060) : 5000;
  fill_rows(c, r, c.N1 * c.D, c.q);
  fill_rows(c, r, c.N1, c.w);
  fill_keys(c, r, c.D, c.k);
  c.p = {};
  c.p.return_value = !c.paged() && r.chance(0.6);
  c.values_given = c.p.return_value || r.chance(0.3);
  c.idx.assign(z(std::max<Index>(1, c.rows() * c.N2 * c.count)), kIdxSentinel);
  c.val.assign(c.idx.size(), kSentinel);
  c.p.layout_query = c.ql, c.p.layout_key = c.kl;
  c.p.sparse_count = c.count;
  c.p.sparse_mode = c.causal ? 3 : 0;
  c.p.strict = f.on;
  set_views(c);
}

void build_li(Li& c, R& r) { draw_li(c, r, {}); }

std::string verify_li(const Li& c) {
  ref::dsa::Shape sh;
  sh.N1 = static_cast<int>(c.N1), sh.N2 = static_cast<int>(c.N2);
  sh.D = static_cast<int>(c.D), sh.causal = c.causal;
  const float ninf = -std::numeric_limits<float>::infinity();
  for (Index b = 0; b < c.B; ++b) {
    ref::dsa::Batch x;
    x.q_len = static_cast<int>(c.qlen[z(b)]), x.kv_len = static_cast<long>(c.klen[z(b)]);
    rows_of(c, b, c.q, c.N1 * c.D, x.q);
    rows_of(c, b, c.w, c.N1, x.w);
    x.k = keys_of(c, b, c.k, c.D);
    const std::vector<double> score = ref::dsa::indexer_scores(sh, x);
    const std::vector<i32> top = ref::dsa::indexer_topk(sh, x, static_cast<long>(c.count));
    for (Index i = 0; i < c.qlen[z(b)]; ++i)
      for (Index g = 0; g < c.N2; ++g) {
        const Index at = ((c.q0[z(b)] + i) * c.N2 + g) * c.count;
        const i32* got = c.idx.data() + at;
        const i32* want = top.data() + (i * c.N2 + g) * c.count;
        const double* s = score.data() + (i * c.N2 + g) * c.klen[z(b)];
        const Index lim = c.limit(b, i), n = std::min(lim, c.count);
        const std::string where =
            "row " + std::to_string(c.q0[z(b)] + i) + " head " + std::to_string(g) + " entry ";
        std::vector<char> seen(z(std::max<Index>(1, lim)), 0);
        for (Index e = 0; e < c.count; ++e) {
          const std::string here = where + std::to_string(e);
          if (e >= n) {
            if (got[e] != -1) return here + ": want -1, got " + std::to_string(got[e]);
            if (c.p.return_value && !(c.val[z(at + e)] == ninf)) return here + ": value not -inf";
            continue;
          }
          if (got[e] < 0 || got[e] >= lim || seen[z(got[e])])
            return here + ": " + std::to_string(got[e]) + " not a new key of [0, " +
                   std::to_string(lim) + ")";
          seen[z(got[e])] = 1;
          const double sg = s[got[e]], sw = s[want[e]];
          if (std::fabs(sg - sw) > 1e-4 * (1 + std::fabs(sw)) || (c.exact && got[e] != want[e]))
            return here + ": key " + std::to_string(got[e]) + " (score " + std::to_string(sg) +
                   "), want key " + std::to_string(want[e]) + " (score " + std::to_string(sw) + ")";
          const double v = c.val[z(at + e)];
          if (c.p.return_value && !(std::fabs(v - sg) <= 1e-4 * (1 + std::fabs(sg))))
            return here + ": value " + std::to_string(v) + ", want " + std::to_string(sg);
        }
      }
  }
  const std::string m = padded_hold(c, c.idx, c.N2 * c.count, -1, "index not -1");
  if (!m.empty()) return m;
  if (c.p.return_value) return padded_hold(c, c.val, c.N2 * c.count, ninf, "value not -inf");
  if (c.values_given &&
      !std::all_of(c.val.begin(), c.val.end(), [](float x) { return x == kSentinel; }))
    return "sparse_values written with return_value false";
  return "";
}

// ---- Perturbations ---------------------------------------------------------------------------

template <class C>
using Ok = bool (*)(const C&);
template <class C>
using Change = void (*)(C&, R&);

// A must-reject edit raising `w`, or a defined one (fine).
template <class C>
fuzz::Perturbation<C> must(const char* n, Ok<C> ok, Change<C> f, Want w = Want::kInvalid) {
  return {n, true, [ok, f, w](C& c, R& r) {
            if (ok != nullptr && !ok(c)) return false;
            f(c, r);
            c.want = w;
            return true;
          }};
}
template <class C>
fuzz::Perturbation<C> fine(const char* n, Ok<C> ok, Change<C> f) {
  return {n, false, [ok, f](C& c, R& r) {
            if (ok != nullptr && !ok(c)) return false;
            f(c, r);
            c.want = Want::kNone;
            return true;
          }};
}

// buf grows to n elements (at least); every view of c into it follows the new storage.
template <class C, class U>
void grow(C& c, std::vector<U>& buf, Index n, U fill) {
  const void* old = buf.data();
  if (z(n) > buf.size()) buf.resize(z(n), fill);
  const auto fix = [&](const std::string&, auto& v) {
    using E = typename std::remove_reference_t<decltype(v)>::element_type;
    if constexpr (std::is_same_v<std::remove_const_t<E>, U>)
      if (static_cast<const void*>(v.data()) == old) v = support::with_data(v, buf.data());
  };
  c.in.for_each_view(fix), c.out.for_each_view(fix);
}

// Dimension d of v (a view of buf) set to e, buf grown to match.
template <class C, class U, class V>
void bump(C& c, std::vector<U>& buf, StridedView<V>& v, int d, Index e, U fill) {
  v = support::resized(v, d, e);
  grow(c, buf, std::max<Index>(1, v.numel()), fill);
}

// A drawn dimension of v one longer (bump), or v absent when the draw is its rank.
template <class C, class U, class V>
void bump_or_drop(C& c, std::vector<U>& buf, StridedView<V>& v, R& r, U fill) {
  const int d = static_cast<int>(r.range(0, v.rank()));
  if (d == v.rank())
    v = {};
  else
    bump(c, buf, v, d, v.size(d) + 1, fill);
}

// The sparse attention's index list of another shape or missing: a drawn dimension one longer,
// no K (any K > 0 is a shape), or absent.
template <class C>
void indices_shape_or_missing(C& c, R& r) {
  auto& v = c.in.sparse_indices;
  const int d = static_cast<int>(r.range(0, v.rank()));
  if (d == v.rank())
    v = {};
  else if (d == v.rank() - 1)
    v = support::resized(v, d, 0);
  else
    bump(c, c.idx, v, d, v.size(d) + 1, -1);
}

// Calls f(view) on the k-th present view of c (inputs, then outputs) with elements; returns the
// number of such views.
template <class C, class F>
Index on_view(C& c, Index k, F&& f) {
  Index n = 0;
  const auto visit = [&](const std::string&, auto& v) {
    if (v.absent() || v.numel() == 0) return;
    if (n++ == k) f(v);
  };
  c.in.for_each_view(visit), c.out.for_each_view(visit);
  return n;
}

// Some view of c has elements (the query, the key or the block table).
template <class C>
bool has_elements(const C& c) {
  return c.rows() > 0 || c.tokens() > 0 || c.paged();
}

template <class C>
bool any_live(const C& c) {
  return std::any_of(c.qlen.begin(), c.qlen.end(), [](Index l) { return l > 0; });
}

// A random live query row of a batch satisfying ok (b, row), or b = -1.
template <class C>
std::pair<Index, Index> live_row(const C& c, R& r, bool (*ok)(const C&, Index) = nullptr) {
  std::vector<Index> bs;
  for (Index b = 0; b < c.B; ++b)
    if (c.qlen[z(b)] > 0 && (ok == nullptr || ok(c, b))) bs.push_back(b);
  if (bs.empty()) return {-1, 0};
  const Index b = pick(r, bs);
  return {b, c.q0[z(b)] + r.range(0, c.qlen[z(b)] - 1)};
}

// The value a grown buffer is filled with: NaN, or 127 for int8 (no NaN there).
template <class U>
U poison_like(const std::vector<U>&) {
  if constexpr (std::is_same_v<U, std::int8_t>)
    return 127;
  else
    return U(kNaN);
}

// pre_tokens / next_tokens, for the operators that have them (dsa_step has not).
template <class P>
auto set_tokens(P& p, R& r) -> decltype(p.pre_tokens, void()) {
  (r.chance(0.5) ? p.pre_tokens : p.next_tokens) =
      pick<i64>(r, {0, 1, 2048, -1, std::numeric_limits<i64>::max() - 1});
}
inline void set_tokens(attnref::DsaStepParams&, R&) {}
template <class C>
bool has_tokens(const C&) {
  return !std::is_same_v<decltype(C::p), attnref::DsaStepParams>;
}

// The perturbations of the shared geometry, the common params and views.
template <class C>
std::vector<fuzz::Perturbation<C>> common() {
  using P = fuzz::Perturbation<C>;
  const Ok<C> bsnd_q = [](const C& c) { return !c.qtnd(); };
  const Ok<C> tnd_q = [](const C& c) { return c.qtnd(); };
  const Ok<C> paged = [](const C& c) { return c.paged(); };
  return std::vector<P>{
      must<C>(
          "query lengths out of range (BSND)",
          [](const C& c) { return !c.qtnd() && !c.in.actual_seq_lengths_query.empty(); },
          [](C& c, R& r) {
            c.in.actual_seq_lengths_query[z(r.range(0, c.B - 1))] =
                r.chance(0.5) ? c.S1 + r.range(1, 3) : -r.range(1, 3);
          }),
      must<C>("query lengths not one per batch (BSND)", bsnd_q,
              [](C& c, R& r) {
                auto& l = c.in.actual_seq_lengths_query;
                if (l.empty()) l.assign(z(c.B), c.S1);
                if (c.B > 1 && r.chance(0.5))
                  l.pop_back();
                else
                  l.push_back(r.range(0, c.S1));
              }),
      must<C>("query lengths not cumulative (TND)", tnd_q,
              [](C& c, R& r) {
                auto& l = c.in.actual_seq_lengths_query;
                const Index b = r.range(0, c.B - 1);
                l[z(b)] = (b > 0 ? l[z(b - 1)] : 0) - 1;
              }),
      must<C>("query lengths not ending at T (TND)", tnd_q,
              [](C& c, R& r) {
                auto& l = c.in.actual_seq_lengths_query;
                l.back() = c.T1 > 0 && r.chance(0.5) ? c.T1 - 1 : c.T1 + r.range(1, 3);
              }),
      must<C>("query lengths missing (TND)", tnd_q,
              [](C& c, R&) { c.in.actual_seq_lengths_query.clear(); }),
      must<C>(
          "key lengths past the keys (BSND, PA_BSND)",
          [](const C& c) { return c.kl != "TND" && !c.klens.empty(); },
          [](C& c, R& r) {
            klens_of(c)[z(r.range(0, c.B - 1))] = (c.paged() ? c.mb * c.bs : c.S2) + r.range(1, 3);
          }),
      must<C>(
          "key lengths negative (BSND, PA_BSND)",
          [](const C& c) { return c.kl != "TND" && !c.klens.empty(); },
          [](C& c, R& r) { klens_of(c)[z(r.range(0, c.B - 1))] = -r.range(1, 5); }),
      must<C>("key lengths not one per batch", nullptr,
              [](C& c, R& r) {
                auto& l = klens_of(c);
                if (l.empty()) l.assign(z(c.B), c.S2);
                if (c.B > 1 && r.chance(0.5))
                  l.pop_back();
                else
                  l.push_back(l.back());
              }),
      must<C>(
          "key lengths missing (TND, PA_BSND)", [](const C& c) { return c.kl != "BSND"; },
          [](C& c, R&) { klens_of(c).clear(); }),
      must<C>(
          "key lengths not cumulative or not ending at T (TND)",
          [](const C& c) { return c.kl == "TND"; },
          [](C& c, R& r) {
            auto& l = klens_of(c);
            const Index b = r.range(0, c.B - 1);
            if (r.chance(0.5))
              l[z(b)] = (b > 0 ? l[z(b - 1)] : 0) - 1;
            else
              l.back() = c.T2 + r.range(1, 3);
          }),
      must<C>(
          "block table entry out of the pool",
          [](const C& c) {
            return c.paged() && *std::max_element(c.klen.begin(), c.klen.end()) > 0;
          },
          [](C& c, R& r) {
            Index b = -1;
            while (b < 0 || c.klen[z(b)] == 0) b = r.range(0, c.B - 1);
            c.table[z(b * c.mb + r.range(0, c.pblocks(b) - 1))] =
                pick<i32>(r, {-1, static_cast<i32>(c.nb), static_cast<i32>(c.nb + 7),
                              std::numeric_limits<i32>::max(), std::numeric_limits<i32>::min()});
          },
          Want::kRange),
      must<C>("block table missing (PA_BSND)", paged, [](C& c, R&) { c.in.block_table = {}; }),
      must<C>(
          "block table without PA_BSND", [](const C& c) { return !c.paged(); },
          [](C& c, R&) {
            c.table.assign(z(c.B), 0);
            c.in.block_table = StridedView<const i32>(c.table.data(), {c.B, 1});
          }),
      must<C>("block table shape", paged,
              [](C& c, R& r) {
                const Shape s[] = {{c.B + 1, c.mb}, {c.B * c.mb}, {c.B, 0}, {c.B, c.mb, 1}};
                c.in.block_table = support::reshaped(c.in.block_table, s[r.range(0, 3)]);
                c.table.resize(z((c.B + 1) * c.mb), -1);  // in bounds if wrongly accepted
                c.in.block_table = support::with_data(c.in.block_table, c.table.data());
              }),
      must<C>("unknown query layout", nullptr,
              [](C& c, R& r) {
                c.p.layout_query = pick<std::string>(r, {"BSH", "BNSD", "tnd"});
              }),
      must<C>("unknown key layout", nullptr,
              [](C& c, R& r) {
                klayout_of(c) = pick<std::string>(r, {"BNSD", "PA_TND", "bsnd", "PA_BNSD"});
              }),
      must<C>("query of the other rank", nullptr,
              [](C& c, R&) {
                c.in.query = support::reshaped(c.in.query, c.qtnd() ? Shape{1, c.T1, c.N1, c.D}
                                                                    : Shape{c.B * c.S1, c.N1, c.D});
              }),
      must<C>("key of the other rank", nullptr,
              [](C& c, R&) {
                const Index n = c.tokens();
                c.in.key = support::reshaped(
                    c.in.key, c.kl == "TND" ? Shape{1, n, c.N2, c.D} : Shape{n, c.N2, c.D});
              }),
      must<C>("key head size differs", nullptr,
              [](C& c, R& r) {
                bump(c, c.k, c.in.key, c.in.key.rank() - 1, c.D + r.range(1, 2), poison_like(c.k));
              }),
      must<C>(
          "query heads not a multiple of the key heads", [](const C& c) { return c.N2 > 1; },
          [](C& c, R&) {
            bump(c, c.q, c.in.query, c.in.query.rank() - 2, c.N1 + 1, poison_like(c.q));
          }),
      must<C>(
          "key batch differs (BSND)", [](const C& c) { return c.kl == "BSND"; },
          [](C& c, R& r) {
            bump(c, c.k, c.in.key, 0, c.B + (c.B > 1 && r.chance(0.5) ? -1 : 1), poison_like(c.k));
          }),
      must<C>("query or key without heads or head size", nullptr,
              [](C& c, R& r) {
                const auto cut = [&r](auto& v) {
                  v = support::resized(v, v.rank() - static_cast<int>(r.range(1, 2)), 0);
                };
                if (r.chance(0.5))
                  cut(c.in.query);
                else
                  cut(c.in.key);
              }),
      must<C>("null data with elements", has_elements<C>,
              [](C& c, R& r) {
                const Index n = on_view(c, -1, [](auto&) {});
                on_view(c, r.range(0, n - 1), [](auto& v) { v = support::with_data(v, nullptr); });
              }),
      must<C>("negative extent", has_elements<C>,
              [](C& c, R& r) {
                const Index n = on_view(c, -1, [](auto&) {});
                on_view(c, r.range(0, n - 1), [&r](auto& v) {
                  v = support::resized(v, static_cast<int>(r.range(0, v.rank() - 1)), -1);
                });
              }),
      must<C>("extents overflowing 64 bits", has_elements<C>,
              [](C& c, R& r) {
                const Index n = on_view(c, -1, [](auto&) {});
                on_view(c, r.range(0, n - 1), [](auto& v) {
                  Shape s(z(v.rank()), 1);
                  s[0] = s[1] = kHuge;
                  v = support::reshaped(v, s);
                });
              }),
      must<C>("sparse_mode not 0 or 3", nullptr,
              [](C& c, R& r) {
                c.p.sparse_mode = pick<i64>(r, {1, 2, 4, -1});
              }),
      must<C>("pre_tokens / next_tokens not the default", has_tokens<C>,
              [](C& c, R& r) { set_tokens(c.p, r); }),
      must<C>("exec config negative", nullptr,
              [](C& c, R& r) {
                const int which = static_cast<int>(r.range(0, 2));
                if (which == 0) c.ex.threads = -1;
                if (which == 1) c.ex.q_tile = -2;
                if (which == 2) c.ex.kv_tile = std::numeric_limits<Index>::min();
              }),
      must<C>("strict with a research shape", nullptr, [](C& c, R&) { c.p.strict = true; }),
      fine<C>("garbage in the block table past each batch's blocks", paged,
              [](C& c, R& r) {
                for (Index b = 0; b < c.B; ++b)
                  for (Index j = c.pblocks(b); j < c.mb; ++j)
                    c.table[z(b * c.mb + j)] = pick<i32>(
                        r, {std::numeric_limits<i32>::max(), std::numeric_limits<i32>::min(),
                            static_cast<i32>(r.range(-999, 999))});
              }),
  };
}

// The index-list and scalar rules sparse_flash_attention and its int8-cache form share.
template <class C>
std::vector<fuzz::Perturbation<C>> sparse_rules() {
  return {must<C>(
              "index past the batch's blocks", any_live<C>,
              [](C& c, R& r) {
                const auto [b, row] = live_row(c, r);
                c.idx[z((row * c.N2 + r.range(0, c.N2 - 1)) * c.K + r.range(0, c.K - 1))] =
                    static_cast<i32>(sblocks(c, b) + pick<Index>(r, {0, 0, 1, 1 << 20}));
              },
              Want::kRange),
          must<C>(
              "index below -1", any_live<C>,
              [](C& c, R& r) {
                const auto [b, row] = live_row(c, r);
                (void)b;
                c.idx[z((row * c.N2 + r.range(0, c.N2 - 1)) * c.K + r.range(0, c.K - 1))] =
                    pick<i32>(r, {-2, -3, std::numeric_limits<i32>::min()});
              },
              Want::kRange),
          must<C>(
              "valid index after -1",
              [](const C& c) {
                if (c.K < 2) return false;
                for (Index b = 0; b < c.B; ++b)
                  if (c.qlen[z(b)] > 0 && sblocks(c, b) > 0) return true;
                return false;
              },
              [](C& c, R& r) {
                const auto [b, row] = live_row<C>(
                    c, r, +[](const C& x, Index bb) { return sblocks(x, bb) > 0; });
                const Index at = (row * c.N2 + r.range(0, c.N2 - 1)) * c.K;
                const Index e1 = r.range(0, c.K - 2), e2 = r.range(e1 + 1, c.K - 1);
                c.idx[z(at + e1)] = -1;
                c.idx[z(at + e2)] = static_cast<i32>(r.range(0, sblocks(c, b) - 1));
              }),
          must<C>("sparse_block_size out of range", nullptr,
                  [](C& c, R& r) {
                    c.p.sparse_block_size = pick<i64>(r, {0, -1, (i64{1} << 30) + 1, kHuge});
                  }),
          must<C>("scale_value not finite", nullptr,
                  [](C& c, R& r) {
                    c.p.scale_value =
                        pick<double>(r, {std::nan(""), std::numeric_limits<double>::infinity(),
                                         -std::numeric_limits<double>::infinity()});
                  }),
          must<C>("attention_mode not 2", nullptr, [](C& c, R& r) {
            c.p.attention_mode = pick<i64>(r, {0, 1, 3});
          })};
}

const std::vector<fuzz::Perturbation<Sfa>>& sfa_perturbations() {
  using C = Sfa;
  static const std::vector<fuzz::Perturbation<C>> list = [] {
    std::vector<fuzz::Perturbation<C>> l = common<C>();
    for (auto& x : sparse_rules<C>()) l.push_back(x);
    const std::vector<fuzz::Perturbation<C>> own{
        must<C>("return_softmax_lse (not implemented)", nullptr,
                [](C& c, R&) { c.p.return_softmax_lse = true; }),
        must<C>("value of another shape", nullptr,
                [](C& c, R& r) {
                  if (c.value_mode != 2) {  // its own tensor, then misshapen
                    c.value_mode = 2, fill_keys(c, r, c.D, c.v);
                    c.in.value = StridedView<const float>(c.v.data(), c.kshape(c.D));
                  }
                  const int d = static_cast<int>(r.range(0, c.in.value.rank() - 1));
                  bump(c, c.v, c.in.value, d, c.in.value.size(d) + 1, kNaN);
                }),
        must<C>("query_rope or key_rope missing", nullptr,
                [](C& c, R& r) { (r.chance(0.5) ? c.in.query_rope : c.in.key_rope) = {}; }),
        must<C>("query_rope of another shape", nullptr,
                [](C& c, R& r) {
                  const int d = static_cast<int>(r.range(0, c.in.query_rope.rank() - 1));
                  const Index e = c.in.query_rope.size(d);
                  bump(c, c.qr, c.in.query_rope, d, e > 1 && r.chance(0.5) ? e - 1 : e + 1, kNaN);
                }),
        must<C>("key_rope of another shape", nullptr,
                [](C& c, R& r) {
                  const int d = static_cast<int>(r.range(0, c.in.key_rope.rank() - 1));
                  bump(c, c.kr, c.in.key_rope, d, c.in.key_rope.size(d) + 1, kNaN);
                }),
        must<C>("sparse_indices of another shape or missing", nullptr,
                [](C& c, R& r) { indices_shape_or_missing(c, r); }),
        must<C>("attention_out of another shape or missing", nullptr,
                [](C& c, R& r) { bump_or_drop(c, c.o, c.out.attention_out, r, kSentinel); }),
        must<C>(
            "attention_out overlapping the query", [](const C& c) { return c.rows() > 0; },
            [](C& c, R&) {
              c.out.attention_out = support::with_data(c.out.attention_out, c.q.data());
            }),
        must<C>("strict: one vendor rule broken", nullptr,
                [](C& c, R& r) {
                  c = C{};
                  draw_sfa(c, r, {true, static_cast<int>(r.range(0, 7))});
                }),
        // Unusual but defined.
        fine<C>("the vendor's shapes (strict)", nullptr,
                [](C& c, R& r) {
                  c = C{};
                  draw_sfa(c, r, {true, -1});
                }),
        fine<C>("every list all -1", nullptr,
                [](C& c, R&) {
                  for (Index b = 0; b < c.B; ++b)
                    std::fill(c.idx.begin() + c.q0[z(b)] * c.N2 * c.K,
                              c.idx.begin() + (c.q0[z(b)] + c.qlen[z(b)]) * c.N2 * c.K, -1);
                }),
        fine<C>("every entry past its row's limit", nullptr,
                [](C& c, R& r) { fill_lists(c, r, true); }),
        fine<C>("sparse_block_size 2^30 (one block per batch)", nullptr,
                [](C& c, R& r) {
                  c.sbs = Index{1} << 30, c.p.sparse_block_size = c.sbs;
                  fill_lists(c, r);
                }),
        fine<C>("more slots than blocks", nullptr,
                [](C& c, R& r) {
                  c.K = r.range(7, 24);
                  fill_lists(c, r);
                  c.in.sparse_indices = StridedView<const i32>(c.idx.data(), c.qshape(c.N2, c.K));
                }),
        fine<C>("value: the key's view", nullptr,
                [](C& c, R&) {
                  c.value_mode = 1;
                  c.in.value = c.in.key;
                }),
    };
    l.insert(l.end(), own.begin(), own.end());
    return l;
  }();
  return list;
}

// ---- LightningIndexer perturbations -----------------------------------------------------------

const std::vector<fuzz::Perturbation<Li>>& li_perturbations() {
  using C = Li;
  static const std::vector<fuzz::Perturbation<C>> list = [] {
    std::vector<fuzz::Perturbation<C>> l = common<C>();
    const std::vector<fuzz::Perturbation<C>> own{
        must<C>("weights of another shape or missing", nullptr,
                [](C& c, R& r) {
                  auto& v = c.in.weights;
                  const int d = static_cast<int>(r.range(0, v.rank()));
                  if (d == v.rank())
                    v = r.chance(0.5) ? StridedView<const float>{}
                                      : support::reshaped(v, c.qshape(c.N1, 1));
                  else
                    bump(c, c.w, v, d, v.size(d) + 1, kNaN);
                }),
        must<C>("sparse_indices of another shape or missing", nullptr,
                [](C& c, R& r) { bump_or_drop(c, c.idx, c.out.sparse_indices, r, kIdxSentinel); }),
        must<C>(
            "sparse_values of another shape or missing (return_value)",
            [](const C& c) { return c.p.return_value; },
            [](C& c, R& r) { bump_or_drop(c, c.val, c.out.sparse_values, r, kSentinel); }),
        must<C>(
            "return_value with PA_BSND", [](const C& c) { return c.paged(); },
            [](C& c, R&) {
              c.p.return_value = true;
              c.out.sparse_values = StridedView<float>(c.val.data(), c.qshape(c.N2, c.count));
            }),
        must<C>("sparse_count out of range", nullptr,
                [](C& c, R& r) {
                  c.p.sparse_count = pick<i64>(r, {0, -1, (i64{1} << 24) + 1});
                }),
        must<C>("sparse_count differs from the outputs", nullptr,
                [](C& c, R&) { c.p.sparse_count = c.count + 1; }),
        must<C>(
            "an output overlapping an input", [](const C& c) { return c.rows() > 0; },
            [](C& c, R& r) {  // an input view with elements, at least as large as the output
              std::vector<float*> at;
              for (auto* x : {&c.q, &c.k, &c.w})
                if (x->size() >= c.idx.size() && (x != &c.k || c.tokens() > 0))
                  at.push_back(x->data());
              if (at.empty()) {  // the outputs share memory instead
                c.values_given = true;
                c.out.sparse_values = StridedView<float>(reinterpret_cast<float*>(c.idx.data()),
                                                         c.qshape(c.N2, c.count));
                return;
              }
              float* p = pick(r, at);
              if (c.values_given && r.chance(0.5))
                c.out.sparse_values = support::with_data(c.out.sparse_values, p);
              else
                c.out.sparse_indices =
                    support::with_data(c.out.sparse_indices, reinterpret_cast<i32*>(p));
            }),
        must<C>(
            "sparse_values sharing sparse_indices' memory",
            [](const C& c) { return c.values_given && c.rows() > 0; },
            [](C& c, R&) {
              c.out.sparse_values =
                  support::with_data(c.out.sparse_values, reinterpret_cast<float*>(c.idx.data()));
            }),
        must<C>("strict: one vendor rule broken", nullptr,
                [](C& c, R& r) {
                  c = C{};
                  draw_li(c, r, {true, static_cast<int>(r.range(0, 5))});
                }),
        // Unusual but defined.
        fine<C>("the vendor's shapes (strict)", nullptr,
                [](C& c, R& r) {
                  c = C{};
                  draw_li(c, r, {true, -1});
                }),
        fine<C>("every score 0 (ties: the lower key first)", nullptr,
                [](C& c, R&) {
                  for (float& x : c.q)
                    if (x == x) x = 0.0f;
                  c.exact = true;
                }),
        fine<C>("keys repeated (exact ties)", nullptr,
                [](C& c, R& r) {
                  for (Index b = 0; b < c.B; ++b)
                    for (Index t = 1; t < c.klen[z(b)]; ++t)
                      if (r.chance(0.5))
                        std::copy_n(c.k.begin() + c.tok(b, t - 1) * c.N2 * c.D, c.N2 * c.D,
                                    c.k.begin() + c.tok(b, t) * c.N2 * c.D);
                }),
        fine<C>(
            "sparse_values of another shape without return_value (ignored)",
            [](const C& c) { return !c.p.return_value; },
            [](C& c, R& r) {
              c.values_given = true;
              c.out.sparse_values = StridedView<float>(
                  c.val.data(), Shape{std::max<Index>(1, c.rows()), r.range(1, 3)});
            }),
        fine<C>("sparse_count far past every length", nullptr,
                [](C& c, R& r) {
                  c.count = r.range(41, 100), c.p.sparse_count = c.count;
                  c.idx.assign(z(std::max<Index>(1, c.rows() * c.N2 * c.count)), kIdxSentinel);
                  c.val.assign(c.idx.size(), kSentinel);
                  set_views(c);
                }),
    };
    l.insert(l.end(), own.begin(), own.end());
    return l;
  }();
  return list;
}

// ---- QuantLightningIndexer -------------------------------------------------------------------

using attnref::bfloat16;
using attnref::half;
using i8 = std::int8_t;

constexpr i8 kPoison8 = 127;  // int8 has no NaN: unused rows hold the largest value

// A query-side tensor of hw values per row: gen() in live rows, `pad` in padded ones.
template <class U, class G>
void fill_rows_with(const Geo& g, Index hw, std::vector<U>& buf, U pad, G&& gen) {
  buf.assign(z(std::max<Index>(1, g.rows() * hw)), pad);
  for (Index b = 0; b < g.B; ++b)
    for (Index i = 0; i < g.qlen[z(b)]; ++i)
      for (Index e = 0; e < hw; ++e) buf[z((g.q0[z(b)] + i) * hw + e)] = gen();
}
// A key-side tensor of width w per head: gen() in every row a batch owns, `pad` elsewhere.
template <class U, class G>
void fill_keys_with(const Geo& g, Index w, std::vector<U>& buf, U pad, G&& gen) {
  buf.assign(z(std::max<Index>(1, g.tokens() * g.N2 * w)), pad);
  for (Index b = 0; b < g.B; ++b)
    for (Index t = 0; t < g.klen[z(b)]; ++t)
      for (Index e = 0; e < g.N2 * w; ++e) buf[z(g.tok(b, t) * g.N2 * w + e)] = gen();
}
// The live rows of batch b (hw values each) / its key rows (N2 · w per token) as doubles.
template <class U>
std::vector<double> rows_as(const Geo& g, Index b, const std::vector<U>& x, Index hw) {
  std::vector<double> to;
  for (Index i = 0; i < g.qlen[z(b)]; ++i)
    for (Index e = 0; e < hw; ++e) to.push_back(support::dbl(x[z((g.q0[z(b)] + i) * hw + e)]));
  return to;
}
template <class U>
std::vector<double> keys_as(const Geo& g, Index b, const std::vector<U>& x, Index w) {
  std::vector<double> to;
  for (Index t = 0; t < g.klen[z(b)]; ++t)
    for (Index e = 0; e < g.N2 * w; ++e)
      to.push_back(support::dbl(x[z(g.tok(b, t) * g.N2 * w + e)]));
  return to;
}

struct Qli : Geo {
  Index count = 1;
  bool exact = false;  // small integers, power-of-2 positive scales: every fp32 step exact
  std::vector<i8> q, k;
  std::vector<half> w, qs, ks;
  std::vector<i32> idx;
  std::vector<i64> qlens, klens;
  attnref::QuantLightningIndexerParams p;
  attnref::QuantLightningIndexerInputs in;
  attnref::QuantLightningIndexerOutputs out;
};

std::vector<i64>& klens_of(Qli& c) { return c.in.actual_seq_lengths_key; }
std::string& klayout_of(Qli& c) { return c.p.layout_key; }

void set_views(Qli& c) {
  using CH = StridedView<const half>;
  c.in = {}, c.out = {};
  c.in.query = StridedView<const i8>(c.q.data(), c.qshape(c.N1, c.D));
  c.in.key = StridedView<const i8>(c.k.data(), c.kshape(c.D));
  Shape ws = c.qshape(c.N1, 1), kss = c.kshape(1);
  ws.pop_back(), kss.pop_back();
  c.in.weights = CH(c.w.data(), ws);
  c.in.query_dequant_scale = CH(c.qs.data(), ws);
  c.in.key_dequant_scale = CH(c.ks.data(), kss);
  if (c.paged()) c.in.block_table = StridedView<const i32>(c.table.data(), {c.B, c.mb});
  c.in.actual_seq_lengths_query = c.qlens;
  c.in.actual_seq_lengths_key = c.klens;
  c.out.sparse_indices = StridedView<i32>(c.idx.data(), c.qshape(c.N2, c.count));
}

// A dequantization scale: exact cases 2^[-4, 4]; else a power of 2 in 2^[-6, 6] or an arbitrary
// value, either sign.
half draw_scale(R& r, bool exact) {
  const float p2 = std::ldexp(1.0f, static_cast<int>(r.range(exact ? -4 : -6, exact ? 4 : 6)));
  if (exact) return half(p2);
  const float sign = r.chance(0.25) ? -1.0f : 1.0f;
  return half(sign * (r.chance(0.5) ? p2 : std::fabs(r.normal()) * 2.0f + 1e-3f));
}

void draw_qli(Qli& c, R& r, Vendor f) {
  draw_indexer_shape(c, r, f);
  if (f.broken == 5) c.count = pick<Index>(r, {2049, 2050, 3072, 4096});
  c.exact = r.chance(0.25);
  const bool ex = c.exact;
  const auto int8 = [&r, ex] {  // the full range, extremes often
    if (ex) return static_cast<i8>(r.range(-3, 3));
    return static_cast<i8>(r.chance(0.1) ? pick<Index>(r, {-128, 127}) : r.range(-128, 127));
  };
  const half hnan(kNaN);
  fill_rows_with(c, c.N1 * c.D, c.q, kPoison8, int8);
  fill_keys_with(c, c.D, c.k, kPoison8, int8);
  fill_rows_with(c, c.N1, c.w, hnan, [&r, ex] {
    return half(ex ? static_cast<float>(r.range(-4, 4)) : 2.0f * r.normal());
  });
  fill_rows_with(c, c.N1, c.qs, hnan, [&r, ex] { return draw_scale(r, ex); });
  fill_keys_with(c, 1, c.ks, hnan, [&r, ex] { return draw_scale(r, ex); });
  c.idx.assign(z(std::max<Index>(1, c.rows() * c.N2 * c.count)), kIdxSentinel);
  c.p = {};
  c.p.layout_query = c.ql, c.p.layout_key = c.kl;
  c.p.sparse_count = c.count;
  c.p.sparse_mode = c.causal ? 3 : 0;
  c.p.strict = f.on;
  draw_exec(c, r);
  set_views(c);
}

void build_qli(Qli& c, R& r) { draw_qli(c, r, {}); }

// x rounded to fp16 (nearest even), through float (exact: x is a product of two fp16 values or
// an integer / 1024 below 2^12 here).
double fp16(double x) { return support::dbl(half(static_cast<float>(x))); }

// The quantized indexer's scores [q_len][N2][kv_len] (a copy of ref::dsa::quant_indexer_topk's
// score, which it does not return) and their magnitudes |ks| · Σ |w' · r| (for the tolerance).
void qli_scores(const ref::dsa::Shape& sh, const ref::dsa::Batch& x, const std::vector<double>& qs,
                const std::vector<double>& ks, std::vector<double>& score,
                std::vector<double>& mag) {
  const int G = sh.N1 / sh.N2;
  score.assign(z(long{x.q_len} * sh.N2 * x.kv_len), 0.0), mag = score;
  for (int i = 0; i < x.q_len; ++i)
    for (int g = 0; g < sh.N2; ++g)
      for (long s = 0; s < x.kv_len; ++s) {
        double total = 0.0, m = 0.0;
        for (int j = 0; j < G; ++j) {
          const long h = g * G + j, wi = long{i} * sh.N1 + h;
          double dot = 0.0;
          for (int e = 0; e < sh.D; ++e)
            dot += x.q[z(wi * sh.D + e)] * x.k[z((s * sh.N2 + g) * sh.D + e)];
          const double t = fp16(x.w[z(wi)] * qs[z(wi)]) * fp16(std::max(0.0, dot) / 1024.0);
          total += t, m += std::fabs(t);
        }
        const size_t at = z((long{i} * sh.N2 + g) * x.kv_len + s);
        const double k = ks[z(s * sh.N2 + g)];
        score[at] = total * k, mag[at] = m * std::fabs(k);
      }
}

std::string verify_qli(const Qli& c) {
  ref::dsa::Shape sh;
  sh.N1 = static_cast<int>(c.N1), sh.N2 = static_cast<int>(c.N2);
  sh.D = static_cast<int>(c.D), sh.causal = c.causal;
  for (Index b = 0; b < c.B; ++b) {
    ref::dsa::Batch x;
    x.q_len = static_cast<int>(c.qlen[z(b)]), x.kv_len = static_cast<long>(c.klen[z(b)]);
    x.q = rows_as(c, b, c.q, c.N1 * c.D), x.w = rows_as(c, b, c.w, c.N1);
    x.k = keys_as(c, b, c.k, c.D);
    const std::vector<double> qs = rows_as(c, b, c.qs, c.N1), ks = keys_as(c, b, c.ks, 1);
    const std::vector<i32> top =
        ref::dsa::quant_indexer_topk(sh, x, qs, ks, static_cast<long>(c.count));
    std::vector<double> score, mag;
    qli_scores(sh, x, qs, ks, score, mag);
    for (Index i = 0; i < c.qlen[z(b)]; ++i)
      for (Index g = 0; g < c.N2; ++g) {
        const i32* got = c.idx.data() + ((c.q0[z(b)] + i) * c.N2 + g) * c.count;
        const i32* want = top.data() + (i * c.N2 + g) * c.count;
        const double* s = score.data() + (i * c.N2 + g) * c.klen[z(b)];
        const double* m = mag.data() + (i * c.N2 + g) * c.klen[z(b)];
        const auto tol = [&](i32 a, i32 bb) { return 1e-5 * (m[a] + m[bb]); };
        const Index lim = c.limit(b, i), n = std::min(lim, c.count);
        const std::string where =
            "row " + std::to_string(c.q0[z(b)] + i) + " head " + std::to_string(g) + " entry ";
        std::vector<char> seen(z(std::max<Index>(1, lim)), 0);
        for (Index e = 0; e < c.count; ++e) {
          const std::string here = where + std::to_string(e);
          if (e >= n) {
            if (got[e] != -1) return here + ": want -1, got " + std::to_string(got[e]);
            continue;
          }
          if (got[e] < 0 || got[e] >= lim || seen[z(got[e])])
            return here + ": " + std::to_string(got[e]) + " not a new key of [0, " +
                   std::to_string(lim) + ")";
          seen[z(got[e])] = 1;
          const double sg = s[got[e]], sw = s[want[e]];
          if (c.exact ? got[e] != want[e] : std::fabs(sg - sw) > tol(got[e], want[e]))
            return here + ": key " + std::to_string(got[e]) + " (score " + std::to_string(sg) +
                   "), want key " + std::to_string(want[e]) + " (score " + std::to_string(sw) + ")";
          // Against this file's own scores: descending, nothing left out scores higher.
          if (e > 0 && sg > s[got[e - 1]] + tol(got[e], got[e - 1]))
            return here + ": not descending in the scores";
        }
        for (Index t = 0; t < lim && n > 0 && n < lim; ++t)
          if (!seen[z(t)] && s[t] > s[got[n - 1]] + tol(static_cast<i32>(t), got[n - 1]))
            return where + std::to_string(n - 1) + ": key " + std::to_string(t) +
                   " left out scores higher";
      }
  }
  return padded_hold(c, c.idx, c.N2 * c.count, -1, "index not -1");
}

const std::vector<fuzz::Perturbation<Qli>>& qli_perturbations() {
  using C = Qli;
  static const std::vector<fuzz::Perturbation<C>> list = [] {
    std::vector<fuzz::Perturbation<C>> l = common<C>();
    const std::vector<fuzz::Perturbation<C>> own{
        must<C>("weights of another shape or missing", nullptr,
                [](C& c, R& r) { bump_or_drop(c, c.w, c.in.weights, r, half(kNaN)); }),
        must<C>("query_dequant_scale of another shape or missing", nullptr,
                [](C& c, R& r) {
                  auto& v = c.in.query_dequant_scale;
                  const int d = static_cast<int>(r.range(0, v.rank()));
                  if (d == v.rank())
                    v = r.chance(0.5) ? StridedView<const half>{}
                                      : support::reshaped(v, c.qshape(c.N1, 1));
                  else
                    bump(c, c.qs, v, d, v.size(d) + 1, half(kNaN));
                }),
        must<C>("key_dequant_scale of another shape or missing", nullptr,
                [](C& c, R& r) {
                  auto& v = c.in.key_dequant_scale;
                  const int d = static_cast<int>(r.range(0, v.rank()));
                  if (d == v.rank())
                    v = r.chance(0.5) ? StridedView<const half>{}
                                      : support::reshaped(v, c.kshape(1));
                  else
                    bump(c, c.ks, v, d, v.size(d) + 1, half(kNaN));
                }),
        must<C>("query_quant_mode / key_quant_mode not 0", nullptr,
                [](C& c, R& r) {
                  (r.chance(0.5) ? c.p.query_quant_mode : c.p.key_quant_mode) =
                      pick<i64>(r, {1, 2, -1});
                }),
        must<C>("sparse_indices of another shape or missing", nullptr,
                [](C& c, R& r) { bump_or_drop(c, c.idx, c.out.sparse_indices, r, kIdxSentinel); }),
        must<C>("sparse_count out of range", nullptr,
                [](C& c, R& r) {
                  c.p.sparse_count = pick<i64>(r, {0, -1, (i64{1} << 24) + 1});
                }),
        must<C>("sparse_count differs from the output", nullptr,
                [](C& c, R&) { c.p.sparse_count = c.count + 1; }),
        must<C>(
            "sparse_indices overlapping an input",
            [](const C& c) { return c.rows() > 0 && c.tokens() > 0; },
            [](C& c, R& r) {
              void* at[] = {c.q.data(), c.k.data(), c.w.data(), c.qs.data(), c.ks.data()};
              c.out.sparse_indices =
                  support::with_data(c.out.sparse_indices, static_cast<i32*>(at[r.range(0, 4)]));
            }),
        must<C>("strict: one vendor rule broken", nullptr,
                [](C& c, R& r) {
                  c = C{};
                  draw_qli(c, r, {true, static_cast<int>(r.range(0, 5))});
                }),
        // Unusual but defined.
        fine<C>("the vendor's shapes (strict)", nullptr,
                [](C& c, R& r) {
                  c = C{};
                  draw_qli(c, r, {true, -1});
                }),
        fine<C>("every query 0 (ties: the lower key first)", nullptr,
                [](C& c, R&) {
                  for (Index b = 0; b < c.B; ++b)
                    std::fill(c.q.begin() + c.q0[z(b)] * c.N1 * c.D,
                              c.q.begin() + (c.q0[z(b)] + c.qlen[z(b)]) * c.N1 * c.D, i8{0});
                  c.exact = true;
                }),
        fine<C>("keys and their scales repeated (exact ties)", nullptr,
                [](C& c, R& r) {
                  for (Index b = 0; b < c.B; ++b)
                    for (Index t = 1; t < c.klen[z(b)]; ++t)
                      if (r.chance(0.5)) {
                        std::copy_n(c.k.begin() + c.tok(b, t - 1) * c.N2 * c.D, c.N2 * c.D,
                                    c.k.begin() + c.tok(b, t) * c.N2 * c.D);
                        std::copy_n(c.ks.begin() + c.tok(b, t - 1) * c.N2, c.N2,
                                    c.ks.begin() + c.tok(b, t) * c.N2);
                      }
                }),
        fine<C>("every key scale negative (ReLU before the scale)", nullptr,
                [](C& c, R&) {
                  for (half& x : c.ks)
                    if (!std::isnan(static_cast<float>(x)))
                      x = half(-std::fabs(static_cast<float>(x)));
                }),
        fine<C>("sparse_count far past every length", nullptr,
                [](C& c, R& r) {
                  c.count = r.range(41, 100), c.p.sparse_count = c.count;
                  c.idx.assign(z(std::max<Index>(1, c.rows() * c.N2 * c.count)), kIdxSentinel);
                  set_views(c);
                }),
    };
    l.insert(l.end(), own.begin(), own.end());
    return l;
  }();
  return list;
}

// ---- KvQuantSparseFlashAttention -------------------------------------------------------------

template <class T>
struct Kvq : Geo {
  Index nope = 4, rope = 2, tile = 4, K = 1, sbs = 1, width = 1;
  bool junk = false;  // value / key_dequant_scale / value_dequant_scale given (never read)
  std::vector<T> q, o;
  std::vector<i8> k, vj;
  std::vector<float> ksj, vsj;
  std::vector<i32> idx;
  std::vector<i64> qlens, klens;
  attnref::KvQuantSparseFlashAttentionParams p;
  attnref::KvQuantSparseFlashAttentionInputs<T> in;
  attnref::KvQuantSparseFlashAttentionOutputs<T> out;
};

template <class T>
std::vector<i64>& klens_of(Kvq<T>& c) {
  return c.in.actual_seq_lengths_kv;
}
template <class T>
std::string& klayout_of(Kvq<T>& c) {
  return c.p.layout_kv;
}

template <class T>
void set_views(Kvq<T>& c) {
  c.in = {}, c.out = {};
  c.in.query = StridedView<const T>(c.q.data(), c.qshape(c.N1, c.D));
  c.in.key = StridedView<const i8>(c.k.data(), c.kshape(c.width));
  if (c.junk) {  // random shapes: never checked against anything, never read
    c.in.value = StridedView<const i8>(c.vj.data(), {Index(c.vj.size())});
    c.in.key_dequant_scale = StridedView<const float>(c.ksj.data(), {1, Index(c.ksj.size())});
    c.in.value_dequant_scale = StridedView<const float>(c.vsj.data(), {Index(c.vsj.size()), 1});
  }
  c.in.sparse_indices = StridedView<const i32>(c.idx.data(), c.qshape(c.N2, c.K));
  if (c.paged()) c.in.block_table = StridedView<const i32>(c.table.data(), {c.B, c.mb});
  c.in.actual_seq_lengths_query = c.qlens;
  c.in.actual_seq_lengths_kv = c.klens;
  c.out.attention_out = StridedView<T>(c.o.data(), c.qshape(c.N1, c.nope));
}

// The packed rows: for every (token, head) a batch owns, nope int8 latent values over the full
// range, rope values in T, one fp32 scale per tile (either sign, powers of 2 or not); 0xFF bytes
// everywhere else (NaN scales and rope values).
template <class T>
void fill_packed(Kvq<T>& c, R& r) {
  c.k.assign(z(std::max<Index>(1, c.tokens() * c.N2 * c.width)), static_cast<i8>(-1));
  for (Index b = 0; b < c.B; ++b)
    for (Index t = 0; t < c.klen[z(b)]; ++t)
      for (Index g = 0; g < c.N2; ++g) {
        i8* row = c.k.data() + (c.tok(b, t) * c.N2 + g) * c.width;
        for (Index x = 0; x < c.nope; ++x)
          row[x] =
              static_cast<i8>(r.chance(0.05) ? pick<Index>(r, {-128, 127}) : r.range(-128, 127));
        for (Index x = 0; x < c.rope; ++x) {
          const T v(r.normal());
          std::memcpy(row + c.nope + x * Index{sizeof(T)}, &v, sizeof(T));
        }
        for (Index j = 0; j < c.nope / c.tile; ++j) {
          const float m = r.chance(0.5) ? std::ldexp(1.0f, static_cast<int>(r.range(-9, -5)))
                                        : std::uniform_real_distribution<float>(0.002f, 0.02f)(r.g);
          const float s = r.chance(0.3) ? -m : m;
          std::memcpy(row + c.nope + c.rope * Index{sizeof(T)} + 4 * j, &s, 4);
        }
      }
}

template <class T>
void draw_kvq(Kvq<T>& c, R& r, Vendor f) {
  static const std::vector<std::string> kls{"BSND", "TND", "PA_BSND"};
  c.ql = r.chance(0.4) ? "TND" : "BSND";
  c.kl = pick(r, kls);
  if (f.on && !c.paged()) c.kl = c.ql;  // paired layouts
  c.B = r.range(1, 3);
  Index kv_max = 40;
  if (!f.on) {
    draw_heads(c, r);
    c.rope = r.range(2, 8), c.tile = r.range(4, 16), c.nope = c.tile * r.range(1, 4);
    c.K = r.range(1, 6), c.sbs = r.range(1, 8), c.bs = r.range(1, 8);
  } else {  // the vendor's shapes: N2 1, N1 a power of 2, 512 + 64, tile 128, blocks of 16 / 32
    kv_max = 24;
    c.N2 = 1, c.N1 = pick<Index>(r, {1, 2, 4, 8});
    c.rope = 64, c.tile = 128, c.nope = 512;
    c.K = r.range(1, 4), c.sbs = pick<Index>(r, {1, 2, 4, 8, 16});
    c.bs = pick<Index>(r, {16, 32});
  }
  c.D = c.nope + c.rope;
  c.width = c.nope + 2 * c.rope + 4 * (c.nope / c.tile);
  draw_geo(c, r, kv_max, c.qlens, c.klens);
  c.causal = r.chance(0.5);
  fill_rows_with(c, c.N1 * c.D, c.q, T(kNaN), [&r] { return T(r.normal()); });
  fill_packed(c, r);
  fill_lists(c, r);
  c.o.assign(z(std::max<Index>(1, c.rows() * c.N1 * c.nope)), T(kSentinel));
  c.junk = r.chance(0.5);
  c.vj.assign(z(r.range(1, 40)), static_cast<i8>(-1));
  c.ksj.assign(z(r.range(1, 9)), kNaN), c.vsj.assign(z(r.range(1, 9)), kNaN);
  c.p = {};
  c.p.scale_value = std::uniform_real_distribution<double>(0.5, 2.0)(r.g) / std::sqrt(double(c.D));
  c.p.sparse_block_size = c.sbs;
  c.p.layout_query = c.ql, c.p.layout_kv = c.kl;
  c.p.sparse_mode = c.causal ? 3 : 0;
  c.p.tile_size = c.tile, c.p.rope_head_dim = c.rope;
  c.p.strict = f.on;
  draw_exec(c, r);
  set_views(c);
}

template <class T>
void build_kvq(Kvq<T>& c, R& r) {
  draw_kvq(c, r, {});
}

// The documented dequantization of the rows of batch b: latent T(float(int8) · scale_t) and the
// rope values as stored, as doubles [kv_len][N2][nope] / [kv_len][N2][rope].
template <class T>
void dequantize(const Kvq<T>& c, Index b, std::vector<double>& lat, std::vector<double>& rope) {
  for (Index t = 0; t < c.klen[z(b)]; ++t)
    for (Index g = 0; g < c.N2; ++g) {
      const i8* row = c.k.data() + (c.tok(b, t) * c.N2 + g) * c.width;
      for (Index x = 0; x < c.nope; ++x) {
        float s;
        std::memcpy(&s, row + c.nope + c.rope * Index{sizeof(T)} + 4 * (x / c.tile), 4);
        lat.push_back(support::dbl(T(static_cast<float>(row[x]) * s)));
      }
      for (Index x = 0; x < c.rope; ++x) {
        T v;
        std::memcpy(static_cast<void*>(&v), row + c.nope + x * Index{sizeof(T)}, sizeof(T));
        rope.push_back(support::dbl(v));
      }
    }
}

template <class T>
std::string verify_kvq(const Kvq<T>& c) {
  ref::dsa::Shape sh;
  sh.N1 = static_cast<int>(c.N1), sh.N2 = static_cast<int>(c.N2);
  sh.D = static_cast<int>(c.nope), sh.Dr = static_cast<int>(c.rope), sh.causal = c.causal;
  std::vector<double> got, want;
  for (Index b = 0; b < c.B; ++b) {
    ref::dsa::Batch x;
    x.q_len = static_cast<int>(c.qlen[z(b)]), x.kv_len = static_cast<long>(c.klen[z(b)]);
    const std::vector<double> q = rows_as(c, b, c.q, c.N1 * c.D);  // [.., N1, nope + rope]
    for (Index h = 0; h < c.qlen[z(b)] * c.N1; ++h) {
      x.q.insert(x.q.end(), q.begin() + h * c.D, q.begin() + h * c.D + c.nope);
      x.qr.insert(x.qr.end(), q.begin() + h * c.D + c.nope, q.begin() + (h + 1) * c.D);
    }
    dequantize(c, b, x.k, x.kr);
    x.v = x.k;
    for (Index i = 0; i < c.qlen[z(b)]; ++i) {
      const Index row = c.q0[z(b)] + i;
      x.idx.insert(x.idx.end(), c.idx.begin() + row * c.N2 * c.K,
                   c.idx.begin() + (row + 1) * c.N2 * c.K);
    }
    const std::vector<double> o = rows_as(c, b, c.o, c.N1 * c.nope);
    got.insert(got.end(), o.begin(), o.end());
    const auto w = ref::dsa::sparse_attention(sh, x, static_cast<long>(c.K),
                                              static_cast<long>(c.sbs), c.p.scale_value);
    want.insert(want.end(), w.begin(), w.end());
  }
  for (Index b = 0; b < c.B && !c.qtnd(); ++b)
    for (Index i = c.qlen[z(b)]; i < c.S1; ++i)
      for (Index e = 0; e < c.N1 * c.nope; ++e)
        if (support::dbl(c.o[z((c.q0[z(b)] + i) * c.N1 * c.nope + e)]) != 0.0)
          return "padded row (b " + std::to_string(b) + ", i " + std::to_string(i) + "): not 0";
  return fuzz::compare(got, want, std::is_same_v<T, half> ? 4e-3 : 3e-2);
}

template <class T>
const std::vector<fuzz::Perturbation<Kvq<T>>>& kvq_perturbations() {
  using C = Kvq<T>;
  static const std::vector<fuzz::Perturbation<C>> list = [] {
    std::vector<fuzz::Perturbation<C>> l = common<C>();
    for (auto& x : sparse_rules<C>()) l.push_back(x);
    const std::vector<fuzz::Perturbation<C>> own{
        must<C>("key_quant_mode / value_quant_mode / quant_scale_repo_mode", nullptr,
                [](C& c, R& r) {
                  const int which = static_cast<int>(r.range(0, 2));
                  (which == 0   ? c.p.key_quant_mode
                   : which == 1 ? c.p.value_quant_mode
                                : c.p.quant_scale_repo_mode) =
                      which == 2 ? pick<i64>(r, {0, 2, 3, -1}) : pick<i64>(r, {0, 1, 3, -1});
                }),
        must<C>("tile_size not dividing the latent part", nullptr,
                [](C& c, R& r) {
                  c.p.tile_size = r.chance(0.3) ? pick<i64>(r, {0, -4}) : c.nope + r.range(1, 3);
                }),
        must<C>(
            "tile_size against the row width", [](const C& c) { return c.nope % 2 == 0; },
            [](C& c, R&) { c.p.tile_size = c.nope / 2 == c.tile ? c.nope : c.nope / 2; }),
        must<C>("rope_head_dim against the query / row width", nullptr,
                [](C& c, R& r) {
                  c.p.rope_head_dim = r.chance(0.2) ? pick<i64>(r, {0, -1, c.D}) : c.rope + c.tile;
                }),
        must<C>("key row width off by one or a few bytes", nullptr,
                [](C& c, R& r) {
                  const Index e = c.width + pick<Index>(r, {-1, 1, 2, -4, 4});
                  bump(c, c.k, c.in.key, c.in.key.rank() - 1, e, static_cast<i8>(-1));
                }),
        must<C>("attention_out with the query's last dimension or another", nullptr,
                [](C& c, R& r) {
                  auto& v = c.out.attention_out;
                  bump(c, c.o, v, v.rank() - 1, r.chance(0.5) ? c.D : c.nope + 1, T(kSentinel));
                }),
        must<C>("attention_out of another shape or missing", nullptr,
                [](C& c, R& r) { bump_or_drop(c, c.o, c.out.attention_out, r, T(kSentinel)); }),
        must<C>("sparse_indices of another shape or missing", nullptr,
                [](C& c, R& r) { indices_shape_or_missing(c, r); }),
        must<C>(
            "attention_out overlapping the query or the key",
            [](const C& c) { return c.rows() > 0; },
            [](C& c, R& r) {
              T* at =
                  r.chance(0.5) || c.tokens() == 0 ? c.q.data() : reinterpret_cast<T*>(c.k.data());
              c.out.attention_out = support::with_data(c.out.attention_out, at);
            }),
        must<C>("value / key_dequant_scale / value_dequant_scale: null data or negative", nullptr,
                [](C& c, R& r) {
                  c.junk = true;
                  set_views(c);
                  const int which = static_cast<int>(r.range(0, 2));
                  const bool null = r.chance(0.5);
                  auto edit = [null](auto& v) {
                    v = null ? support::with_data(v, nullptr) : support::resized(v, 0, -1);
                  };
                  if (which == 0) edit(c.in.value);
                  if (which == 1) edit(c.in.key_dequant_scale);
                  if (which == 2) edit(c.in.value_dequant_scale);
                }),
        // Unusual but defined.
        fine<C>("the vendor's shapes (strict)", nullptr,
                [](C& c, R& r) {
                  c = C{};
                  draw_kvq(c, r, {true, -1});
                }),
        fine<C>("value / scales: junk tensors (never read)", nullptr,
                [](C& c, R&) {
                  c.junk = true;
                  set_views(c);
                }),
        fine<C>("every list all -1", nullptr,
                [](C& c, R&) {
                  for (Index b = 0; b < c.B; ++b)
                    std::fill(c.idx.begin() + c.q0[z(b)] * c.N2 * c.K,
                              c.idx.begin() + (c.q0[z(b)] + c.qlen[z(b)]) * c.N2 * c.K, -1);
                }),
        fine<C>("every entry past its row's limit", nullptr,
                [](C& c, R& r) { fill_lists(c, r, true); }),
        fine<C>("sparse_block_size 2^30 (one block per batch)", nullptr,
                [](C& c, R& r) {
                  c.sbs = Index{1} << 30, c.p.sparse_block_size = c.sbs;
                  fill_lists(c, r);
                }),
        fine<C>("more slots than blocks", nullptr,
                [](C& c, R& r) {
                  c.K = r.range(7, 24);
                  fill_lists(c, r);
                  set_views(c);
                }),
    };
    l.insert(l.end(), own.begin(), own.end());
    return l;
  }();
  return list;
}

// ---- dsa_step ----------------------------------------------------------------------------------

// Which check an edit targets: dsa_step's own, or one of its halves' (reported under dsa_step's
// name with "(in <half>)"); kept with each edit as its description.
enum : int { kByStep = 1, kByLi = 2, kBySfa = 4, kByAny = 7 };

struct StepIn : attnref::DsaStepInputs<float> {
  template <class F>
  void for_each_view(F&& f) {
    f("index_query", index_query), f("weights", weights), f("index_key", index_key);
    f("query", query), f("query_rope", query_rope), f("key", key), f("key_rope", key_rope);
    f("block_table", block_table);
  }
};
struct StepOut : attnref::DsaStepOutputs<float> {
  template <class F>
  void for_each_view(F&& f) {
    f("output", output), f("sparse_indices", sparse_indices);
  }
};

// Geo's N1 / D / N2 (1): the latent query heads, head size and cache heads; Ni / Di the
// indexer's query heads and head size (its key cache: one head).
struct Step : Geo {
  Index Ni = 1, Di = 1, Dr = 1, count = 1;
  bool idx_given = true;
  int by = kByAny;
  std::vector<float> iq, w, ik, q, qr, k, kr, o;
  std::vector<i32> sidx;
  std::vector<i64> qlens, klens;
  attnref::DsaStepParams p;
  StepIn in;
  StepOut out;
};

std::vector<i64>& klens_of(Step& c) { return c.in.actual_seq_lengths_kv; }
std::string& klayout_of(Step& c) { return c.p.layout_kv; }

Shape step_idx_shape(const Step& c) { return c.qshape(1, c.count); }

void set_views(Step& c) {
  using CF = StridedView<const float>;
  c.in = {}, c.out = {};
  c.in.index_query = CF(c.iq.data(), c.qshape(c.Ni, c.Di));
  Shape ws = c.qshape(c.Ni, 1);
  ws.pop_back();
  c.in.weights = CF(c.w.data(), ws);
  c.in.index_key = CF(c.ik.data(), c.kshape(c.Di));
  c.in.query = CF(c.q.data(), c.qshape(c.N1, c.D));
  c.in.query_rope = CF(c.qr.data(), c.qshape(c.N1, c.Dr));
  c.in.key = CF(c.k.data(), c.kshape(c.D));
  c.in.key_rope = CF(c.kr.data(), c.kshape(c.Dr));
  if (c.paged()) c.in.block_table = StridedView<const i32>(c.table.data(), {c.B, c.mb});
  c.in.actual_seq_lengths_query = c.qlens;
  c.in.actual_seq_lengths_kv = c.klens;
  c.out.output = StridedView<float>(c.o.data(), c.qshape(c.N1, c.D));
  if (c.idx_given) c.out.sparse_indices = StridedView<i32>(c.sidx.data(), step_idx_shape(c));
}

void draw_step(Step& c, R& r, bool vendor) {
  static const std::vector<std::string> kls{"BSND", "TND", "PA_BSND"};
  c.ql = r.chance(0.4) ? "TND" : "BSND";
  c.kl = pick(r, kls);
  if (vendor && !c.paged()) c.kl = c.ql;
  c.B = r.range(1, 3);
  c.N2 = 1;
  if (!vendor) {
    c.N1 = r.range(1, 8), c.D = r.range(1, 24), c.Dr = r.range(1, 8);
    c.Ni = r.range(1, 8), c.Di = r.range(1, 24), c.bs = r.range(1, 8);
  } else {  // both operators' vendor shapes
    c.N1 = pick<Index>(r, {1, 2, 4}), c.D = 512, c.Dr = 64;
    c.Ni = r.range(1, 8), c.Di = 128, c.bs = pick<Index>(r, {16, 32});
  }
  draw_geo(c, r, vendor ? 24 : 40, c.qlens, c.klens);
  c.causal = r.chance(0.5);
  c.count = r.chance(0.3) ? r.range(1, 3) : r.chance(0.6) ? r.range(4, 12) : r.range(13, 50);
  fill_rows(c, r, c.Ni * c.Di, c.iq);
  fill_rows(c, r, c.Ni, c.w);
  {
    Geo g = c;
    g.N2 = 1;
    fill_keys(g, r, c.Di, c.ik);
  }
  fill_rows(c, r, c.N1 * c.D, c.q);
  fill_rows(c, r, c.N1 * c.Dr, c.qr);
  fill_keys(c, r, c.D, c.k);
  fill_keys(c, r, c.Dr, c.kr);
  c.o.assign(z(std::max<Index>(1, c.rows() * c.N1 * c.D)), kSentinel);
  c.idx_given = r.chance(0.8);
  c.sidx.assign(z(std::max<Index>(1, c.rows() * c.count)), kIdxSentinel);
  c.p = {};
  c.p.layout_query = c.ql, c.p.layout_kv = c.kl;
  c.p.sparse_count = c.count;
  c.p.sparse_mode = c.causal ? 3 : 0;
  c.p.scale_value =
      std::uniform_real_distribution<double>(0.5, 2.0)(r.g) / std::sqrt(double(c.D + c.Dr));
  c.p.strict = vendor;
  c.by = kByAny;
  draw_exec(c, r);
  set_views(c);
}

void build_step(Step& c, R& r) { draw_step(c, r, false); }

// The two operators called directly on the step's arguments (the same tiling): the indices into
// `idx`, the output into `o` (from the sentinel).
void step_direct(const Step& c, std::vector<i32>& idx, std::vector<float>& o) {
  idx.assign(c.sidx.size(), kIdxSentinel);
  o.assign(c.o.size(), kSentinel);
  attnref::LightningIndexerParams lp;
  lp.layout_query = c.p.layout_query, lp.layout_key = c.p.layout_kv;
  lp.sparse_count = c.p.sparse_count, lp.sparse_mode = c.p.sparse_mode, lp.strict = c.p.strict;
  attnref::LightningIndexerInputs<float> li;
  li.query = c.in.index_query, li.key = c.in.index_key, li.weights = c.in.weights;
  li.block_table = c.in.block_table;
  li.actual_seq_lengths_query = c.in.actual_seq_lengths_query;
  li.actual_seq_lengths_key = c.in.actual_seq_lengths_kv;
  attnref::lightning_indexer(lp, li, {StridedView<i32>(idx.data(), step_idx_shape(c)), {}}, c.ex);
  attnref::SparseFlashAttentionParams sp;
  sp.layout_query = c.p.layout_query, sp.layout_kv = c.p.layout_kv;
  sp.sparse_mode = c.p.sparse_mode, sp.strict = c.p.strict, sp.scale_value = c.p.scale_value;
  sp.sparse_block_size = 1;
  attnref::SparseFlashAttentionInputs<float> si;
  si.query = c.in.query, si.query_rope = c.in.query_rope, si.key = c.in.key;
  si.key_rope = c.in.key_rope, si.block_table = c.in.block_table;
  si.sparse_indices = StridedView<const i32>(idx.data(), step_idx_shape(c));
  si.actual_seq_lengths_query = c.in.actual_seq_lengths_query;
  si.actual_seq_lengths_kv = c.in.actual_seq_lengths_kv;
  attnref::sparse_flash_attention(sp, si, {StridedView<float>(o.data(), c.qshape(c.N1, c.D))},
                                  c.ex);
}

std::string verify_step(const Step& c) {
  std::vector<i32> idx;
  std::vector<float> o;
  try {
    step_direct(c, idx, o);
  } catch (const std::exception& e) {
    return std::string("the direct calls rejected the step's arguments: ") + e.what();
  }
  if (!fuzz::same_bits(o, c.o)) return "output differs from the two operators' (bits)";
  if (c.idx_given
          ? !fuzz::same_bits(idx, c.sidx)
          : !std::all_of(c.sidx.begin(), c.sidx.end(), [](i32 x) { return x == kIdxSentinel; }))
    return c.idx_given ? "sparse_indices differ from the indexer's" : "sparse_indices written";
  // The indexer's lists against ref::dsa (near-ties may swap) ...
  Li li;
  static_cast<Geo&>(li) = static_cast<const Geo&>(c);
  li.N1 = c.Ni, li.D = c.Di, li.count = c.count;
  li.q = c.iq, li.k = c.ik, li.w = c.w, li.idx = idx;
  li.p.return_value = false, li.values_given = false;
  li.val.assign(idx.size(), kSentinel);  // (verify_li reads it)
  std::string m = verify_li(li);
  if (!m.empty()) return "indexer: " + m;
  // ... and the attention over the step's own lists.
  Sfa sfa;
  static_cast<Geo&>(sfa) = static_cast<const Geo&>(c);
  sfa.Dr = c.Dr, sfa.K = c.count, sfa.sbs = 1, sfa.value_mode = 0;
  sfa.q = c.q, sfa.qr = c.qr, sfa.k = c.k, sfa.kr = c.kr, sfa.idx = idx, sfa.o = c.o;
  sfa.p.scale_value = c.p.scale_value;
  m = verify_sfa(sfa);
  return m.empty() ? "" : "attention: " + m;
}

const std::vector<fuzz::Perturbation<Step>>& step_perturbations() {
  using C = Step;
  static const std::vector<fuzz::Perturbation<C>> list = [] {
    std::vector<fuzz::Perturbation<C>> l = common<C>();
    const std::vector<fuzz::Perturbation<C>> own{
        must<C>("index_query head size differs from the index key's", nullptr,
                [](C& c, R& r) {
                  c.by = kByLi;
                  auto& v = c.in.index_query;
                  bump(c, c.iq, v, v.rank() - 1, c.Di + r.range(1, 2), kNaN);
                }),
        must<C>("index_query of the other rank", nullptr,
                [](C& c, R&) {
                  c.by = kByLi;
                  c.in.index_query =
                      support::reshaped(c.in.index_query, c.qtnd() ? Shape{1, c.T1, c.Ni, c.Di}
                                                                   : Shape{c.B * c.S1, c.Ni, c.Di});
                }),
        must<C>("index_key of another head size or head count", nullptr,
                [](C& c, R& r) {
                  c.by = kByLi;
                  auto& v = c.in.index_key;
                  const int d = v.rank() - static_cast<int>(r.range(1, 2));
                  bump(c, c.ik, v, d, v.size(d) + 1, kNaN);
                }),
        must<C>(
            "index_key batch differs (BSND)", [](const C& c) { return c.kl == "BSND"; },
            [](C& c, R&) {
              c.by = kByLi;
              bump(c, c.ik, c.in.index_key, 0, c.B + 1, kNaN);
            }),
        must<C>("weights of another shape or missing", nullptr,
                [](C& c, R& r) {
                  c.by = kByLi;
                  bump_or_drop(c, c.w, c.in.weights, r, kNaN);
                }),
        must<C>("query_rope of another shape or missing", nullptr,
                [](C& c, R& r) {
                  c.by = kBySfa;
                  bump_or_drop(c, c.qr, c.in.query_rope, r, kNaN);
                }),
        must<C>("key_rope of another shape or missing", nullptr,
                [](C& c, R& r) {
                  c.by = kBySfa;
                  bump_or_drop(c, c.kr, c.in.key_rope, r, kNaN);
                }),
        must<C>("output of another shape or missing", nullptr,
                [](C& c, R& r) {
                  c.by = kBySfa;
                  bump_or_drop(c, c.o, c.out.output, r, kSentinel);
                }),
        must<C>(
            "output overlapping the query or the key",
            [](const C& c) { return c.rows() > 0 && c.tokens() > 0; },
            [](C& c, R& r) {
              c.by = kBySfa;
              c.out.output =
                  support::with_data(c.out.output, r.chance(0.5) ? c.q.data() : c.k.data());
            }),
        must<C>("sparse_count out of range", nullptr,
                [](C& c, R& r) {
                  c.by = kByStep;
                  c.p.sparse_count = pick<i64>(r, {0, -1, (i64{1} << 24) + 1});
                }),
        must<C>("sparse_count differs from the sparse_indices output", nullptr,
                [](C& c, R&) {
                  c.by = kByStep;
                  c.idx_given = true;
                  set_views(c);
                  c.p.sparse_count = c.count + 1;
                }),
        must<C>("sparse_indices output of another shape", nullptr,
                [](C& c, R& r) {
                  c.by = kByStep;
                  c.idx_given = true;
                  set_views(c);
                  auto& v = c.out.sparse_indices;
                  const int d = static_cast<int>(r.range(0, v.rank() - 1));
                  bump(c, c.sidx, v, d, v.size(d) + 1, kIdxSentinel);
                }),
        must<C>("sparse_indices output of the other rank", nullptr,
                [](C& c, R&) {
                  c.by = kByStep;
                  c.idx_given = true;
                  set_views(c);
                  c.out.sparse_indices =
                      support::reshaped(c.out.sparse_indices, c.qtnd() ? Shape{c.T1, c.count}
                                                                       : Shape{c.B, c.S1, c.count});
                }),
        must<C>(
            "sparse_indices output overlapping an input or the output",
            [](const C& c) { return c.rows() > 0; },
            [](C& c, R& r) {  // a buffer at least as large as the indices
              c.by = kByStep;
              c.idx_given = true;
              set_views(c);
              std::vector<float*> at;
              for (auto* x : {&c.iq, &c.w, &c.q, &c.qr, &c.o})
                if (x->size() >= c.sidx.size()) at.push_back(x->data());
              if (at.empty()) {  // a larger query
                c.q.resize(c.sidx.size(), kNaN);
                c.in.query = support::with_data(c.in.query, c.q.data());
                at.push_back(c.q.data());
              }
              c.out.sparse_indices =
                  support::with_data(c.out.sparse_indices, reinterpret_cast<i32*>(pick(r, at)));
            }),
        must<C>(
            "output overlapping index_query or weights", [](const C& c) { return c.rows() > 0; },
            [](C& c, R& r) {  // (grown to the output's size)
              c.by = kByStep;
              std::vector<float>& x = r.chance(0.5) ? c.iq : c.w;
              if (x.size() < c.o.size()) x.resize(c.o.size(), kNaN);
              c.in.index_query = support::with_data(c.in.index_query, c.iq.data());
              c.in.weights = support::with_data(c.in.weights, c.w.data());
              c.out.output = support::with_data(c.out.output, x.data());
            }),
        must<C>("strict: a research shape", nullptr, [](C& c, R&) { c.p.strict = true; }),
        // Unusual but defined.
        fine<C>("the vendor's shapes (strict)", nullptr,
                [](C& c, R& r) {
                  c = C{};
                  draw_step(c, r, true);
                }),
        fine<C>("sparse_indices output absent", nullptr,
                [](C& c, R&) {
                  c.idx_given = false;
                  set_views(c);
                }),
        fine<C>("sparse_count past every length (causal MLA over the cache)", nullptr,
                [](C& c, R& r) {
                  c.count = r.range(41, 100), c.p.sparse_count = c.count;
                  c.sidx.assign(z(std::max<Index>(1, c.rows() * c.count)), kIdxSentinel);
                  set_views(c);
                }),
        fine<C>("every index score 0 (ties: the lower key first)", nullptr,
                [](C& c, R&) {
                  for (float& x : c.iq)
                    if (x == x) x = 0.0f;
                }),
    };
    l.insert(l.end(), own.begin(), own.end());
    return l;
  }();
  return list;
}

// ---- Entries ------------------------------------------------------------------------------------

// Runs call; an exception of the type the perturbation must not raise, or any rejection of a
// defined input, becomes a defect (another type than classify() accepts).
template <class F>
void expecting(Want w, F&& call) {
  try {
    call();
  } catch (const std::logic_error& e) {  // (fine: classify() counts a rejection as no defect)
    if (w != Want::kNone) throw;
    throw std::runtime_error(std::string("a defined input rejected: ") + e.what());
  }
}

template <class F>
void expecting_type(Want w, F&& call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    if (w != Want::kRange) throw;
    throw std::runtime_error(std::string("std::invalid_argument, not std::out_of_range: ") +
                             e.what());
  } catch (const std::out_of_range& e) {
    if (w != Want::kInvalid) throw;
    throw std::runtime_error(std::string("std::out_of_range, not std::invalid_argument: ") +
                             e.what());
  }
}

template <class C>
void invoke(C& c, bool run, int threads) {
  attnref::ExecConfig ex = c.ex;
  if (ex.threads >= 0) ex.threads = threads;
  expecting(c.want, [&] {
    expecting_type(c.want, [&] {
      if constexpr (std::is_same_v<C, Sfa>)
        run ? attnref::sparse_flash_attention(c.p, c.in, c.out, ex)
            : attnref::validate(c.p, c.in, c.out, ex);
      else
        run ? attnref::lightning_indexer(c.p, c.in, c.out, ex)
            : attnref::validate(c.p, c.in, c.out, ex);
    });
  });
}

void restride_inputs(Sfa& c, support::Restrider& r) { c.in.for_each_view(r); }
void restride_inputs(Li& c, support::Restrider& r) { c.in.for_each_view(r); }
void validate_only(Sfa& c) { invoke(c, false, 0); }
void validate_only(Li& c) { invoke(c, false, 0); }

void run_sfa(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, sfa_perturbations(), build_sfa, fuzz::Named{"sparse_flash_attention"},
      [seed](Sfa& c) { invoke(c, true, static_cast<int>(seed % 2 + 1)); }, verify_sfa, &Sfa::q,
      &Sfa::qr, &Sfa::k, &Sfa::v, &Sfa::kr, &Sfa::idx,
      static_cast<std::vector<i32> Sfa::*>(&Sfa::table), &Sfa::o);
}

void run_li(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, li_perturbations(), build_li, fuzz::Named{"lightning_indexer"},
      [seed](Li& c) { invoke(c, true, static_cast<int>(seed % 2 + 1)); }, verify_li, &Li::q, &Li::k,
      &Li::w, static_cast<std::vector<i32> Li::*>(&Li::table), &Li::idx, &Li::val);
}

// No divisor: under ASan + UBSan at -O0, 800 cases take ~2.5 s (SFA) and ~1.8 s (LI), within the
// range of the other entries (0.5 s to 24 s).
const fuzz::Register reg_sfa("sparse_flash_attention", run_sfa);
const fuzz::Register reg_li("lightning_indexer", run_li);

// ---- Entries of the quantized operators and dsa_step ------------------------------------------

template <class C, class F>
void invoke_new(C& c, F&& f) {
  expecting(c.want, [&] { expecting_type(c.want, f); });
}

void qli_call(Qli& c, bool run, int threads) {
  attnref::ExecConfig ex = c.ex;
  if (ex.threads >= 0) ex.threads = threads;
  invoke_new(c, [&] {
    run ? attnref::quant_lightning_indexer(c.p, c.in, c.out, ex)
        : attnref::validate(c.p, c.in, c.out, ex);
  });
}

template <class T>
void kvq_call(Kvq<T>& c, bool run, int threads) {
  attnref::ExecConfig ex = c.ex;
  if (ex.threads >= 0) ex.threads = threads;
  invoke_new(c, [&] {
    run ? attnref::kv_quant_sparse_flash_attention(c.p, c.in, c.out, ex)
        : attnref::validate(c.p, c.in, c.out, ex);
  });
}

void step_call(Step& c, bool run, int threads) {
  attnref::ExecConfig ex = c.ex;
  if (ex.threads >= 0) ex.threads = threads;
  invoke_new(c, [&] {
    run ? attnref::dsa_step(c.p, c.in, c.out, ex) : attnref::validate(c.p, c.in, c.out, ex);
  });
}

void restride_inputs(Qli& c, support::Restrider& r) { c.in.for_each_view(r); }
template <class T>
void restride_inputs(Kvq<T>& c, support::Restrider& r) {
  c.in.for_each_view(r);
}
void restride_inputs(Step& c, support::Restrider& r) { c.in.for_each_view(r); }
void validate_only(Qli& c) { qli_call(c, false, 0); }
template <class T>
void validate_only(Kvq<T>& c) {
  kvq_call(c, false, 0);
}
void validate_only(Step& c) { step_call(c, false, 0); }

void run_qli(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, qli_perturbations(), build_qli, fuzz::Named{"quant_lightning_indexer"},
      [seed](Qli& c) { qli_call(c, true, static_cast<int>(seed % 2 + 1)); }, verify_qli, &Qli::q,
      &Qli::k, &Qli::w, &Qli::qs, &Qli::ks, static_cast<std::vector<i32> Qli::*>(&Qli::table),
      &Qli::idx);
}

template <class T>
void run_kvq_t(fuzz::Run& run, std::uint64_t seed) {
  using C = Kvq<T>;
  fuzz::run_case(
      run, seed, kvq_perturbations<T>(), build_kvq<T>,
      fuzz::Named{"kv_quant_sparse_flash_attention"},
      [seed](C& c) { kvq_call(c, true, static_cast<int>(seed % 2 + 1)); }, verify_kvq<T>, &C::q,
      &C::k, &C::vj, &C::ksj, &C::vsj, &C::idx, static_cast<std::vector<i32> C::*>(&C::table),
      &C::o);
}

// bfloat16 (run_kvq_t takes half too).
void run_kvq(fuzz::Run& run, std::uint64_t seed) {
  // bfloat16 only: a half instantiation doubled this entry's share of the sanitizer build (the
  // engine's two-pass split-score path once more); tests/nsa/dsa_kv_quant_test.cpp runs half.
  run_kvq_t<bfloat16>(run, seed);
}

void run_step(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, step_perturbations(), build_step, fuzz::Named{"dsa_step"},
      [seed](Step& c) { step_call(c, true, static_cast<int>(seed % 2 + 1)); }, verify_step,
      &Step::iq, &Step::w, &Step::ik, &Step::q, &Step::qr, &Step::k, &Step::kr,
      static_cast<std::vector<i32> Step::*>(&Step::table), &Step::o, &Step::sidx);
}

// Under ASan + UBSan at -O0, 800 cases took 1.7 s (quant_lightning_indexer), 3.9 s
// (kv_quant_sparse_flash_attention) and 3.4 s (dsa_step; sparse_flash_attention 3.8 s on the same
// run): the last two run every other case.
const fuzz::Register reg_qli("quant_lightning_indexer", run_qli);
const fuzz::Register reg_kvq("kv_quant_sparse_flash_attention", run_kvq, 2);
const fuzz::Register reg_step("dsa_step", run_step, 2);

}  // namespace fuzz_dsa
