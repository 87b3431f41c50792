// Fuzz entries "nsa_selected_attention_infer" (float, TND / BSND / BSH, 3-d or 4-d paged caches
// over a shuffled pool, NaN in every cache row no query may read) against ref::nsa_select, and
// "nsa_decode_step" (float, TND / BSND, each intermediate output present or absent) against its
// component operators called directly (bit for bit) and its window branch against
// ref::nsa_select.

#include <attnref/attnref.hpp>
#include <limits>

#include "fuzz/fuzz.hpp"
#include "reference/nsa_select.hpp"
#include "support/cast.hpp"
#include "support/views.hpp"

namespace fuzz_nsa {

using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;
using R = fuzz::Rng;
using i32 = std::int32_t;
using Shape = std::vector<Index>;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 333.0f;

using support::z;

// Query rows of a decode batch: TND packs q_len[b] rows per batch, BSND / BSH pads to S.
struct Rows {
  std::string layout;
  Index B = 1, S = 0, Q = 0, N = 1, KVN = 1, Dqk = 1, Dv = 1, k = 1;  // Q: query rows
  std::vector<Index> qlen, sel, row0;
  Index row(Index b, Index i) const { return layout == "TND" ? row0[z(b)] + i : b * S + i; }
  Shape lay(Index heads, Index last, bool flat = false) const {  // flat: BSH [B, S, N * D]
    if (layout == "TND") return {Q, heads, last};
    if (flat && layout == "BSH") return {B, S, heads * last};
    return {B, S, heads, last};
  }
  // Batch sizes and lengths; with give_q false every batch has S query tokens.
  void shape(R& r, bool give_q, Index max_sel, bool allow_empty) {
    for (Index b = 0; b < B; ++b) {
      qlen.push_back(give_q ? r.range(1, layout == "TND" ? 4 : S) : S);
      sel.push_back(allow_empty && r.chance(0.1) ? 0 : r.range(qlen.back(), max_sel));
      row0.push_back(Q);
      Q += layout == "TND" ? qlen.back() : S;
    }
  }
  ref::nsa_select::Problem problem(double scale, Index ls) const {
    ref::nsa_select::Problem pr;
    pr.N = static_cast<int>(N), pr.KVN = static_cast<int>(KVN);
    pr.Dqk = static_cast<int>(Dqk), pr.Dv = static_cast<int>(Dv);
    pr.scale = scale, pr.ls = ls, pr.k = k;
    return pr;
  }
  // Batch b as the reference wants it (q, k, v, topk from `tk`); its live output rows of `o`
  // go to `got`.
  ref::nsa_select::Batch batch(const fuzz::Pool& pool, Index b, const std::vector<float>& q,
                               const std::vector<i32>& tk, const std::vector<float>& o,
                               std::vector<double>& got) const {
    ref::nsa_select::Batch x;
    x.q_len = static_cast<int>(qlen[z(b)]), x.sel = sel[z(b)];
    x.k = pool.dense(b, sel[z(b)], false), x.v = pool.dense(b, sel[z(b)], true);
    for (Index i = 0; i < qlen[z(b)]; ++i) {
      const Index rw = row(b, i);
      x.q.insert(x.q.end(), q.begin() + rw * N * Dqk, q.begin() + (rw + 1) * N * Dqk);
      x.topk.insert(x.topk.end(), tk.begin() + rw * KVN * k, tk.begin() + (rw + 1) * KVN * k);
      got.insert(got.end(), o.begin() + rw * N * Dv, o.begin() + (rw + 1) * N * Dv);
    }
    return x;
  }
  // "" when the padded BSND / BSH rows of o are 0.
  std::string padded_zero(const std::vector<float>& o) const {
    for (Index b = 0; b < B && layout != "TND"; ++b)
      for (Index i = qlen[z(b)]; i < S; ++i)
        for (Index e = 0; e < N * Dv; ++e)
          if (o[z(row(b, i) * N * Dv + e)] != 0.0f) return "padded row not 0";
    return "";
  }
};

// ---- NsaSelectedAttentionInfer ---------------------------------------------------------------

struct Sel : Rows {
  fuzz::Pool pool;
  std::vector<float> q, o;
  std::vector<i32> topk;
  attnref::NsaSelectedAttentionInferParams p;
  attnref::NsaSelectedAttentionInferInputs<float> in;
  StridedView<float> out;
  Index n_sel(Index b) const {  // select blocks of batch b
    return sel[z(b)] / p.select_block_size + (sel[z(b)] % p.select_block_size != 0);
  }
};

// Valid top-k lists: up to k distinct select blocks per live (row, kv head), -1 elsewhere.
void fill_topk(Sel& c, R& r) {
  for (Index b = 0; b < c.B; ++b)
    for (Index at = c.row(b, 0) * c.KVN * c.k; at < c.row(b, c.qlen[z(b)]) * c.KVN * c.k;
         at += c.k) {
      std::vector<i32> blocks(z(c.n_sel(b)));
      for (size_t j = 0; j < blocks.size(); ++j) blocks[j] = static_cast<i32>(j);
      std::shuffle(blocks.begin(), blocks.end(), r.g);
      blocks.resize(z(std::min(c.n_sel(b), r.range(0, c.k))));
      blocks.resize(z(c.k), -1);
      std::shuffle(blocks.begin(), blocks.end(), r.g);
      std::copy(blocks.begin(), blocks.end(), c.topk.begin() + at);
    }
}

void build(Sel& c, R& r) {
  const char* layouts[] = {"TND", "BSND", "BSH"};
  c.layout = layouts[r.range(0, 2)];
  c.B = r.range(1, 3), c.KVN = r.range(1, 2), c.N = c.KVN * r.range(1, 3);
  c.Dqk = r.range(1, 20), c.Dv = r.range(1, 20), c.k = r.range(1, 4);
  c.S = c.layout == "TND" ? 0 : r.range(1, 4);
  const bool give_q = c.layout == "TND" || r.chance(0.7);
  c.shape(r, give_q, 40, true);
  make_pool(c.pool, r, c.sel, r.range(1, 8), c.KVN * c.Dqk, c.KVN * c.Dv);
  c.q = r.normals<float>(c.Q * c.N * c.Dqk);
  c.o.assign(z(c.Q * c.N * c.Dv), kSentinel);
  c.topk.assign(z(c.Q * c.KVN * c.k), -1);
  c.p.select_block_size = r.range(1, 12);
  fill_topk(c, r);
  c.p.num_heads = c.N, c.p.num_key_value_heads = c.KVN, c.p.select_block_count = c.k;
  c.p.page_block_size = c.pool.pbs, c.p.layout = c.layout, c.p.strict = false;
  c.p.scale_value = 1.0 / std::sqrt(static_cast<double>(c.Dqk));
  const bool four = r.chance(0.5);  // 4-d caches [nb, pbs, KV_N, D]
  const Index nb = c.pool.nb, pbs = c.pool.pbs;
  c.in.query = StridedView<const float>(c.q.data(), c.lay(c.N, c.Dqk, true));
  c.in.key = StridedView<const float>(
      c.pool.k.data(), four ? Shape{nb, pbs, c.KVN, c.Dqk} : Shape{nb, pbs, c.KVN * c.Dqk});
  c.in.value = StridedView<const float>(
      c.pool.v.data(), four ? Shape{nb, pbs, c.KVN, c.Dv} : Shape{nb, pbs, c.KVN * c.Dv});
  c.in.topk_indices = StridedView<const i32>(c.topk.data(), c.lay(c.KVN, c.k));
  c.in.block_table = StridedView<const i32>(c.pool.table.data(), {c.B, c.pool.mb});
  if (give_q) c.in.actual_q_seq_len.assign(c.qlen.begin(), c.qlen.end());
  c.in.actual_sel_kv_seq_len.assign(c.sel.begin(), c.sel.end());
  c.out = StridedView<float>(c.o.data(), c.lay(c.N, c.Dv, true));
}

std::string verify_sel(const Sel& c) {
  const auto pr = c.problem(c.p.scale_value, c.p.select_block_size);
  std::vector<double> got, want;
  for (Index b = 0; b < c.B; ++b) {
    const auto o = ref::nsa_select::selected(pr, c.batch(c.pool, b, c.q, c.topk, c.o, got));
    want.insert(want.end(), o.begin(), o.end());
  }
  const std::string m = c.padded_zero(c.o);
  return m.empty() ? fuzz::compare(got, want, 2e-4) : m;
}

using PS = fuzz::Perturbation<Sel>;

// Must-reject edits (`must`) and unusual but defined ones (`fine`), applicable when `ok` holds.
using SelOk = bool (*)(const Sel&);
using SelEdit = void (*)(Sel&, R&);
PS must(const char* n, SelEdit e) { return fuzz::edit<Sel>(n, true, nullptr, e); }
PS must(const char* n, SelOk ok, SelEdit e) { return fuzz::edit<Sel>(n, true, ok, e); }
PS fine(const char* n, SelOk ok, SelEdit e) { return fuzz::edit<Sel>(n, false, ok, e); }

// A random used block-table entry of pool p (len: its lengths), or -1 when that batch has none.
Index used_entry(const fuzz::Pool& p, const std::vector<Index>& len, R& r) {
  const Index b = r.range(0, static_cast<Index>(len.size()) - 1);
  return len[z(b)] == 0 ? -1 : b * p.mb + r.range(0, p.blocks(len[z(b)]) - 1);
}

// The first top-k entry of a random live (row, kv head) of batch b.
Index live_slot(const Sel& c, R& r, Index b) {
  return (c.row(b, r.range(0, c.qlen[z(b)] - 1)) * c.KVN + r.range(0, c.KVN - 1)) * c.k;
}

bool selects(const Sel& c) { return *std::max_element(c.sel.begin(), c.sel.end()) > 0; }
bool has_q(const Sel& c) { return !c.in.actual_q_seq_len.empty(); }
bool padded(const Sel& c) { return c.layout != "TND"; }

const std::vector<PS>& sel_perturbations() {
  static const std::vector<PS> list{
      must("topk entry neither -1 nor a select block",
           [](Sel& c, R& r) {
             const Index b = r.range(0, c.B - 1);
             c.topk[z(live_slot(c, r, b) + r.range(0, c.k - 1))] =
                 r.chance(0.5) ? static_cast<i32>(c.n_sel(b) + r.range(0, 3)) : -2;
           }),
      must(
          "topk repeats a block", [](const Sel& c) { return c.k > 1 && c.n_sel(0) > 0; },
          [](Sel& c, R& r) {
            const Index at = live_slot(c, r, 0);
            c.topk[z(at)] = c.topk[z(at + 1)] = 0;
          }),
      must("block table entry out of range", selects,
           [](Sel& c, R& r) {
             Index at = -1;
             while (at < 0) at = used_entry(c.pool, c.sel, r);
             c.pool.table[z(at)] = r.chance(0.5) ? -1 : static_cast<i32>(c.pool.nb);
           }),
      must("actual_sel_kv_seq_len past the table",
           [](Sel& c, R& r) {
             c.in.actual_sel_kv_seq_len[z(r.range(0, c.B - 1))] = c.pool.mb * c.pool.pbs + 1;
           }),
      must("actual_sel_kv_seq_len negative or missing",
           [](Sel& c, R& r) {
             if (r.chance(0.5))
               c.in.actual_sel_kv_seq_len[z(r.range(0, c.B - 1))] = -1;
             else
               c.in.actual_sel_kv_seq_len.pop_back();
           }),
      must(
          "actual_q_seq_len above actual_sel_kv_seq_len",
          [](const Sel& c) { return has_q(c) && c.qlen[0] > 1; },
          [](Sel& c, R&) { c.in.actual_sel_kv_seq_len[0] = c.qlen[0] - 1; }),
      must("actual_q_seq_len 0 or 5", has_q,
           [](Sel& c, R& r) {
             c.in.actual_q_seq_len[z(r.range(0, c.B - 1))] = r.chance(0.5) ? 0 : 5;
           }),
      must("num_heads differs from the query", [](Sel& c, R&) { c.p.num_heads = c.N + c.KVN; }),
      must(
          "num_key_value_heads differs from the caches", [](const Sel& c) { return c.N != c.KVN; },
          [](Sel& c, R&) { c.p.num_key_value_heads = c.N; }),
      must(
          "num_key_value_heads not dividing", [](const Sel& c) { return c.N > 2; },
          [](Sel& c, R&) { c.p.num_key_value_heads = c.N - 1; }),
      must("query null", [](Sel& c, R&) { c.in.query = support::with_data(c.in.query, nullptr); }),
      must("key extent negative",
           [](Sel& c, R& r) {
             c.in.key = support::resized(c.in.key, static_cast<int>(r.range(0, 1)), -1);
           }),
      must("block_table size overflows",
           [](Sel& c, R&) {
             c.in.block_table = support::reshaped(c.in.block_table, {kHuge, kHuge});
           }),
      must("block_table width times page size overflows",
           [](Sel& c, R&) {  // no length reads the table: only its extents are wrong
             c.in.actual_sel_kv_seq_len.assign(z(c.B), 0);
             std::fill(c.topk.begin(), c.topk.end(), -1);
             c.p.page_block_size = kHuge;
             c.in.key = support::reshaped(c.in.key, {0, kHuge, c.KVN * c.Dqk});
             c.in.value = support::reshaped(c.in.value, {0, kHuge, c.KVN * c.Dv});
             c.in.block_table = support::reshaped(c.in.block_table, {c.B, Index(1) << 24});
           }),
      must("block_table missing", [](Sel& c, R&) { c.in.block_table = {}; }),
      must("select_block_count differs from topk", [](Sel& c, R&) { c.p.select_block_count += 1; }),
      must("select_block_size not positive",
           [](Sel& c, R& r) { c.p.select_block_size = -r.range(0, 2); }),
      must("page_block_size differs from the caches", [](Sel& c, R&) { c.p.page_block_size += 1; }),
      must("value blocks differ from key",
           [](Sel& c, R&) {
             c.pool.v.resize(c.pool.v.size() + z(c.pool.pbs * c.pool.wv), kNaN);
             c.in.value = support::with_data(c.in.value, c.pool.v.data());
             c.in.value = support::resized(c.in.value, 0, c.in.value.size(0) + (1));
           }),
      must("unknown layout", [](Sel& c, R& r) { c.p.layout = r.chance(0.5) ? "BNSD" : "tnd"; }),
      must("sparse_mode not 0", [](Sel& c, R&) { c.p.sparse_mode = 1; }),
      must("scale_value not finite", [](Sel& c, R&) { c.p.scale_value = std::nan(""); }),
      must("strict with a research shape", [](Sel& c, R&) { c.p.strict = true; }),
      must("output shape mismatch",
           [](Sel& c, R&) {
             c.o.resize(c.o.size() * 2, kSentinel);
             c.out = support::with_data(c.out, c.o.data());
             c.out = support::resized(c.out, c.out.rank() - 1, c.out.shape().back() + 1);
           }),
      must(
          "output overlaps an input", [](const Sel& c) { return c.pool.v.size() >= c.o.size(); },
          [](Sel& c, R& r) {  // an input at least as large as the output
            std::vector<float*> at{c.pool.v.data()};
            if (c.q.size() >= c.o.size()) at.push_back(c.q.data());
            if (c.topk.size() >= c.o.size()) at.push_back(reinterpret_cast<float*>(c.topk.data()));
            c.out = support::with_data(c.out, at[z(r.range(0, static_cast<Index>(at.size()) - 1))]);
          }),
      // Unusual but defined.
      fine("garbage in the padded rows' topk", padded,
           [](Sel& c, R& r) {
             for (Index b = 0; b < c.B; ++b)
               for (Index at = c.row(b, c.qlen[z(b)]) * c.KVN * c.k;
                    at < (b + 1) * c.S * c.KVN * c.k; ++at)
                 c.topk[z(at)] = static_cast<i32>(r.range(-9, 1 << 30));
           }),
      fine("garbage in the block table past the lengths", nullptr,
           [](Sel& c, R& r) {
             for (Index b = 0; b < c.B; ++b)
               for (Index j = c.pool.blocks(c.sel[z(b)]); j < c.pool.mb; ++j)
                 c.pool.table[z(b * c.pool.mb + j)] = static_cast<i32>(r.range(-9, 1 << 30));
           }),
      fine("nothing selected", nullptr,
           [](Sel& c, R&) { std::fill(c.topk.begin(), c.topk.end(), -1); }),
      fine("select block above every length", nullptr,
           [](Sel& c, R& r) {
             c.p.select_block_size = r.chance(0.5) ? kHuge : std::numeric_limits<Index>::max();
             fill_topk(c, r);
           }),
  };
  return list;
}

void restride_inputs(Sel& c, support::Restrider& r) { c.in.for_each_view(r); }

void validate_only(Sel& c) {
  attnref::validate(c.p, c.in, attnref::NsaSelectedAttentionInferOutputs<float>{c.out});
}

void run_sel(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, sel_perturbations(), build, fuzz::Named{"nsa_selected_attention_infer"},
      [seed](Sel& c) {
        attnref::nsa_selected_attention_infer(
            c.p, c.in, attnref::NsaSelectedAttentionInferOutputs<float>{c.out},
            {static_cast<int>(seed % 2 + 1)});
      },
      verify_sel, &Sel::q, &Sel::o, &Sel::topk, &Sel::pool);
}

