// Fuzz entry "fused_infer_attention_score_gqa_nz" (CANN FusedInferAttentionScore's GQA antiquant
// over NZ caches, V4, cann/detail/fia_gqa_nz.hpp): a bf16 query, int8 key / value caches [blockNum,
// KV_N, D / 32, blockSize, 32] (element (block, h, t, d) at [block][h][d / 32][t][d % 32]) read
// through a shuffled block table (-1 past each sequence's blocks, random int8 in the blocks no
// sequence owns), the separate fp32 scales, bf16 output. Valid cases: head size 128; (N, KV_N) (10,
// 1) mostly, (64, 8) rarely, (80, 8) and (128, 16) very rarely on short caches; BSH / BSND / BNSD;
// blocks of 128 or 512 (params.block_size the same); Q_S 1 (sparse_mode 0, no mask) or 2–16
// (sparse_mode 3, the 2048 x 2048 upper-triangle mask: row i of batch b sees keys j <= kv_b - Q_S +
// i, a row without keys is 0); kv lengths 0 to a few hundred (shorter than Q_S included), one value
// for all batches sometimes; key / value_antiquant_mode 0 / 0 (per channel in the layout's one
// shape: BSH (KV_N·D), BSND (KV_N, D), BNSD (KV_N, 1, D)) or 1 / 1 (per token, (B, S') with S' >=
// maxBlocks · blockSize); inner_precise 1; softmax_lse given with the flag off sometimes (never
// written); one or two threads. The reference is written here: naive attention in double over K =
// x8 · scale, V = x8 · scale read from the NZ order; tolerance 1e-4 + |want| / 128 (bf16), a row
// without keys exactly 0; the call with the other thread count gives the same bits. Perturbations:
// every rule of the path broken (head pairs, layouts, Q_S 17+, sparse mode / mask mismatches,
// inner_precise, the block table missing or misshapen, block sizes, mixed or unknown modes,
// offsets, missing scales or scales of another shape, softmax_lse_flag, missing / short / negative
// kv lengths or one past maxBlocks · blockSize, padding sizes, pse, a shared prefix, the legacy
// antiquant, post-quant, the sink, rope, head size 64, other cache shapes, tensor lists, a half
// query, bad extents and null data), each rejection leaving every buffer untouched; a used
// block-table entry outside [0, blockNum) must raise std::out_of_range. Defined variants (checked
// against the reference): garbage past each sequence's blocks in the table, sequences sharing a
// block, kv lengths longer than the batch, query lengths given (not read). (run_case adds
// validate() against the call, and a rerun of each valid case over strided copies of the inputs.)

#include <attnref/attnref.hpp>
#include <limits>
#include <type_traits>

#include "fuzz/fuzz.hpp"
#include "support/views.hpp"

