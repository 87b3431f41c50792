// Fuzz entries "nsa_compress_with_cache" (float, aclnnNsaCompressWithCache: a shuffled raw page
// pool with NaN in every row no sequence owns, lengths on and off a block end, distinct slots
// in an output cache with spare rows, any slot for a batch that writes nothing) and
// "nsa_update_compressed_cache" (float, raw 3-d K/V caches with Dqk != Dv, paged compressed
// caches holding a sentinel, one new token each, 0..sel new tokens or a whole prompt): every
// written row against ref::nsa::compress_block_vendor (the kernel's fp32 summation tree, bit for
// bit), every other row still the sentinel.

#include <algorithm>
#include <attnref/attnref.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "fuzz/fuzz.hpp"
#include "reference/nsa_compress.hpp"
#include "support/cast.hpp"
#include "support/views.hpp"

namespace fuzz_nsa_cache {

using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;
using R = fuzz::Rng;
using i32 = std::int32_t;
using Shape = std::vector<Index>;
using support::z;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 333.0f;
constexpr i32 kMax32 = std::numeric_limits<i32>::max();
constexpr i32 kMin32 = std::numeric_limits<i32>::min();

// Compressed tokens of a raw length s (written independently of attnref::nsa_compressed_count).
Index count(Index s, Index l, Index d) { return s < l ? 0 : (s - l) / d + 1; }

// True when the newest of s raw tokens completes a block.
bool block_end(Index s, Index l, Index d) { return s >= l && (s - l) % d == 0; }

// A raw length: on a block end (l + d·k) with probability `p_end`, else anything in [lo, hi].
Index length(R& r, Index l, Index d, double p_end, Index lo, Index hi) {
  return r.chance(p_end) ? l + d * r.range(0, 3) : r.range(lo, hi);
}

// The compressed token of raw tokens [end − l, end) of sequence b of `pool` (its K, or V when
// `values`), `heads` heads of `D` elements, weights w [l, heads]: compress_block_vendor rounded
// to T = float. Reads only the l tokens of the block (other table entries may be garbage).
std::vector<float> vendor_token(const fuzz::Pool& pool, bool values, Index b, Index end, Index l,
                                Index heads, Index D, const std::vector<float>& w) {
  const std::vector<float>& x = values ? pool.v : pool.k;
  const Index width = values ? pool.wv : pool.wk;
  std::vector<double> blk;
  for (Index t = end - l; t < end; ++t)
    blk.insert(blk.end(), x.begin() + pool.at(b, t) * width,
               x.begin() + (pool.at(b, t) + 1) * width);
  const std::vector<float> f =
      ref::nsa::compress_block_vendor(blk, static_cast<int>(heads), static_cast<int>(D),
                                      std::vector<double>(w.begin(), w.end()), static_cast<int>(l));
  return std::vector<float>(f.begin(), f.end());  // T(...) with T = float
}

// A float with every digit that tells it apart.
std::string exact(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(x));
  return buf;
}

// "" when got == want bit for bit, else the first element that differs (`width` per row).
std::string diff(const char* what, const std::vector<float>& got, const std::vector<float>& want,
                 Index width) {
  if (fuzz::same_bits(got, want)) return "";
  if (got.size() != want.size()) return std::string(what) + ": size changed";
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return std::string(what) + " row " + std::to_string(static_cast<Index>(i) / width) +
             " element " + std::to_string(static_cast<Index>(i) % width) + ": got " +
             exact(got[i]) + ", want " + exact(want[i]) +
             (want[i] == kSentinel ? " (the sentinel)" : "");
  return "";
}

// Runs `call`; an index-data perturbation (`oor`) rejected as std::invalid_argument instead of
// std::out_of_range becomes a std::logic_error, which the harness counts as a defect.
template <class Call>
void expect_oor(bool oor, Call&& call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    if (oor)
      throw std::logic_error(std::string("std::invalid_argument, want out_of_range: ") + e.what());
    throw;
  }
}

// ---- NsaCompressWithCache -------------------------------------------------------------------