const fuzz::Register reg_sel("nsa_selected_attention_infer", run_sel);

// ---- NsaDecodeStep ---------------------------------------------------------------------------

struct Dec : Rows {
  std::vector<Index> cmp;  // compressed tokens per batch
  fuzz::Pool raw, cp;      // the raw and the compressed paged caches
  std::vector<float> q, gates, o, o_cmp, o_sel, o_win;
  std::vector<i32> topk;
  attnref::NsaDecodeParams p;
  attnref::NsaDecodeInputs<float> in;
  attnref::NsaDecodeOutputs<float> out;
};

void build(Dec& c, R& r) {
  c.layout = r.chance(0.5) ? "TND" : "BSND";
  c.B = r.range(1, 3), c.KVN = r.range(1, 2), c.N = c.KVN * r.range(1, 3);
  c.Dqk = r.range(1, 16), c.Dv = r.range(1, 16), c.k = r.range(1, 3);
  c.S = c.layout == "TND" ? 0 : r.range(1, 4);
  const bool give_q = c.layout == "TND" || r.chance(0.7);
  c.shape(r, give_q, 40, false);
  auto& p = c.p;
  p.compress_block_stride = r.range(1, 4);  // d | l, d | l', l <= l'
  p.compress_block_size = p.compress_block_stride * r.range(1, 3);
  p.select_block_size = p.compress_block_size + p.compress_block_stride * r.range(0, 3);
  for (Index s : c.sel)
    c.cmp.push_back(
        attnref::nsa_compressed_count(s, p.compress_block_size, p.compress_block_stride));
  make_pool(c.raw, r, c.sel, r.range(1, 8), c.KVN * c.Dqk, c.KVN * c.Dv);
  make_pool(c.cp, r, c.cmp, r.range(1, 6), c.KVN * c.Dqk, c.KVN * c.Dv);
  c.q = r.normals<float>(c.Q * c.N * c.Dqk);
  c.gates.resize(z(c.Q * c.N * 3));
  for (float& g : c.gates) g = static_cast<float>(r.range(0, 1000)) / 1000.0f;
  c.o.assign(z(c.Q * c.N * c.Dv), kSentinel);
  c.o_cmp = c.o_sel = c.o_win = c.o;
  c.topk.assign(z(c.Q * c.KVN * c.k), 12345);
  p.num_heads = c.N, p.num_key_value_heads = c.KVN, p.select_block_count = c.k;
  p.window_size = r.range(1, 10), p.page_block_size = c.raw.pbs, p.cmp_page_block_size = c.cp.pbs;
  p.scale_value = 1.0 / std::sqrt(static_cast<double>(c.Dqk)), p.layout = c.layout;
  p.strict = false;
  auto& in = c.in;
  in.query = StridedView<const float>(c.q.data(), c.lay(c.N, c.Dqk));
  in.key = StridedView<const float>(c.raw.k.data(), {c.raw.nb, c.raw.pbs, c.KVN * c.Dqk});
  in.value = StridedView<const float>(c.raw.v.data(), {c.raw.nb, c.raw.pbs, c.KVN * c.Dv});
  in.block_table = StridedView<const i32>(c.raw.table.data(), {c.B, c.raw.mb});
  in.cmp_key = StridedView<const float>(c.cp.k.data(), {c.cp.nb, c.cp.pbs, c.KVN * c.Dqk});
  in.cmp_value = StridedView<const float>(c.cp.v.data(), {c.cp.nb, c.cp.pbs, c.KVN * c.Dv});
  in.cmp_block_table = StridedView<const i32>(c.cp.table.data(), {c.B, c.cp.mb});
  in.gates = StridedView<const float>(c.gates.data(), {c.Q, c.N, 3});
  if (give_q) in.actual_q_seq_len.assign(c.qlen.begin(), c.qlen.end());
  in.actual_sel_kv_seq_len.assign(c.sel.begin(), c.sel.end());
  const Shape os = c.lay(c.N, c.Dv);
  c.out.output = StridedView<float>(c.o.data(), os);
  if (r.chance(0.6)) c.out.topk = StridedView<i32>(c.topk.data(), c.lay(c.KVN, c.k));
  if (r.chance(0.6)) c.out.cmp_out = StridedView<float>(c.o_cmp.data(), os);
  if (r.chance(0.6)) c.out.sel_out = StridedView<float>(c.o_sel.data(), os);
  if (r.chance(0.6)) c.out.win_out = StridedView<float>(c.o_win.data(), os);
}