namespace fuzz_fia_gqa_nz {

using attnref::bfloat16;
using attnref::half;
using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;
using Rng = fuzz::Rng;
using Shape = std::vector<Index>;
using i8 = std::int8_t;
using i32 = std::int32_t;
using i64 = std::int64_t;

constexpr float kOutSentinel = 777.0f;
constexpr float kLseSentinel = 4321.0f;

size_t z(Index i) { return static_cast<size_t>(i); }

// The 2048 x 2048 upper-triangle mask (1 above the diagonal), twice so that a [2, 2048, 2048]
// view stays in bounds.
StridedView<const std::uint8_t> mask_of(const Shape& s) {
  static const std::vector<std::uint8_t> m = [] {
    std::vector<std::uint8_t> x(2 * 2048 * 2048, 0);
    for (size_t k = 0; k < 2; ++k)
      for (size_t i = 0; i < 2048; ++i)
        for (size_t j = i + 1; j < 2048; ++j) x[(k * 2048 + i) * 2048 + j] = 1;
    return x;
  }();
  return StridedView<const std::uint8_t>(m.data(), s);
}

struct Nz {
  std::string layout;
  Index B = 1, N = 10, KVN = 1, D = 128, S = 1;  // S: Q_S
  Index bs = 128, nb = 0, mb = 0, W = 0;         // block size, blocks, table columns, S'
  int mode = 0;                                  // 0 per channel, 1 per token
  int threads = 1;
  bool half_query = false;  // the perturbation: a half query (and output)
  std::vector<Index> kv_len;
  std::vector<bfloat16> q, o, junk;
  std::vector<half> qh, oh;
  std::vector<i8> kc, vc, pre;  // the NZ caches; pre: a shared prefix (perturbation)
  std::vector<i32> table;
  std::vector<float> ks, vs, lse, spare;
  std::vector<i64> pad;
  attnref::FusedInferAttentionScoreParams p;
  attnref::FusedInferAttentionScoreInputs<bfloat16, i8> in;
  StridedView<bfloat16> out;
  StridedView<float> lse_out;
  bool want_out_of_range = false;  // the perturbation must raise std::out_of_range
};

// The query's (and output's) shape and the offset of element (b, i, h, 0).
Shape qshape(const Nz& c) {
  if (c.layout == "BSH") return {c.B, c.S, c.N * c.D};
  if (c.layout == "BNSD") return {c.B, c.N, c.S, c.D};
  return {c.B, c.S, c.N, c.D};
}
Index qat(const Nz& c, Index b, Index i, Index h) {
  if (c.layout == "BNSD") return ((b * c.N + h) * c.S + i) * c.D;
  return ((b * c.S + i) * c.N + h) * c.D;
}

Shape cshape(const Nz& c) { return {c.nb, c.KVN, c.D / 32, c.bs, 32}; }

// Offset in the NZ cache of (token t of batch b, kv head h, channel d).
Index cat(const Nz& c, Index b, Index t, Index h, Index d) {
  const Index blk = c.table[z(b * c.mb + t / c.bs)];
  return (((blk * c.KVN + h) * (c.D / 32) + d / 32) * c.bs + t % c.bs) * 32 + d % 32;
}

// The per-channel scale shape of the layout, or per token (B, S').
Shape sshape(const Nz& c) {
  if (c.mode == 1) return {c.B, c.W};
  if (c.layout == "BSH") return {c.KVN * c.D};
  if (c.layout == "BSND") return {c.KVN, c.D};
  return {c.KVN, 1, c.D};
}

Index numel(const Shape& s) {
  Index n = 1;
  for (Index e : s) n *= e;
  return n;
}

// n random int8 values (eight a draw), all of [-128, 127].
std::vector<i8> bytes(Rng& r, Index n) {
  std::vector<i8> x(z(std::max<Index>(n, 1)));
  std::uint64_t bits = 0;
  for (size_t i = 0; i < x.size(); ++i, bits >>= 8) {
    if (i % 8 == 0) bits = r.g();
    x[i] = static_cast<i8>(static_cast<int>(bits & 0xFFu) - 128);
  }
  return x;
}

float uniform(Rng& r, float lo, float hi) {
  return std::uniform_real_distribution<float>(lo, hi)(r.g);
}

// What a rebuilt case must have (0: drawn as usual).
struct Force {
  Index n = 0, kvn = 0, qs = 0, bs = 0, d = 0;
};

void build_with(Nz& c, Rng& r, const Force& f) {
  static const char* layouts[] = {"BSH", "BSND", "BNSD"};
  c.layout = layouts[r.range(0, 2)];
  const double pair = uniform(r, 0, 1);
  bool big = false;  // 80 / 8 and 128 / 16: short caches, one batch, few rows
  if (f.n) {
    c.N = f.n, c.KVN = f.kvn, big = f.n > 64;
  } else if (pair < 0.88) {
    c.N = 10, c.KVN = 1;
  } else if (pair < 0.96) {
    c.N = 64, c.KVN = 8;
  } else {
    big = true;
    c.N = pair < 0.98 ? 80 : 128, c.KVN = c.N == 80 ? 8 : 16;
  }
  const bool wide = c.N >= 64;
  c.D = f.d ? f.d : 128;
  c.B = big ? 1 : r.range(1, wide ? 2 : 3);
  c.bs = f.bs ? f.bs : r.chance(0.75) ? 128 : 512;
  c.S = f.qs ? f.qs : r.chance(0.5) ? 1 : r.chance(0.7) || wide ? r.range(2, 4) : r.range(5, 16);
  const Index top = big                            ? 20
                    : wide                         ? 150
                    : c.S > 4                      ? 260
                    : c.bs == 512 && r.chance(0.3) ? 1100
                                                   : 400;
  for (Index b = 0; b < c.B; ++b)
    c.kv_len.push_back(r.chance(0.1) ? 0
                       : r.chance(0.15)
                           ? r.range(1, c.S + 1)
                           : r.range(1, r.chance(0.5) ? std::min<Index>(64, top) : top));
  Index used = 0, most = 0;
  for (Index l : c.kv_len)
    used += (l + c.bs - 1) / c.bs, most = std::max(most, (l + c.bs - 1) / c.bs);
  c.mb = std::max<Index>(1, most + r.range(0, 1));
  c.nb = std::max<Index>(1, used + r.range(0, 2));  // spare blocks: random, never referenced
  std::vector<i32> ids(z(c.nb));
  for (Index i = 0; i < c.nb; ++i) ids[z(i)] = static_cast<i32>(i);
  std::shuffle(ids.begin(), ids.end(), r.g);
  c.table.assign(z(c.B * c.mb), -1);
  Index next = 0;
  for (Index b = 0; b < c.B; ++b)
    for (Index j = 0; j * c.bs < c.kv_len[z(b)]; ++j) c.table[z(b * c.mb + j)] = ids[z(next++)];
  c.kc = bytes(r, numel(cshape(c)));
  c.vc = bytes(r, numel(cshape(c)));
  c.mode = static_cast<int>(r.range(0, 1));
  c.W = c.mb * c.bs + (r.chance(0.3) ? r.range(1, 3) : 0);
  const Index ns = numel(sshape(c));
  c.ks.clear(), c.vs.clear();
  for (Index i = 0; i < ns; ++i) {
    c.ks.push_back(r.chance(0.05) ? uniform(r, -0.01f, 0.0f) : uniform(r, 0.002f, 0.014f));
    c.vs.push_back(r.chance(0.05) ? uniform(r, -0.01f, 0.0f) : uniform(r, 0.002f, 0.014f));
  }
  c.q = r.normals<bfloat16>(c.B * c.S * c.N * c.D);
  c.o.assign(c.q.size(), bfloat16(kOutSentinel));
  c.lse.assign(z(c.B * c.N * c.S), kLseSentinel);
  // The call.
  c.p.num_heads = c.N;
  c.p.num_key_value_heads = c.KVN;
  c.p.scale_value = uniform(r, 0.5f, 2.0f) / std::sqrt(static_cast<double>(c.D));
  c.p.input_layout = c.layout;
  c.p.sparse_mode = c.S > 1 ? 3 : 0;
  c.p.block_size = c.bs;
  c.p.key_antiquant_mode = c.p.value_antiquant_mode = c.mode;
  c.p.inner_precise = 1;
  c.in.query = StridedView<const bfloat16>(c.q.data(), qshape(c));
  c.in.key = {StridedView<const i8>(c.kc.data(), cshape(c))};
  c.in.value = {StridedView<const i8>(c.vc.data(), cshape(c))};
  c.in.block_table = StridedView<const i32>(c.table.data(), {c.B, c.mb});
  c.in.actual_seq_lengths_kv.assign(c.kv_len.begin(), c.kv_len.end());
  const bool same =
      std::all_of(c.kv_len.begin(), c.kv_len.end(), [&](Index l) { return l == c.kv_len[0]; });
  if (same && r.chance(0.3)) c.in.actual_seq_lengths_kv.resize(1);  // one value broadcasts
  c.in.key_antiquant_scale = StridedView<const float>(c.ks.data(), sshape(c));
  c.in.value_antiquant_scale = StridedView<const float>(c.vs.data(), sshape(c));
  if (c.S > 1) c.in.atten_mask = mask_of({2048, 2048});
  c.out = StridedView<bfloat16>(c.o.data(), qshape(c));
  if (r.chance(0.3))  // the flag is off: given, never written
    c.lse_out = StridedView<float>(c.lse.data(), {c.B, c.N, c.S, 1});
  c.threads = static_cast<int>(r.range(1, 2));
}

void build(Nz& c, Rng& r) { build_with(c, r, Force{}); }

void rebuild(Nz& c, Rng& r, const Force& f) {
  c = Nz{};
  build_with(c, r, f);
}

// ---- The reference ---------------------------------------------------------------------------

// Naive attention in double over the dequantized NZ caches: row i of batch b sees keys
// j <= kv_b - Q_S + i (Q_S 1: every key), query head h reads kv head h / (N / KV_N).
std::string verify(const Nz& c) {
  const Index g = c.N / c.KVN;
  for (Index b = 0; b < c.B; ++b) {
    const Index kv = c.kv_len[z(b)];
    // K / V of the batch, dequantized: [t][h][d].
    std::vector<double> k(z(kv * c.KVN * c.D)), v(k.size());
    for (Index t = 0; t < kv; ++t)
      for (Index h = 0; h < c.KVN; ++h)
        for (Index d = 0; d < c.D; ++d) {
          const size_t m = c.mode == 0 ? z(h * c.D + d) : z(b * c.W + t);
          const size_t at = z(cat(c, b, t, h, d)), to = z((t * c.KVN + h) * c.D + d);
          k[to] = c.kc[at] * static_cast<double>(c.ks[m]);
          v[to] = c.vc[at] * static_cast<double>(c.vs[m]);
        }
    for (Index i = 0; i < c.S; ++i) {
      const Index last = c.S == 1 ? kv - 1 : kv - c.S + i;  // the last key the row sees
      for (Index h = 0; h < c.N; ++h) {
        const Index at = qat(c, b, i, h), kh = h / g;
        std::vector<double> w(z(c.D), 0.0);
        if (last >= 0) {
          std::vector<double> s;
          double top = -std::numeric_limits<double>::infinity();
          for (Index j = 0; j <= last; ++j) {
            double x = 0;
            for (Index d = 0; d < c.D; ++d)
              x += static_cast<double>(static_cast<float>(c.q[z(at + d)])) *
                   k[z((j * c.KVN + kh) * c.D + d)];
            s.push_back(x * c.p.scale_value);
            top = std::max(top, s.back());
          }
          double sum = 0;
          for (double& x : s) sum += (x = std::exp(x - top));
          for (Index j = 0; j <= last; ++j)
            for (Index d = 0; d < c.D; ++d)
              w[z(d)] += s[z(j)] / sum * v[z((j * c.KVN + kh) * c.D + d)];
        }
        for (Index d = 0; d < c.D; ++d) {
          const double got = static_cast<float>(c.o[z(at + d)]);
          const bool ok =
              last < 0 ? got == 0.0 : std::fabs(got - w[z(d)]) <= 1e-4 + std::fabs(w[z(d)]) / 128;
          if (!ok)
            return "(b, i, h) (" + std::to_string(b) + ", " + std::to_string(i) + ", " +
                   std::to_string(h) + ") element " + std::to_string(d) + ": got " +
                   std::to_string(got) + ", want " + std::to_string(w[z(d)]) +
                   (last < 0 ? " (no visible key)" : "");
        }
      }
    }
  }
  for (float x : c.lse)
    if (!(x == kLseSentinel)) return "softmax_lse written with softmax_lse_flag off";
  // The other thread count: the same bits.
  std::vector<bfloat16> o2(c.o.size(), bfloat16(kOutSentinel));
  const attnref::FusedInferAttentionScoreOutputs<bfloat16> out2{
      StridedView<bfloat16>(o2.data(), c.out.shape())};
  try {
    attnref::fused_infer_attention_score(c.p, c.in, out2, {3 - c.threads});
  } catch (const std::exception& e) {
    return std::string("rejected with the other thread count: ") + e.what();
  }
  if (!fuzz::same_bits(c.o, o2)) return "the thread count changed the bits";
  return "";
}

// ---- Perturbations ---------------------------------------------------------------------------

using Ok = bool (*)(const Nz&);
using Change = void (*)(Nz&, Rng&);

template <class X>
X pick(Rng& r, const std::vector<X>& list) {
  return list[z(r.range(0, static_cast<Index>(list.size()) - 1))];
}

// At least n floats (0.01) in c.spare (one call per edit: the next one moves the buffer).
const float* spare(Nz& c, Index n) {
  c.spare.assign(z(std::max<Index>(n, 1)), 0.01f);
  return c.spare.data();
}

bool has_keys(const Nz& c) { return *std::max_element(c.kv_len.begin(), c.kv_len.end()) > 0; }

// The kv lengths one per batch (a broadcast single value expanded).
void full_lengths(Nz& c) { c.in.actual_seq_lengths_kv.assign(c.kv_len.begin(), c.kv_len.end()); }

const std::vector<fuzz::Perturbation<Nz>>& perturbations() {
  const auto must = [](auto n, Ok o, Change f) { return fuzz::edit<Nz>(n, true, o, f); };
  const auto fine = [](auto n, Ok o, Change f) { return fuzz::edit<Nz>(n, false, o, f); };
  using CT = StridedView<const bfloat16>;
  static const std::vector<fuzz::Perturbation<Nz>> list{
      // Heads, layouts, Q_S, sparse mode and mask, inner_precise.
      must("a head pair other than 10 / 1, 64 / 8, 80 / 8, 128 / 16", nullptr,
           [](Nz& c, Rng& r) {
             static const std::pair<Index, Index> pairs[] = {{8, 1},  {10, 2}, {20, 2},  {16, 2},
                                                             {64, 4}, {1, 1},  {10, 10}, {32, 4}};
             if (r.chance(0.5)) {
               const auto [n, kvn] = pairs[r.range(0, 7)];
               return rebuild(c, r, {n, kvn});
             }
             c.p.num_key_value_heads = pick<i64>(r, {0, 2, 5, c.N, -1});
           }),
      must("input_layout other than BSH, BSND or BNSD", nullptr,
           [](Nz& c, Rng& r) {
             c.p.input_layout = pick<std::string>(
                 r, {"TND", "BNSD_BSND", "BSND_NBSD", "BSH_NBSD", "NTD_TND", "SBH"});
           }),
      must("Q_S 17 to 20", nullptr,
           [](Nz& c, Rng& r) {
             rebuild(c, r, {0, 0, r.range(17, 20)});
           }),
      must(
          "Q_S 1 with sparse_mode 3 or a mask", [](const Nz& c) { return c.S == 1; },
          [](Nz& c, Rng& r) {
            const Index w = r.range(0, 2);
            if (w != 1) c.p.sparse_mode = 3;
            if (w != 0)
              c.in.atten_mask =
                  mask_of(r.chance(0.6) ? Shape{2048, 2048} : Shape{c.B, c.mb * c.bs});
          }),
      must(
          "Q_S > 1 with sparse_mode 0 (with or without the mask)",
          [](const Nz& c) { return c.S > 1; },
          [](Nz& c, Rng& r) {
            c.p.sparse_mode = 0;
            if (r.chance(0.5)) c.in.atten_mask = {};
          }),
      must(
          "Q_S > 1 without the mask or with a mask of another shape",
          [](const Nz& c) { return c.S > 1; },
          [](Nz& c, Rng& r) {
            static const Shape bad[] = {
                {2048, 2047}, {2047, 2048}, {2, 2048, 2048}, {1, 2048, 2048}, {1, 1, 2048, 2048}};
            const Index w = r.range(0, 5);
            c.in.atten_mask = w == 0 ? StridedView<const std::uint8_t>{} : mask_of(bad[w - 1]);
          }),
      must("sparse_mode 1, 2, 4 or out of range", nullptr,
           [](Nz& c, Rng& r) {
             c.p.sparse_mode = pick<i64>(r, {1, 2, 4, -1, 5});
           }),
      must("inner_precise other than 1", nullptr,
           [](Nz& c, Rng& r) {
             c.p.inner_precise = pick<i64>(r, {0, 2, 3, -1});
           }),
      // The cache, block table and block size.
      must("block_table missing", nullptr, [](Nz& c, Rng&) { c.in.block_table = {}; }),
      must("block_table of another shape", nullptr,
           [](Nz& c, Rng& r) {
             const Index w = r.range(0, 2);
             c.table.resize(z((c.B + 1) * c.mb), -1);
             const i32* t = c.table.data();
             c.in.block_table = w == 0   ? StridedView<const i32>(t, {c.B + 1, c.mb})
                                : w == 1 ? StridedView<const i32>(t, {c.B * c.mb})
                                         : StridedView<const i32>(t, {c.B, c.mb, 1});
           }),
      must("params.block_size not the cache's", nullptr,
           [](Nz& c, Rng& r) {
             c.p.block_size = pick<i64>(r, {0, 64, 256, c.bs == 128 ? 512 : 128, -128});
           }),
      must("cache blocks of 16, 64 or 256 (block_size the same)", nullptr,
           [](Nz& c, Rng& r) {
             rebuild(c, r, {0, 0, 0, pick<Index>(r, {16, 64, 256})});
           }),
      must("head size 64 (the cache [blockNum, KV_N, 2, blockSize, 32])", nullptr,
           [](Nz& c, Rng& r) {
             rebuild(c, r, {0, 0, 0, 0, 64});
           }),
      must("key / value cache not NZ for the heads (at most the element count)", nullptr,
           [](Nz& c, Rng& r) {
             const Index kvn = c.KVN, d32 = c.D / 32, bs = c.bs, nb = c.nb;
             const Shape s = pick(r, std::vector<Shape>{{nb, kvn, d32, bs / 2, 64},
                                                        {nb, kvn, 2 * d32, bs / 2, 32},
                                                        {nb, kvn, d32, bs, 16},
                                                        {nb, kvn + 1, d32, bs / 2, 32}});
             c.in.key = {StridedView<const i8>(c.kc.data(), s)};
             if (r.chance(0.7)) c.in.value = {StridedView<const i8>(c.vc.data(), s)};
           }),
      must("value cache of another shape than the key's", nullptr,
           [](Nz& c, Rng& r) {
             const Shape s = c.nb > 1 && r.chance(0.5) ? Shape{c.nb - 1, c.KVN, c.D / 32, c.bs, 32}
                                                       : Shape{c.nb, c.KVN, c.D / 32, c.bs / 2, 32};
             c.in.value = {StridedView<const i8>(c.vc.data(), s)};
           }),
      must("key / value tensor lists", nullptr,
           [](Nz& c, Rng& r) {
             c.in.key.push_back(c.in.key[0]);
             if (r.chance(0.7)) c.in.value.push_back(c.in.value[0]);
           }),
      must("a used block_table entry outside [0, blockNum)", has_keys,
           [](Nz& c, Rng& r) {
             Index b = r.range(0, c.B - 1);
             while (c.kv_len[z(b)] == 0) b = (b + 1) % c.B;
             const i32 bad[] = {-1, static_cast<i32>(c.nb), static_cast<i32>(c.nb + 7),
                                std::numeric_limits<i32>::max(), std::numeric_limits<i32>::min()};
             c.table[z(b * c.mb + r.range(0, (c.kv_len[z(b)] - 1) / c.bs))] = bad[r.range(0, 4)];
             c.want_out_of_range = true;
           }),
      // kv lengths.
      must("actual_seq_lengths_kv missing", nullptr,
           [](Nz& c, Rng&) { c.in.actual_seq_lengths_kv.clear(); }),
      must("a kv length past maxBlocks · blockSize", nullptr,
           [](Nz& c, Rng& r) {
             full_lengths(c);
             c.in.actual_seq_lengths_kv[z(r.range(0, c.B - 1))] = c.mb * c.bs + r.range(1, 3);
           }),
      must("a kv length negative or huge", nullptr,
           [](Nz& c, Rng& r) {
             full_lengths(c);
             c.in.actual_seq_lengths_kv[z(r.range(0, c.B - 1))] =
                 pick<i64>(r, {-1, -300, kHuge, std::numeric_limits<i64>::max()});
           }),
      must(
          "actual_seq_lengths_kv shorter than the batch (not 1)",
          [](const Nz& c) { return c.B == 3; },
          [](Nz& c, Rng&) {
            c.in.actual_seq_lengths_kv.assign(c.kv_len.begin(), c.kv_len.end() - 1);
          }),
      // Scales and modes.
      must("antiquant modes mixed or unknown", nullptr,
           [](Nz& c, Rng& r) {
             static const std::pair<i64, i64> bad[] = {{0, 1}, {1, 0},   {2, 2}, {3, 3},
                                                       {0, 2}, {-1, -1}, {4, 4}};
             std::tie(c.p.key_antiquant_mode, c.p.value_antiquant_mode) = bad[r.range(0, 6)];
           }),
      must("key / value antiquant offsets", nullptr,
           [](Nz& c, Rng& r) {
             const Index w = r.range(0, 2);
             const Shape s = sshape(c);
             const float* o = spare(c, numel(s));
             if (w != 1) c.in.key_antiquant_offset = StridedView<const float>(o, s);
             if (w != 0) c.in.value_antiquant_offset = StridedView<const float>(o, s);
           }),
      must("a scale missing (or both)", nullptr,
           [](Nz& c, Rng& r) {
             const Index w = r.range(0, 2);
             if (w != 1) c.in.key_antiquant_scale = {};
             if (w != 0) c.in.value_antiquant_scale = {};
           }),
      must("a scale of another shape", nullptr,
           [](Nz& c, Rng& r) {
             const Index kvn = c.KVN, D = c.D, B = c.B, cols = c.mb * c.bs;
             std::vector<Shape> bad;
             if (c.mode == 0) {
               for (const Shape& s : {Shape{kvn * D}, Shape{kvn, D}, Shape{kvn, 1, D},
                                      Shape{1, kvn, D}, Shape{1, kvn * D}, Shape{1, kvn, 1, D},
                                      Shape{kvn, D + 1}, Shape{kvn + 1, 1, D}})
                 if (s != sshape(c)) bad.push_back(s);
             } else {
               bad = {{B, cols - 1}, {1, B, c.W}, {B + 1, c.W}, {B, c.W, 1}, {B * c.W}, {B, 1}};
             }
             const Shape s = pick(r, bad);
             const float* x = spare(c, numel(s));
             const Index w = r.range(0, 2);
             if (w != 1) c.in.key_antiquant_scale = StridedView<const float>(x, s);
             if (w != 0) c.in.value_antiquant_scale = StridedView<const float>(x, s);
           }),
      must("the legacy antiquant_scale / offset or per-token fields", nullptr,
           [](Nz& c, Rng& r) {
             const Index kw = c.KVN * c.D, w = r.range(0, 2);
             c.junk.assign(z(2 * kw), bfloat16(0.01f));
             const CT a(c.junk.data(), {2, kw});
             if (w == 0) c.in.antiquant_scale = a;
             if (w == 1) c.in.antiquant_offset = a;
             if (w == 2)
               c.in.antiquant_scale_per_token =
                   StridedView<const float>(spare(c, 2 * c.B * c.W), {2, c.B, c.W});
           }),
      // Features the path does not take.
      must("softmax_lse_flag", nullptr,
           [](Nz& c, Rng&) {
             c.p.softmax_lse_flag = true;
             c.lse_out = StridedView<float>(c.lse.data(), {c.B, c.N, c.S, 1});
           }),
      must("query_padding_size or kv_padding_size", nullptr,
           [](Nz& c, Rng& r) {
             c.pad.assign(1, r.range(0, 1));
             (r.chance(0.5) ? c.in.query_padding_size : c.in.kv_padding_size) =
                 StridedView<const i64>(c.pad.data(), {1});
           }),
      must("pse_shift", nullptr,
           [](Nz& c, Rng&) {
             const Index cols = c.mb * c.bs;
             c.junk.assign(z(c.N * c.S * cols), bfloat16(0.5f));
             c.in.pse_shift = CT(c.junk.data(), {1, c.N, c.S, cols});
           }),
      must("a shared prefix (key / value_shared_prefix or actual_shared_prefix_len)", nullptr,
           [](Nz& c, Rng& r) {
             c.pre.assign(z(2 * c.KVN * c.D), 1);
             const StridedView<const i8> x(c.pre.data(), {1, 2, c.KVN * c.D});
             if (r.chance(0.3)) {
               c.in.actual_shared_prefix_len = {1};
             } else {
               c.in.key_shared_prefix = c.in.value_shared_prefix = x;
             }
           }),
      must("quant_scale2 / quant_offset2 or deq_scale1 / quant_scale1 / deq_scale2", nullptr,
           [](Nz& c, Rng& r) {
             const StridedView<const float> s(spare(c, 1), {1});
             const Index w = r.range(0, 4);
             if (w == 0) c.in.quant_scale2 = s;
             if (w == 1) c.in.quant_offset2 = s;
             if (w == 2) c.in.deq_scale1 = s;
             if (w == 3) c.in.quant_scale1 = s;
             if (w == 4) c.in.deq_scale2 = s;
           }),
      must("learnable_sink or query_rope / key_rope", nullptr,
           [](Nz& c, Rng& r) {
             static const bfloat16 sink[128] = {};
             if (r.chance(0.4)) {
               c.in.learnable_sink = StridedView<const bfloat16>(sink, {c.N});
               return;
             }
             Shape qs = qshape(c);
             qs.back() = c.layout == "BSH" ? c.N * 64 : 64;
             c.junk.assign(z(numel(qs)), bfloat16(0.5f));
             c.in.query_rope = CT(c.junk.data(), qs);
             c.in.key_rope = CT(c.junk.data(), {1, 1, 64});
           }),
      must("a half query (and output)", nullptr,
           [](Nz& c, Rng&) {
             c.half_query = true;
             for (bfloat16 x : c.q) c.qh.push_back(half(static_cast<float>(x)));
             c.oh.assign(c.q.size(), half(kOutSentinel));
           }),
      // Outputs.
      must("attention_out of another shape", nullptr,
           [](Nz& c, Rng& r) {
             Shape s(c.out.shape().begin(), c.out.shape().end());
             s[z(r.range(0, static_cast<Index>(s.size()) - 1))] += 1;
             c.o.resize(z(numel(s)), bfloat16(kOutSentinel));
             c.out = StridedView<bfloat16>(c.o.data(), s);
           }),
      // Extents and data.
      must("a cache view with a negative extent", nullptr,
           [](Nz& c, Rng& r) {
             auto& v = r.chance(0.5) ? c.in.key[0] : c.in.value[0];
             const int d = static_cast<int>(r.range(0, 4));
             v = support::resized(v, d, -v.size(d) - 1);
           }),
      must("a cache view whose size overflows", nullptr,
           [](Nz& c, Rng& r) {
             auto& v = r.chance(0.5) ? c.in.key[0] : c.in.value[0];
             v = support::resized(support::resized(v, 0, kHuge), 3, kHuge);
           }),
      must("null data in the query, a cache, the block table or a scale", nullptr,
           [](Nz& c, Rng& r) {
             const Index w = r.range(0, 4);
             if (w == 0) c.in.query = support::with_data<const bfloat16>(c.in.query, nullptr);
             if (w == 1) c.in.key[0] = support::with_data<const i8>(c.in.key[0], nullptr);
             if (w == 2) c.in.value[0] = support::with_data<const i8>(c.in.value[0], nullptr);
             if (w == 3)
               c.in.block_table = support::with_data<const i32>(c.in.block_table, nullptr);
             if (w == 4)
               c.in.key_antiquant_scale =
                   support::with_data<const float>(c.in.key_antiquant_scale, nullptr);
           }),
      // Unusual but defined.
      fine("garbage in block_table past each sequence's blocks", nullptr,
           [](Nz& c, Rng& r) {
             for (Index b = 0; b < c.B; ++b)
               for (Index j = (c.kv_len[z(b)] + c.bs - 1) / c.bs; j < c.mb; ++j)
                 c.table[z(b * c.mb + j)] = r.chance(0.3) ? std::numeric_limits<i32>::max()
                                                          : static_cast<i32>(r.range(-999, 999));
           }),
      fine(
          "two sequences sharing a block",
          [](const Nz& c) {
            return std::count_if(c.kv_len.begin(), c.kv_len.end(), [](Index l) { return l > 0; }) >=
                   2;
          },
          [](Nz& c, Rng&) {  // the second sequence's first block: the first one's
            Index a = 0;
            while (c.kv_len[z(a)] == 0) ++a;
            Index b = a + 1;
            while (c.kv_len[z(b)] == 0) ++b;
            c.table[z(b * c.mb)] = c.table[z(a * c.mb)];
          }),
      fine("actual_seq_lengths_kv longer than the batch (the rest ignored)", nullptr,
           [](Nz& c, Rng& r) {
             full_lengths(c);
             for (Index i = r.range(1, 2); i > 0; --i)
               c.in.actual_seq_lengths_kv.push_back(r.range(0, 5000));
           }),
      fine("actual_seq_lengths given (the query lengths are not read)", nullptr,
           [](Nz& c, Rng& r) {
             for (Index b = 0; b < c.B; ++b) c.in.actual_seq_lengths.push_back(r.range(1, c.S));
           }),
  };
  return list;
}

// ---- The call --------------------------------------------------------------------------------

// The call (run) or validate() with a half query and output: the same inputs otherwise.
void call_half(Nz& c, bool run, int threads) {
  attnref::FusedInferAttentionScoreInputs<half, i8> h;
  h.query = StridedView<const half>(c.qh.data(), c.in.query.shape());
  h.key = c.in.key, h.value = c.in.value, h.block_table = c.in.block_table;
  h.atten_mask = c.in.atten_mask;
  h.actual_seq_lengths = c.in.actual_seq_lengths;
  h.actual_seq_lengths_kv = c.in.actual_seq_lengths_kv;
  h.key_antiquant_scale = c.in.key_antiquant_scale;
  h.value_antiquant_scale = c.in.value_antiquant_scale;
  const attnref::FusedInferAttentionScoreOutputs<half> o{
      StridedView<half>(c.oh.data(), c.out.shape()), c.lse_out};
  if (run)
    attnref::fused_infer_attention_score(c.p, h, o, {threads});
  else
    attnref::validate(c.p, h, o);
}

void invoke(Nz& c, bool run, int threads) {
  if (c.half_query) return call_half(c, run, threads);
  const attnref::FusedInferAttentionScoreOutputs<bfloat16> o{c.out, c.lse_out};
  if (run)
    attnref::fused_infer_attention_score(c.p, c.in, o, {threads});
  else
    attnref::validate(c.p, c.in, o);
}

void validate_only(Nz& c) { invoke(c, false, 0); }

void restride_inputs(Nz& c, support::Restrider& r) {
  c.in.for_each_view([&](const std::string& name, auto& view) {
    if (name != "atten_mask") r(name, view);  // 4 M elements
  });
}

void run(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, perturbations(), build,
      fuzz::Named{"fused_infer_attention_score_gqa_nz", "fused_infer_attention_score"},
      [](Nz& c) {
        fuzz::call_expecting_range(c.want_out_of_range, [&] { invoke(c, true, c.threads); });
      },
      verify, &Nz::q, &Nz::o, &Nz::qh, &Nz::oh, &Nz::kc, &Nz::vc, &Nz::table, &Nz::ks, &Nz::vs,
      &Nz::lse, &Nz::spare, &Nz::junk, &Nz::pre, &Nz::pad);
}

// Its cases cost several times an average entry's (head size 128, up to 16 rows of 10 heads).
const fuzz::Register reg("fused_infer_attention_score_gqa_nz", run, 4);

}  // namespace fuzz_fia_gqa_nz