struct Cwc {
  Index l = 1, d = 1, N = 1, D = 1, B = 1, rows = 1, pitch = 1;  // pitch: o's row stride
  fuzz::Pool pool;  // k: the raw tokens [nb, pbs, N·D] (v unused)
  std::vector<float> w, o;
  std::vector<i32> slots;
  attnref::NsaCompressWithCacheParams p;
  attnref::NsaCompressWithCacheInputs<float> in;
  attnref::NsaCompressWithCacheOutputs<float> out;
  bool oor = false;  // the perturbation must raise std::out_of_range (index data)
  // Batch b's length and whether it writes, as the call sees them.
  Index len(Index b) const { return in.act_seq_len[z(b)]; }
  bool writes(Index b) const { return block_end(len(b), l, d); }
  std::vector<Index> writers() const {
    std::vector<Index> b;
    for (Index i = 0; i < B; ++i)
      if (writes(i)) b.push_back(i);
    return b;
  }
};

// A slot that no check may read: -1, the int32 extremes, one past the cache, or batch 0's.
i32 junk_slot(const Cwc& c, R& r) {
  const i32 pick[] = {-1, kMin32, kMax32, static_cast<i32>(c.rows), c.slots[0]};
  return pick[r.range(0, 4)];
}

void build(Cwc& c, R& r) {
  c.l = r.range(1, 20);
  c.d = r.chance(0.2) ? c.l : r.range(1, c.l);
  c.N = r.range(1, 3), c.D = r.range(1, 16), c.B = r.range(1, 4);
  std::vector<Index> len;
  for (Index b = 0; b < c.B; ++b) len.push_back(length(r, c.l, c.d, 0.6, 0, c.l + 2 * c.d + 3));
  fuzz::make_pool(c.pool, r, len, r.range(1, 9), c.N * c.D, 1);
  c.w = r.normals<float>(c.l * c.N);
  c.rows = c.B + r.range(0, 3);
  std::vector<i32> ids(z(c.rows));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), r.g);
  c.slots.assign(ids.begin(), ids.begin() + c.B);
  c.pitch = c.N * c.D;
  c.o.assign(z(c.rows * c.pitch), kSentinel);
  auto& p = c.p;
  p.compress_block_size = c.l, p.compress_stride = c.d, p.act_seq_len_type = 1;
  p.page_block_size = c.pool.pbs, p.strict = false;
  const char* layouts[] = {"TND", "BSND", "BSH", "SBH", "BNSD", "tnd"};
  p.layout = layouts[r.range(0, 5)];
  auto& in = c.in;
  in.input = StridedView<const float>(c.pool.k.data(), {c.pool.nb, c.pool.pbs, c.N, c.D});
  in.weight = StridedView<const float>(c.w.data(), {c.l, c.N});
  in.slot_mapping = StridedView<const i32>(c.slots.data(), {c.B});
  in.act_seq_len.assign(len.begin(), len.end());
  in.block_table = StridedView<const i32>(c.pool.table.data(), {c.B, c.pool.mb});
  c.out.output_cache = StridedView<float>(c.o.data(), {c.rows, c.N, c.D});
  for (Index b = 0; b < c.B; ++b)  // a batch that writes nothing: its slot is not read
    if (!c.writes(b) && r.chance(0.5)) c.slots[z(b)] = junk_slot(c, r);
}

std::string verify_cwc(const Cwc& c) {
  std::vector<float> want(c.o.size(), kSentinel);
  for (Index b : c.writers()) {
    const Index slot = c.slots[z(b)];
    if (slot < 0 || slot >= c.rows) return "a writing batch's slot out of range was accepted";
    const auto t = vendor_token(c.pool, false, b, c.len(b), c.l, c.N, c.D, c.w);
    std::copy(t.begin(), t.end(), want.begin() + slot * c.pitch);
  }
  return diff("output_cache", c.o, want, c.pitch);
}

using PC = fuzz::Perturbation<Cwc>;
using CwcOk = bool (*)(const Cwc&);
using CwcEdit = void (*)(Cwc&, R&);
PC must(const char* n, CwcEdit e) { return fuzz::edit<Cwc>(n, true, nullptr, e); }
PC must(const char* n, CwcOk ok, CwcEdit e) { return fuzz::edit<Cwc>(n, true, ok, e); }
PC fine(const char* n, CwcOk ok, CwcEdit e) { return fuzz::edit<Cwc>(n, false, ok, e); }

bool any_writer(const Cwc& c) { return !c.writers().empty(); }
Index some_writer(const Cwc& c, R& r) {
  const auto w = c.writers();
  return w[z(r.range(0, static_cast<Index>(w.size()) - 1))];
}