// The step must equal its pieces called directly: nsa_compress_attention_infer (with the
// multi-token mask flag), nsa_selected_attention_infer on its top-k, nsa_sliding_window_attention
// and nsa_gated_sum, padded BSND rows 0; an absent intermediate is not written. The window
// branch (no other entry covers it) is checked against ref::nsa_select as well.
std::string verify_dec(const Dec& c) {
  const Shape os = c.lay(c.N, c.Dv), ts = c.lay(c.KVN, c.k);
  const size_t n = c.o.size();
  std::vector<float> oc(n, -1.0f), ol(n, -1.0f), ow(n, -1.0f), out(n, -1.0f);
  std::vector<i32> tk(c.topk.size(), -9);
  try {
    attnref::NsaCompressAttentionInferParams cp;
    cp.num_heads = c.N, cp.num_key_value_heads = c.KVN, cp.select_block_count = c.k;
    cp.select_block_size = c.p.select_block_size;
    cp.compress_block_size = c.p.compress_block_size;
    cp.compress_block_stride = c.p.compress_block_stride;
    cp.scale_value = c.p.scale_value, cp.layout = c.layout, cp.strict = false;
    cp.page_block_size = c.p.cmp_page_block_size;
    attnref::NsaCompressAttentionInferInputs<float> ci;
    const std::uint8_t flag = 1;
    ci.query = c.in.query, ci.key = c.in.cmp_key, ci.value = c.in.cmp_value;
    ci.atten_mask = StridedView<const std::uint8_t>(&flag, {1});
    ci.block_table = c.in.cmp_block_table, ci.actual_q_seq_len = c.in.actual_q_seq_len;
    ci.actual_sel_kv_seq_len = c.in.actual_sel_kv_seq_len;
    ci.actual_cmp_kv_seq_len.assign(c.cmp.begin(), c.cmp.end());
    attnref::nsa_compress_attention_infer<float>(
        cp, ci, {StridedView<float>(oc.data(), os), StridedView<i32>(tk.data(), ts)});
    attnref::NsaSelectedAttentionInferParams sp;
    sp.num_heads = c.N, sp.num_key_value_heads = c.KVN, sp.select_block_count = c.k;
    sp.select_block_size = c.p.select_block_size, sp.page_block_size = c.p.page_block_size;
    sp.scale_value = c.p.scale_value, sp.layout = c.layout, sp.strict = false;
    attnref::NsaSelectedAttentionInferInputs<float> si;
    si.query = c.in.query, si.key = c.in.key, si.value = c.in.value;
    si.block_table = c.in.block_table, si.topk_indices = StridedView<const i32>(tk.data(), ts);
    si.actual_q_seq_len = c.in.actual_q_seq_len;
    si.actual_sel_kv_seq_len = c.in.actual_sel_kv_seq_len;
    attnref::nsa_selected_attention_infer<float>(sp, si, {StridedView<float>(ol.data(), os)});
    attnref::nsa_sliding_window_attention<float>(c.p, c.in, {StridedView<float>(ow.data(), os)});
    attnref::nsa_gated_sum<float>(c.in.gates, StridedView<const float>(oc.data(), os),
                                  StridedView<const float>(ol.data(), os),
                                  StridedView<const float>(ow.data(), os),
                                  StridedView<float>(out.data(), os));
  } catch (const std::exception& e) {
    return std::string("a component rejected what the step accepted: ") + e.what();
  }
  for (Index b = 0; b < c.B && c.layout == "BSND"; ++b)  // padded rows: 0 whatever the gates
    for (Index i = c.qlen[z(b)]; i < c.S; ++i)
      std::fill_n(out.begin() + c.row(b, i) * c.N * c.Dv, c.N * c.Dv, 0.0f);
  if (!fuzz::same_bits(c.o, out)) return "output differs from the gated sum of the branches";
  const std::vector<float> sentinel(n, kSentinel);
  const std::vector<float>* got[] = {&c.o_cmp, &c.o_sel, &c.o_win};
  const std::vector<float>* want[] = {&oc, &ol, &ow};
  const StridedView<float>* views[] = {&c.out.cmp_out, &c.out.sel_out, &c.out.win_out};
  for (int j = 0; j < 3; ++j)
    if (!fuzz::same_bits(*got[j], views[j]->absent() ? sentinel : *want[j]))
      return std::string("intermediate ") + "csw"[j] + " differs from its operator";
  if (!fuzz::same_bits(c.topk, c.out.topk.absent() ? std::vector<i32>(c.topk.size(), 12345) : tk))
    return "topk differs from nsa_compress_attention_infer";
  const auto pr = c.problem(c.p.scale_value, c.p.select_block_size);
  std::vector<double> got_w, want_w;
  for (Index b = 0; b < c.B; ++b) {
    const auto w =
        ref::nsa_select::window(pr, c.batch(c.raw, b, c.q, tk, ow, got_w), c.p.window_size);
    want_w.insert(want_w.end(), w.begin(), w.end());
  }
  const std::string m = fuzz::compare(got_w, want_w, 2e-4);
  return m.empty() ? m : "window branch vs reference: " + m;
}