const std::vector<PC>& cwc_perturbations() {
  static const std::vector<PC> list{
      must("slot of a writing batch out of range", any_writer,
           [](Cwc& c, R& r) {
             const i32 bad[] = {-1, static_cast<i32>(c.rows), static_cast<i32>(c.rows + 2), kMax32,
                                kMin32};
             c.slots[z(some_writer(c, r))] = bad[r.range(0, 4)];
             c.oor = true;
           }),
      must(
          "two writing batches share a slot", [](const Cwc& c) { return c.writers().size() >= 2; },
          [](Cwc& c, R& r) {
            auto w = c.writers();
            std::shuffle(w.begin(), w.end(), r.g);
            c.slots[z(w[1])] = c.slots[z(w[0])];
          }),
      must("block table entry read by a write out of range", any_writer,
           [](Cwc& c, R& r) {
             const Index b = some_writer(c, r), s = c.len(b), pbs = c.pool.pbs;
             const Index pg = r.range((s - c.l) / pbs, (s - 1) / pbs);
             c.pool.table[z(b * c.pool.mb + pg)] =
                 r.chance(0.5) ? -static_cast<i32>(r.range(1, 2))
                               : static_cast<i32>(c.pool.nb + r.range(0, 2));
             c.oor = true;
           }),
      must("act_seq_len above the table's capacity",
           [](Cwc& c, R& r) {
             c.in.act_seq_len[z(r.range(0, c.B - 1))] = c.pool.mb * c.pool.pbs + r.range(1, 3);
           }),
      must("act_seq_len negative",
           [](Cwc& c, R& r) { c.in.act_seq_len[z(r.range(0, c.B - 1))] = -r.range(1, 5); }),
      must("act_seq_len size differs from slot_mapping",
           [](Cwc& c, R& r) {
             if (r.chance(0.5))
               c.in.act_seq_len.push_back(c.l);
             else
               c.in.act_seq_len.pop_back();
           }),
      must("weight shape mismatch",
           [](Cwc& c, R& r) {
             const Shape s[] = {{c.l + 1, c.N}, {c.l, c.N + 1}, {c.l * c.N}, {c.N, c.l, 1}};
             c.w.resize(c.w.size() + z(c.l + c.N + 1), 1.0f);
             c.in.weight = StridedView<const float>(c.w.data(), s[r.range(0, c.N > 1 ? 3 : 2)]);
           }),
      must(
          "input null", [](const Cwc& c) { return c.pool.nb > 0; },
          [](Cwc& c, R&) { c.in.input = support::with_data(c.in.input, nullptr); }),
      must("input size overflows",
           [](Cwc& c, R&) {
             c.in.input = support::reshaped(c.in.input, {kHuge, kHuge, c.N, c.D});
           }),
      must("input rank 3",
           [](Cwc& c, R&) {
             c.in.input = support::reshaped(c.in.input, {c.pool.nb, c.pool.pbs, c.N * c.D});
           }),
      must("output rank mismatch",
           [](Cwc& c, R& r) {
             const Shape s[] = {{c.rows, c.N * c.D}, {c.rows * c.N * c.D}, {c.rows, c.N, c.D, 1}};
             c.out.output_cache = support::reshaped(c.out.output_cache, s[r.range(0, 2)]);
           }),
      must("output shape mismatch",
           [](Cwc& c, R& r) {
             c.o.resize(c.o.size() * 3, kSentinel);
             const Shape s[] = {{c.rows, c.N, c.D + 1}, {c.rows, c.N + 1, c.D}};
             c.out.output_cache = StridedView<float>(c.o.data(), s[r.range(0, 1)]);
           }),
      must(
          "output overlaps an input", [](const Cwc& c) { return c.pool.k.size() >= c.o.size(); },
          [](Cwc& c, R& r) {
            std::vector<float*> at{c.pool.k.data()};
            if (c.w.size() >= c.o.size()) at.push_back(c.w.data());
            if (c.slots.size() >= c.o.size())
              at.push_back(reinterpret_cast<float*>(c.slots.data()));
            c.out.output_cache = support::with_data(
                c.out.output_cache, at[z(r.range(0, static_cast<Index>(at.size()) - 1))]);
          }),
      must("act_seq_len_type not 1",
           [](Cwc& c, R& r) { c.p.act_seq_len_type = r.chance(0.7) ? 0 : 2; }),
      must("page_block_size differs from input.shape[1]",
           [](Cwc& c, R& r) {
             c.p.page_block_size = r.chance(0.7) ? c.pool.pbs + 1 : c.pool.pbs > 1 ? 1 : 0;
           }),
      must("compress stride above the block size",
           [](Cwc& c, R& r) { c.p.compress_stride = c.l + r.range(1, 3); }),
      must("compress stride not positive",
           [](Cwc& c, R& r) { c.p.compress_stride = -r.range(0, 1); }),
      must("unknown layout", [](Cwc& c, R& r) { c.p.layout = r.chance(0.5) ? "NTD" : ""; }),
      must("strict with a small shape", [](Cwc& c, R&) { c.p.strict = true; }),
      must("block_table rows differ from the batch",
           [](Cwc& c, R&) {
             c.in.block_table = support::reshaped(c.in.block_table, {c.B * c.pool.mb});
           }),
      must("slot_mapping missing", [](Cwc& c, R&) { c.in.slot_mapping = {}; }),
      // Unusual but defined.
      fine(
          "slot of a non-writing batch -1 or huge",
          [](const Cwc& c) { return static_cast<Index>(c.writers().size()) < c.B; },
          [](Cwc& c, R& r) {
            for (Index b = 0; b < c.B; ++b)
              if (!c.writes(b)) c.slots[z(b)] = junk_slot(c, r);
          }),
      fine("garbage in table entries no write reads", nullptr,
           [](Cwc& c, R& r) {
             const Index pbs = c.pool.pbs;
             for (Index b = 0; b < c.B; ++b)
               for (Index j = 0; j < c.pool.mb; ++j) {
                 const Index s = c.len(b);
                 if (c.writes(b) && j >= (s - c.l) / pbs && j <= (s - 1) / pbs) continue;
                 c.pool.table[z(b * c.pool.mb + j)] = static_cast<i32>(r.range(-9, 1 << 30));
               }
           }),
      fine("no batch writes", nullptr,
           [](Cwc& c, R& r) {
             for (Index b = 0; b < c.B; ++b) {
               if (c.writes(b)) c.in.act_seq_len[z(b)] = r.range(0, c.l - 1);
               if (r.chance(0.5)) c.slots[z(b)] = junk_slot(c, r);
             }
           }),
      fine("output cache rows padded", nullptr,
           [](Cwc& c, R& r) {  // a strided output: the gaps keep the sentinel
             c.pitch = c.N * c.D + r.range(1, 3);
             c.o.assign(z(c.rows * c.pitch), kSentinel);
             c.out.output_cache =
                 StridedView<float>(c.o.data(), {c.rows, c.N, c.D}, {c.pitch, c.D, 1});
           }),
      fine("lowercase layout", nullptr,
           [](Cwc& c, R& r) { c.p.layout = r.chance(0.5) ? "bsnd" : "Sbh"; }),
  };
  return list;
}

void restride_inputs(Cwc& c, support::Restrider& r) { c.in.for_each_view(r); }

void validate_only(Cwc& c) { attnref::validate(c.p, c.in, c.out); }

void run_cwc(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, cwc_perturbations(), build, fuzz::Named{"nsa_compress_with_cache"},
      [seed](Cwc& c) {
        expect_oor(c.oor, [&] {
          attnref::nsa_compress_with_cache(c.p, c.in, c.out, {static_cast<int>(seed % 2 + 1)});
        });
      },
      verify_cwc, &Cwc::pool, &Cwc::w, &Cwc::slots, &Cwc::o);
}

const fuzz::Register reg_cwc("nsa_compress_with_cache", run_cwc);

// ---- nsa_update_compressed_cache ----------------------------------------------------------------

struct Upd {
  Index l = 1, d = 1, KVN = 1, Dqk = 1, Dv = 1, B = 1;
  Index kpitch = 1, vpitch = 1;  // the row strides of cp.k and cp.v
  fuzz::Pool raw, cp;  // the raw caches; the compressed ones (the sentinel in every element)
  std::vector<float> kw, vw;
  attnref::NsaDecodeParams p;
  attnref::NsaCacheUpdateInputs<float> in;
  attnref::NsaCacheUpdateOutputs<float> out;
  bool oor = false;  // the perturbation must raise std::out_of_range (index data)
  Index sel(Index b) const { return in.actual_sel_kv_seq_len[z(b)]; }
  Index fresh(Index b) const {
    return in.actual_new_kv_len.empty() ? 1 : in.actual_new_kv_len[z(b)];
  }
  // The compressed tokens the call writes: (batch, token index), batches in order.
  std::vector<std::pair<Index, Index>> writes() const {
    std::vector<std::pair<Index, Index>> w;
    for (Index b = 0; b < B; ++b)
      for (Index i = count(sel(b) - fresh(b), l, d); i < count(sel(b), l, d); ++i)
        w.emplace_back(b, i);
    return w;
  }
  // The compressed cache row of token i of batch b (under `table`, the cp table by default).
  Index row(Index b, Index i, const std::vector<i32>* table = nullptr) const {
    const auto& t = table ? *table : cp.table;
    return t[z(b * cp.mb + i / cp.pbs)] * cp.pbs + i % cp.pbs;
  }
};