using PD = fuzz::Perturbation<Dec>;

using DecOk = bool (*)(const Dec&);
using DecEdit = void (*)(Dec&, R&);
PD must(const char* n, DecEdit e) { return fuzz::edit<Dec>(n, true, nullptr, e); }
PD must(const char* n, DecOk ok, DecEdit e) { return fuzz::edit<Dec>(n, true, ok, e); }
PD fine(const char* n, DecOk ok, DecEdit e) { return fuzz::edit<Dec>(n, false, ok, e); }

bool compresses(const Dec& c) { return *std::max_element(c.cmp.begin(), c.cmp.end()) > 0; }

const std::vector<PD>& dec_perturbations() {
  static const std::vector<PD> list{
      must("raw block table entry out of range",
           [](Dec& c, R& r) { c.raw.table[z(used_entry(c.raw, c.sel, r))] = -1; }),
      must("cmp block table entry out of range", compresses,
           [](Dec& c, R& r) {
             Index at = -1;
             while (at < 0) at = used_entry(c.cp, c.cmp, r);
             c.cp.table[z(at)] = static_cast<i32>(c.cp.nb + r.range(0, 3));
           }),
      must("actual_sel_kv_seq_len below q_len",
           [](Dec& c, R& r) {
             const Index b = r.range(0, c.B - 1);
             c.in.actual_sel_kv_seq_len[z(b)] = c.qlen[z(b)] - 1;
           }),
      must("actual_sel_kv_seq_len past the raw table",
           [](Dec& c, R& r) {
             c.in.actual_sel_kv_seq_len[z(r.range(0, c.B - 1))] = c.raw.mb * c.raw.pbs + 1;
           }),
      must(
          "actual_q_seq_len out of range",
          [](const Dec& c) { return !c.in.actual_q_seq_len.empty(); },
          [](Dec& c, R& r) {
            c.in.actual_q_seq_len[z(r.range(0, c.B - 1))] = r.chance(0.5) ? 0 : 5;
          }),
      must("gates shape wrong",
           [](Dec& c, R& r) {
             const Shape s[] = {{c.Q, c.N, 2}, {c.Q * c.N, 3}, {c.Q, c.N, 1, 3}};
             c.in.gates = support::reshaped(c.in.gates, s[r.range(0, 2)]);
           }),
      must("gates missing or null",
           [](Dec& c, R& r) {
             c.in.gates = support::with_data(c.in.gates, nullptr);
             if (r.chance(0.5)) c.in.gates = support::reshaped(c.in.gates, {});
           }),
      must("num_heads differs from the query", [](Dec& c, R&) { c.p.num_heads = c.N + c.KVN; }),
      must(
          "num_key_value_heads not dividing", [](const Dec& c) { return c.N > 2; },
          [](Dec& c, R&) { c.p.num_key_value_heads = c.N - 1; }),
      must("unknown layout", [](Dec& c, R& r) { c.p.layout = r.chance(0.5) ? "BSH" : "BNSD"; }),
      must("window_size not positive", [](Dec& c, R& r) { c.p.window_size = -r.range(0, 1); }),
      must("compress stride above the block size",
           [](Dec& c, R&) { c.p.compress_block_stride = c.p.compress_block_size + 1; }),
      must(
          "compress stride not dividing", [](const Dec& c) { return c.p.compress_block_size > 2; },
          [](Dec& c, R&) { c.p.compress_block_stride = c.p.compress_block_size - 1; }),
      must(
          "select block below the compress block",
          [](const Dec& c) { return c.p.compress_block_size > 1; },
          [](Dec& c, R&) { c.p.select_block_size = c.p.compress_block_size - 1; }),
      must("select_block_count not positive", [](Dec& c, R&) { c.p.select_block_count = 0; }),
      must("cmp_key shape mismatch",
           [](Dec& c, R&) {
             c.in.cmp_key = support::resized(c.in.cmp_key, 2, c.in.cmp_key.size(2) + (1));
           }),
      must("cmp_page_block_size differs", [](Dec& c, R&) { c.p.cmp_page_block_size += 1; }),
      must("raw key 4-d",
           [](Dec& c, R&) {
             c.in.key = support::reshaped(c.in.key, {c.raw.nb, c.raw.pbs, c.KVN, c.Dqk});
           }),
      must("raw key flattened or missing",
           [](Dec& c, R& r) {
             c.in.key = support::reshaped(c.in.key, {c.raw.nb * c.raw.pbs * c.KVN * c.Dqk});
             if (r.chance(0.5)) c.in.key = {};
           }),
      must(
          "block table width times page size overflows", [](const Dec& c) { return c.B == 1; },
          [](Dec& c, R& r) {  // one batch: only the table's first entries are read
            const bool raw = r.chance(0.5);
            (raw ? c.p.page_block_size : c.p.cmp_page_block_size) = kHuge;
            {
              auto& v = raw ? c.in.key : c.in.cmp_key;
              v = support::reshaped(v, {0, kHuge, c.KVN * c.Dqk});
            }
            {
              auto& v = raw ? c.in.value : c.in.cmp_value;
              v = support::reshaped(v, {0, kHuge, c.KVN * c.Dv});
            }
            {
              auto& v = raw ? c.in.block_table : c.in.cmp_block_table;
              v = support::reshaped(v, {1, Index(1) << 24});
            }
          }),
      must("query extent negative",
           [](Dec& c, R&) { c.in.query = support::resized(c.in.query, 0, -1); }),
      must("cmp_block_table size overflows",
           [](Dec& c, R&) {
             c.in.cmp_block_table = support::reshaped(c.in.cmp_block_table, {kHuge, kHuge});
           }),
      must("strict with a research shape", [](Dec& c, R&) { c.p.strict = true; }),
      must("output shape mismatch",
           [](Dec& c, R&) {
             c.o.resize(c.o.size() * 2, kSentinel);
             c.out.output = StridedView<float>(c.o.data(), c.lay(c.N, c.Dv + 1));
           }),
      must("topk shape mismatch",
           [](Dec& c, R&) {
             c.topk.resize(c.topk.size() * 2, 12345);
             c.out.topk = StridedView<i32>(c.topk.data(), c.lay(c.KVN, c.k + 1));
           }),
      must(
          "an output overlaps an input", [](const Dec& c) { return c.raw.k.size() >= c.o.size(); },
          [](Dec& c, R& r) {  // an input at least as large as the output
            std::vector<const float*> in{c.raw.k.data()};
            for (const auto* x : {&c.q, &c.gates, &c.cp.v})
              if (x->size() >= c.o.size()) in.push_back(x->data());
            StridedView<float>* outs[] = {&c.out.output, &c.out.sel_out, &c.out.win_out};
            *outs[r.range(0, 2)] = StridedView<float>(
                const_cast<float*>(in[z(r.range(0, static_cast<Index>(in.size()) - 1))]),
                c.lay(c.N, c.Dv));
          }),
      must("two outputs share memory",
           [](Dec& c, R& r) {  // two branch outputs, or a branch output on topk
             const Shape os = c.lay(c.N, c.Dv);
             if (c.topk.size() >= c.o.size() && r.chance(0.5))
               c.out.win_out = StridedView<float>(reinterpret_cast<float*>(c.topk.data()), os),
               c.out.topk = StridedView<i32>(c.topk.data(), c.lay(c.KVN, c.k));
             else
               c.out.cmp_out = c.out.sel_out = StridedView<float>(c.o_cmp.data(), os);
           }),
      // Unusual but defined.
      fine(
          "NaN gates in the padded rows", [](const Dec& c) { return c.layout == "BSND"; },
          [](Dec& c, R&) {
            for (Index b = 0; b < c.B; ++b)
              std::fill(c.gates.begin() + c.row(b, c.qlen[z(b)]) * c.N * 3,
                        c.gates.begin() + (b + 1) * c.S * c.N * 3, kNaN);
          }),
      fine("garbage in the block tables past the lengths", nullptr,
           [](Dec& c, R& r) {
             for (Index b = 0; b < c.B; ++b) {
               for (Index j = c.raw.blocks(c.sel[z(b)]); j < c.raw.mb; ++j)
                 c.raw.table[z(b * c.raw.mb + j)] = static_cast<i32>(r.range(-9, 1 << 30));
               for (Index j = c.cp.blocks(c.cmp[z(b)]); j < c.cp.mb; ++j)
                 c.cp.table[z(b * c.cp.mb + j)] = static_cast<i32>(r.range(-9, 1 << 30));
             }
           }),
  };
  return list;
}

void restride_inputs(Dec& c, support::Restrider& r) { c.in.for_each_view(r); }

void validate_only(Dec& c) { attnref::validate(c.p, c.in, c.out); }

void run_dec(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, dec_perturbations(), build, fuzz::Named{"nsa_decode_step"},
      [seed](Dec& c) {
        attnref::nsa_decode_step(c.p, c.in, c.out, {static_cast<int>(seed % 2 + 1)});
      },
      verify_dec, &Dec::q, &Dec::gates, &Dec::raw, &Dec::cp, &Dec::o, &Dec::o_cmp, &Dec::o_sel,
      &Dec::o_win, &Dec::topk);
}

const fuzz::Register reg_dec("nsa_decode_step", run_dec);

}  // namespace fuzz_nsa