void build(Upd& c, R& r) {
  c.l = r.range(1, 12);
  c.d = r.chance(0.2) ? c.l : r.range(1, c.l);
  c.KVN = r.range(1, 3), c.Dqk = r.range(1, 12);
  c.Dv = r.chance(0.3) ? c.Dqk : r.range(1, 12);
  c.B = r.range(1, 4);
  const int mode = static_cast<int>(r.range(0, 2));  // new: empty (1 each), 0..sel, sel
  std::vector<Index> sel, cmp;
  for (Index b = 0; b < c.B; ++b) {
    sel.push_back(length(r, c.l, c.d, 0.6, mode == 0 ? 1 : 0, c.l + 3 * c.d + 2));
    cmp.push_back(count(sel.back(), c.l, c.d));
  }
  fuzz::make_pool(c.raw, r, sel, r.range(1, 9), c.KVN * c.Dqk, c.KVN * c.Dv);
  fuzz::make_pool(c.cp, r, cmp, r.range(1, 6), c.KVN * c.Dqk, c.KVN * c.Dv);
  std::fill(c.cp.k.begin(), c.cp.k.end(), kSentinel);
  std::fill(c.cp.v.begin(), c.cp.v.end(), kSentinel);
  c.kw = r.normals<float>(c.l * c.KVN);
  c.vw = r.normals<float>(c.l * c.KVN);
  auto& p = c.p;
  p.compress_block_size = c.l, p.compress_block_stride = c.d, p.num_key_value_heads = c.KVN;
  p.num_heads = c.KVN * r.range(1, 2);
  p.page_block_size = c.raw.pbs, p.cmp_page_block_size = c.cp.pbs, p.strict = false;
  auto& in = c.in;
  in.key = StridedView<const float>(c.raw.k.data(), {c.raw.nb, c.raw.pbs, c.KVN * c.Dqk});
  in.value = StridedView<const float>(c.raw.v.data(), {c.raw.nb, c.raw.pbs, c.KVN * c.Dv});
  in.block_table = StridedView<const i32>(c.raw.table.data(), {c.B, c.raw.mb});
  in.key_weight = StridedView<const float>(c.kw.data(), {c.l, c.KVN});
  in.value_weight = StridedView<const float>(c.vw.data(), {c.l, c.KVN});
  in.cmp_block_table = StridedView<const i32>(c.cp.table.data(), {c.B, c.cp.mb});
  in.actual_sel_kv_seq_len.assign(sel.begin(), sel.end());
  if (mode == 1)
    for (Index s : sel)
      in.actual_new_kv_len.push_back(r.chance(0.2) ? s : r.chance(0.2) ? 0 : r.range(0, s));
  if (mode == 2) in.actual_new_kv_len.assign(sel.begin(), sel.end());
  c.out.cmp_key = StridedView<float>(c.cp.k.data(), {c.cp.nb, c.cp.pbs, c.KVN * c.Dqk});
  c.out.cmp_value = StridedView<float>(c.cp.v.data(), {c.cp.nb, c.cp.pbs, c.KVN * c.Dv});
  c.kpitch = c.KVN * c.Dqk, c.vpitch = c.KVN * c.Dv;
}

std::string verify_upd(const Upd& c) {
  std::vector<float> want_k(c.cp.k.size(), kSentinel), want_v(c.cp.v.size(), kSentinel);
  for (const auto& [b, i] : c.writes()) {
    const Index row = c.row(b, i);
    if (row < 0 || row >= c.cp.nb * c.cp.pbs) return "a write out of range was accepted";
    const auto k = vendor_token(c.raw, false, b, i * c.d + c.l, c.l, c.KVN, c.Dqk, c.kw);
    const auto v = vendor_token(c.raw, true, b, i * c.d + c.l, c.l, c.KVN, c.Dv, c.vw);
    std::copy(k.begin(), k.end(), want_k.begin() + row * c.kpitch);
    std::copy(v.begin(), v.end(), want_v.begin() + row * c.vpitch);
  }
  const std::string m = diff("cmp_key", c.cp.k, want_k, c.kpitch);
  return m.empty() ? diff("cmp_value", c.cp.v, want_v, c.vpitch) : m;
}

using PU = fuzz::Perturbation<Upd>;
using UpdOk = bool (*)(const Upd&);
using UpdEdit = void (*)(Upd&, R&);
PU must(const char* n, UpdEdit e) { return fuzz::edit<Upd>(n, true, nullptr, e); }
PU must(const char* n, UpdOk ok, UpdEdit e) { return fuzz::edit<Upd>(n, true, ok, e); }
PU fine(const char* n, UpdOk ok, UpdEdit e) { return fuzz::edit<Upd>(n, false, ok, e); }

bool writes_any(const Upd& c) { return !c.writes().empty(); }
std::pair<Index, Index> some_write(const Upd& c, R& r) {
  const auto w = c.writes();
  return w[z(r.range(0, static_cast<Index>(w.size()) - 1))];
}
// Makes actual_new_kv_len explicit (1 each when it was empty).
void explicit_new(Upd& c) {
  if (c.in.actual_new_kv_len.empty()) c.in.actual_new_kv_len.assign(z(c.B), 1);
}

// Points the compressed block of token i2 of batch b2 at the block of token i1 of batch b1
// (b1 != b2, both written) such that the write rows collide (`collide`) or stay distinct.
bool share_block(Upd& c, R& r, bool collide) {
  auto w = c.writes();
  std::shuffle(w.begin(), w.end(), r.g);
  for (const auto& [b1, i1] : w)
    for (const auto& [b2, i2] : w) {
      if (b1 == b2 || (i1 % c.cp.pbs == i2 % c.cp.pbs) != collide) continue;
      std::vector<i32> t = c.cp.table;
      const size_t at = z(b2 * c.cp.mb + i2 / c.cp.pbs);
      if (t[at] == t[z(b1 * c.cp.mb + i1 / c.cp.pbs)]) continue;
      t[at] = t[z(b1 * c.cp.mb + i1 / c.cp.pbs)];
      if (!collide) {  // every write row still distinct
        std::vector<Index> rows;
        for (const auto& [b, i] : w) rows.push_back(c.row(b, i, &t));
        std::sort(rows.begin(), rows.end());
        if (std::adjacent_find(rows.begin(), rows.end()) != rows.end()) continue;
      }
      c.cp.table = t;  // same size: the view keeps its storage
      return true;
    }
  return false;
}

const std::vector<PU>& upd_perturbations() {
  static const std::vector<PU> list{
      must("cmp_block_table entry out of range", writes_any,
           [](Upd& c, R& r) {
             const auto [b, i] = some_write(c, r);
             c.cp.table[z(b * c.cp.mb + i / c.cp.pbs)] =
                 r.chance(0.5) ? -1 : static_cast<i32>(c.cp.nb + r.range(0, 2));
             c.oor = true;
           }),
      must("raw block table entry out of range", writes_any,
           [](Upd& c, R& r) {
             const auto [b, i] = some_write(c, r);
             const Index pbs = c.raw.pbs;
             const Index pg = r.range(i * c.d / pbs, (i * c.d + c.l - 1) / pbs);
             c.raw.table[z(b * c.raw.mb + pg)] =
                 r.chance(0.5) ? -1 : static_cast<i32>(c.raw.nb + r.range(0, 2));
             c.oor = true;
           }),
      {"two writing batches share a compressed row", true,
       [](Upd& c, R& r) { return share_block(c, r, true); }},
      must("actual_new_kv_len above actual_sel_kv_seq_len",
           [](Upd& c, R& r) {
             explicit_new(c);
             const Index b = r.range(0, c.B - 1);
             c.in.actual_new_kv_len[z(b)] = c.sel(b) + r.range(1, 2);
           }),
      must("actual_new_kv_len negative",
           [](Upd& c, R& r) {
             explicit_new(c);
             c.in.actual_new_kv_len[z(r.range(0, c.B - 1))] = -r.range(1, 3);
           }),
      must(
          "actual_new_kv_len size mismatch",
          [](const Upd& c) { return !c.in.actual_new_kv_len.empty(); },
          [](Upd& c, R& r) {
            if (r.chance(0.5))
              c.in.actual_new_kv_len.push_back(0);
            else
              c.in.actual_new_kv_len.pop_back();  // B = 1: empty, then sel 0 has no new token
            if (c.in.actual_new_kv_len.empty()) c.in.actual_sel_kv_seq_len[0] = 0;
          }),
      must(
          "actual_sel_kv_seq_len 0 with one new token (actual_new_kv_len empty)",
          [](const Upd& c) { return c.in.actual_new_kv_len.empty(); },
          [](Upd& c, R& r) { c.in.actual_sel_kv_seq_len[z(r.range(0, c.B - 1))] = 0; }),
      must("actual_sel_kv_seq_len above the raw capacity",
           [](Upd& c, R& r) {
             c.in.actual_sel_kv_seq_len[z(r.range(0, c.B - 1))] =
                 c.raw.mb * c.raw.pbs + r.range(1, 3);
           }),
      must("actual_sel_kv_seq_len negative",
           [](Upd& c, R& r) { c.in.actual_sel_kv_seq_len[z(r.range(0, c.B - 1))] = -1; }),
      must(
          "compressed tokens above the cmp capacity",
          [](const Upd& c) {
            return c.cp.mb > 0 && *std::max_element(c.cp.table.begin(), c.cp.table.end()) >= 0;
          },
          [](Upd& c, R&) {  // the table narrowed below the longest batch's blocks
            Index most = 0;
            for (Index b = 0; b < c.B; ++b) most = std::max(most, count(c.sel(b), c.l, c.d));
            const Index width = (most + c.cp.pbs - 1) / c.cp.pbs - 1;
            c.in.cmp_block_table = support::reshaped(c.in.cmp_block_table, {c.B, width});
          }),
      must("key_weight or value_weight shape mismatch",
           [](Upd& c, R& r) {
             const Shape s[] = {{c.l + 1, c.KVN}, {c.l, c.KVN + 1}, {c.l * c.KVN}};
             auto& buf = r.chance(0.5) ? c.kw : c.vw;
             buf.resize(buf.size() + z(c.l + c.KVN + 1), 1.0f);
             auto& v = &buf == &c.kw ? c.in.key_weight : c.in.value_weight;
             v = StridedView<const float>(buf.data(), s[r.range(0, 2)]);
           }),
      must("cmp_value shape mismatch",
           [](Upd& c, R& r) {
             c.cp.v.resize(c.cp.v.size() * 3 + z(c.KVN * c.Dv), kSentinel);
             const Index nb = c.cp.nb, pbs = c.cp.pbs, w = c.KVN * c.Dv;
             const Shape s[] = {
                 {nb, pbs, w + 1}, {nb, pbs + 1, w}, {nb + 1, pbs, w}, {nb, pbs, c.KVN, c.Dv}};
             c.out.cmp_value = StridedView<float>(c.cp.v.data(), s[r.range(0, 3)]);
           }),
      must("cmp_key shape mismatch",
           [](Upd& c, R&) {
             c.cp.k.resize(c.cp.k.size() * 2 + z(c.KVN * c.Dqk), kSentinel);
             c.out.cmp_key =
                 StridedView<float>(c.cp.k.data(), {c.cp.nb, c.cp.pbs, c.KVN * c.Dqk + c.KVN});
           }),
      must(
          "cmp_key overlaps key",
          [](const Upd& c) { return !c.cp.k.empty() && c.raw.k.size() >= c.cp.k.size(); },
          [](Upd& c, R&) { c.out.cmp_key = support::with_data(c.out.cmp_key, c.raw.k.data()); }),
      must(
          "cmp_value overlaps an input",
          [](const Upd& c) {
            return !c.cp.v.empty() && c.raw.v.size() >= c.cp.v.size() &&
                   c.raw.k.size() >= c.cp.v.size();
          },
          [](Upd& c, R& r) {
            float* at = r.chance(0.5) ? c.raw.v.data() : c.raw.k.data();
            c.out.cmp_value = support::with_data(c.out.cmp_value, at);
          }),
      must(
          "cmp_key overlaps cmp_value", [](const Upd& c) { return !c.cp.k.empty(); },
          [](Upd& c, R&) {
            if (c.cp.k.size() >= c.cp.v.size())
              c.out.cmp_value = support::with_data(c.out.cmp_value, c.cp.k.data());
            else
              c.out.cmp_key = support::with_data(c.out.cmp_key, c.cp.v.data());
          }),
      must("compress stride above the block size",
           [](Upd& c, R& r) { c.p.compress_block_stride = c.l + r.range(1, 2); }),
      must("num_key_value_heads not dividing the caches",
           [](Upd& c, R&) { c.p.num_key_value_heads = c.KVN * c.Dqk + 1; }),
      must("page_block_size differs from the raw caches",
           [](Upd& c, R&) { c.p.page_block_size = c.raw.pbs + 1; }),
      must("cmp_page_block_size differs from the compressed caches",
           [](Upd& c, R&) { c.p.cmp_page_block_size = c.cp.pbs + 1; }),
      must("value blocks differ from key",
           [](Upd& c, R&) {
             c.raw.v.resize(c.raw.v.size() + z(c.raw.pbs * c.raw.wv), kNaN);
             c.in.value =
                 StridedView<const float>(c.raw.v.data(), {c.raw.nb + 1, c.raw.pbs, c.KVN * c.Dv});
           }),
      must(
          "key null", [](const Upd& c) { return c.raw.nb > 0; },
          [](Upd& c, R&) { c.in.key = support::with_data(c.in.key, nullptr); }),
      must("cmp_block_table size overflows",
           [](Upd& c, R&) {
             c.in.cmp_block_table = support::reshaped(c.in.cmp_block_table, {kHuge, kHuge});
           }),
      must("strict with a small shape", [](Upd& c, R&) { c.p.strict = true; }),
      // Unusual but defined.
      {"two batches share a compressed block on distinct rows", false,
       [](Upd& c, R& r) { return share_block(c, r, false); }},
      fine("garbage in table entries no write reads", nullptr,
           [](Upd& c, R& r) {
             std::vector<char> raw_used(c.raw.table.size(), 0), cmp_used(c.cp.table.size(), 0);
             for (const auto& [b, i] : c.writes()) {
               cmp_used[z(b * c.cp.mb + i / c.cp.pbs)] = 1;
               for (Index t = i * c.d; t < i * c.d + c.l; ++t)
                 raw_used[z(b * c.raw.mb + t / c.raw.pbs)] = 1;
             }
             for (size_t j = 0; j < raw_used.size(); ++j)
               if (!raw_used[j]) c.raw.table[j] = static_cast<i32>(r.range(-9, 1 << 30));
             for (size_t j = 0; j < cmp_used.size(); ++j)
               if (!cmp_used[j]) c.cp.table[j] = static_cast<i32>(r.range(-9, 1 << 30));
           }),
      fine("compressed caches padded", nullptr,
           [](Upd& c, R& r) {  // strided outputs: the gaps keep the sentinel
             const Index nb = c.cp.nb, pbs = c.cp.pbs;
             c.kpitch = c.KVN * c.Dqk + r.range(1, 3), c.vpitch = c.KVN * c.Dv + r.range(0, 3);
             c.cp.k.assign(z(nb * pbs * c.kpitch), kSentinel);
             c.cp.v.assign(z(nb * pbs * c.vpitch), kSentinel);
             c.out.cmp_key = StridedView<float>(c.cp.k.data(), {nb, pbs, c.KVN * c.Dqk},
                                                {pbs * c.kpitch, c.kpitch, 1});
             c.out.cmp_value = StridedView<float>(c.cp.v.data(), {nb, pbs, c.KVN * c.Dv},
                                                  {pbs * c.vpitch, c.vpitch, 1});
           }),
      fine("no new tokens", nullptr, [](Upd& c, R&) { c.in.actual_new_kv_len.assign(z(c.B), 0); }),
      fine("the whole prompt is new", nullptr,
           [](Upd& c, R&) {
             c.in.actual_new_kv_len.assign(c.in.actual_sel_kv_seq_len.begin(),
                                           c.in.actual_sel_kv_seq_len.end());
           }),
  };
  return list;
}

void restride_inputs(Upd& c, support::Restrider& r) { c.in.for_each_view(r); }

void validate_only(Upd& c) { attnref::validate(c.p, c.in, c.out); }

void run_upd(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, upd_perturbations(), build, fuzz::Named{"nsa_update_compressed_cache"},
      [seed](Upd& c) {
        expect_oor(c.oor, [&] {
          attnref::nsa_update_compressed_cache(c.p, c.in, c.out, {static_cast<int>(seed % 2 + 1)});
        });
      },
      verify_upd, &Upd::raw, &Upd::cp, &Upd::kw, &Upd::vw);
}

const fuzz::Register reg_upd("nsa_update_compressed_cache", run_upd);

}  // namespace fuzz_nsa_cache
