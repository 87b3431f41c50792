// Fuzz entry "fused_infer_attention_score_mla_quant": FusedInferAttentionScore's MLA full
// quantization (cann/detail/fia_mla_quant.hpp): an int8 query with bf16 query_rope and an fp32
// dequant_scale_query per query row and head (query_quant_mode 3), int8 key / value caches and a
// bf16 key_rope cache in the NZ layout ([blockNum, 1, 512 / 32, 128, 32], [blockNum, 1, 4, 128,
// 16]), per-tensor key / value scales (1), a bf16 output. Valid cases: BSH / BSND with Q_S 1
// (sparse_mode 0, no mask) or 2–3, rarely up to 16 (sparse_mode 3, the 2048 x 2048 mask), TND with
// per-batch query rows 0–3, rarely 16 (sparse_mode 0 or 3); a quarter of the cases write the
// head-major output (BSH_NBSD / BSND_NBSD [N, B, S, 512], TND_NTD [N, T, 512]); N 1–8, rarely 16;
// B 1–3; kv lengths 0–700, mostly under 300 (over 512 sometimes: P is quantized per 512-key
// block), a shuffled block table (-1 past each sequence's blocks), a spare block; the value the
// key's tensor or its own; random exec tiling; one or two threads. Checks: every element against
// the independent reference (reference/cann_mla_quant.hpp, the tolerance of
// tests/cann/fia_mla_quant_test.cpp: bf16 rounding + the row's near-tie slack + 1e-4 of the row's
// largest value), so rows without a visible key are exactly 0; a second call with the other
// thread count (and, when the value is the key's tensor, a separate copy of it) gives the same
// bits; softmax_lse given with the flag off is not written. Perturbations: every rule of
// fia_mla_quant_rules (query_quant_mode, dequant_scale_query, scale shapes, offsets, antiquant
// modes, the combined antiquant fields, pse, prefix, BNSD, tensor lists, block size, NZ shapes)
// and of the MLA plan (heads, Q_S, sparse modes and masks, layouts and head-major outputs, rope
// shapes, features, block table, lengths, lse), huge / negative extents, null data, a half output,
// each rejection leaving every buffer untouched; a used block-table entry out of range must raise
// std::out_of_range. (run_case adds validate() against the call, and a rerun of each valid case
// over strided copies of the inputs.)

#include <attnref/attnref.hpp>
#include <limits>
#include <type_traits>

#include "fuzz/fuzz.hpp"
#include "reference/cann_mla_quant.hpp"
#include "support/views.hpp"

namespace fuzz_fia_mla_quant {

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

constexpr Index kD = 512, kR = 64, kBs = 128;
constexpr Index kBlockK = kBs * kD, kBlockR = kBs * kR;  // elements of a cache block
constexpr float kOutSentinel = 777.0f;
constexpr float kLseSentinel = 4321.0f;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

size_t z(Index i) { return static_cast<size_t>(i); }

Index numel(const Shape& s) {
  Index n = 1;
  for (Index e : s) n *= e;
  return n;
}

// The compressed masks (never read): zeros, twice 2048 x 2048 (a [2, 2048, 2048] view stays in
// bounds), and ones.
StridedView<const std::uint8_t> mask_of(const Shape& s, bool ones = false) {
  static const std::vector<std::uint8_t> zeros(2 * 2048 * 2048, 0), all(2048 * 2048, 1);
  return StridedView<const std::uint8_t>(ones ? all.data() : zeros.data(), s);
}

struct Mq {
  std::string layout;     // the base layout: BSH, BSND, TND
  bool nmajor = false;    // the head-major output (*_NBSD, TND_NTD)
  bool same_kv = true;    // value: the key's tensor
  bool half_out = false;  // the perturbation: a half output
  int threads = 1;
  Index B = 1, N = 1, S = 0, T = 0;  // S: non-TND Q_S; T: TND rows
  Index nb = 0, mb = 0;              // cache blocks, block-table columns
  std::vector<Index> q_len, kv_len;
  std::vector<ref::cann::MlaQuantBatch> ref;  // each batch row-major, as the reference takes it
  std::vector<i8> q, k, v, junk;              // v: empty when the value is the key's tensor
  std::vector<bfloat16> qr, kr, o, junk_bf;
  std::vector<half> ho, junk_h;
  std::vector<float> dqq, dqk, dqv, lse, spare;
  std::vector<i32> table;
  attnref::FusedInferAttentionScoreParams p;
  attnref::FusedInferAttentionScoreInputs<i8, i8> in;
  StridedView<bfloat16> out;
  StridedView<float> lse_out;
  attnref::ExecConfig ex;
  bool want_out_of_range = false;  // the perturbation must raise std::out_of_range
};

bool tnd(const Mq& c) { return c.layout == "TND"; }
Index rows(const Mq& c) { return tnd(c) ? c.T : c.B * c.S; }

// A query-shaped tensor with head size w (the base layout).
Shape qshape(const Mq& c, Index w) {
  if (tnd(c)) return {c.T, c.N, w};
  if (c.layout == "BSH") return {c.B, c.S, c.N * w};
  return {c.B, c.S, c.N, w};
}
// The output: the query's shape, or head-major.
Shape oshape(const Mq& c, bool nmajor) {
  if (!nmajor) return qshape(c, kD);
  return tnd(c) ? Shape{c.N, c.T, kD} : Shape{c.N, c.B, c.S, kD};
}
Shape dshape(const Mq& c) { return tnd(c) ? Shape{c.T, c.N} : Shape{c.B, c.S, c.N}; }
Shape lse_shape(const Mq& c) { return tnd(c) ? Shape{c.T, c.N, 1} : Shape{c.B, c.N, c.S, 1}; }
Shape kshape(Index nb) { return {nb, 1, kD / 32, kBs, 32}; }
Shape rshape(Index nb) { return {nb, 1, kR / 16, kBs, 16}; }

// NZ index of channel d of token t of block b (c0 channels a chunk, w channels in all).
size_t nz_at(Index b, Index t, Index d, Index c0, Index w) {
  return z(((b * (w / c0) + d / c0) * kBs + t) * c0 + d % c0);
}

// n random bytes (eight a draw).
std::vector<i8> bytes(Rng& r, Index n) {
  std::vector<i8> x(z(n));
  for (size_t i = 0; i < x.size(); i += 8) {
    const std::uint64_t bits = r.g();
    std::memcpy(x.data() + i, &bits, std::min<size_t>(8, x.size() - i));
  }
  return x;
}

// n draws of N(0, 40) rounded to bf16, as doubles (2^16 normals made once, picked by 16 bits).
std::vector<double> ropes(Rng& r, Index n) {
  static const std::vector<float> pool = fuzz::Rng(20240611).normals<float>(1 << 16);
  std::vector<double> x(z(n));
  std::uint64_t bits = 0;
  for (size_t i = 0; i < x.size(); ++i, bits >>= 16) {
    if (i % 4 == 0) bits = r.g();
    x[i] = static_cast<float>(bfloat16(40.0f * pool[bits & 0xFFFF]));
  }
  return x;
}

float uniform(Rng& r, float lo, float hi) {
  return std::uniform_real_distribution<float>(lo, hi)(r.g);
}

// Every view from the buffers: query / rope / scale in the base layout, the NZ caches, the
// block table, the output of the query's (or head-major) shape.
void set_views(Mq& c) {
  c.in.query = StridedView<const i8>(c.q.data(), qshape(c, kD));
  c.in.query_rope = StridedView<const bfloat16>(c.qr.data(), qshape(c, kR));
  c.in.dequant_scale_query = StridedView<const float>(c.dqq.data(), dshape(c));
  c.in.key = {StridedView<const i8>(c.k.data(), kshape(c.nb))};
  c.in.value = {StridedView<const i8>(c.same_kv ? c.k.data() : c.v.data(), kshape(c.nb))};
  c.in.key_rope = StridedView<const bfloat16>(c.kr.data(), rshape(c.nb));
  c.in.block_table = StridedView<const i32>(c.table.data(), {c.B, c.mb});
  c.in.key_antiquant_scale = StridedView<const float>(c.dqk.data(), {1});
  c.in.value_antiquant_scale = StridedView<const float>(c.dqv.data(), {1});
  c.out = StridedView<bfloat16>(c.o.data(), oshape(c, c.nmajor));
}

// What a rebuilt case must have (0: drawn as usual): N, non-TND Q_S, a TND batch of that many
// query rows.
struct Force {
  Index n = 0, qs = 0, tnd_len = 0;
};

void build_with(Mq& c, Rng& r, const Force& f) {
  static const char* layouts[] = {"BSH", "BSND", "TND"};
  static const Index heads[] = {1, 2, 4, 8};
  c.layout = f.tnd_len ? "TND" : layouts[r.range(0, f.qs ? 1 : 2)];
  const bool t = tnd(c);
  c.N = f.n ? f.n : r.chance(0.03) ? 16 : heads[r.range(0, 3)];
  c.B = r.range(1, 3);
  c.S = t ? 0 : f.qs ? f.qs : r.chance(0.5) ? 1 : r.chance(0.04) ? r.range(4, 16) : r.range(2, 3);
  c.threads = static_cast<int>(r.range(1, 2));
  c.same_kv = r.chance(0.6);
  for (Index b = 0; b < c.B; ++b) {
    c.q_len.push_back(!t ? c.S : r.chance(0.1) ? 0 : r.chance(0.03) ? 16 : r.range(1, 3));
    c.kv_len.push_back(r.chance(0.12)   ? 0
                       : r.chance(0.1)  ? r.range(1, 4)
                       : r.chance(0.04) ? r.range(513, 700)
                       : r.chance(0.85) ? r.range(5, 128)
                                        : r.range(129, 300));
  }
  if (f.tnd_len) c.q_len[z(r.range(0, c.B - 1))] = f.tnd_len;
  if (t) {
    i64 cu = 0;
    for (Index l : c.q_len) c.in.actual_seq_lengths.push_back(cu += l);
    c.T = cu;
  }
  // The batches (row-major) and the query tensors (their concatenation in every base layout).
  for (Index b = 0; b < c.B; ++b) {
    ref::cann::MlaQuantBatch bt;
    bt.q_len = static_cast<int>(c.q_len[z(b)]);
    bt.kv_len = static_cast<int>(c.kv_len[z(b)]);
    const Index qn = c.q_len[z(b)] * c.N, kn = c.kv_len[z(b)];
    bt.q8 = bytes(r, qn * kD);
    bt.qr = ropes(r, qn * kR);
    for (Index i = 0; i < qn; ++i) bt.dqq.push_back(uniform(r, 0.01f, 0.03f));
    bt.k8 = bytes(r, kn * kD);
    bt.v8 = c.same_kv ? bt.k8 : bytes(r, kn * kD);
    bt.kr = ropes(r, kn * kR);
    c.q.insert(c.q.end(), bt.q8.begin(), bt.q8.end());
    for (double x : bt.qr) c.qr.push_back(bfloat16(static_cast<float>(x)));
    for (double x : bt.dqq) c.dqq.push_back(static_cast<float>(x));
    c.ref.push_back(std::move(bt));
  }
  c.q.resize(std::max<size_t>(c.q.size(), 1)), c.qr.resize(std::max<size_t>(c.qr.size(), 1));
  c.dqq.resize(std::max<size_t>(c.dqq.size(), 1));
  // The pool: shuffled blocks, sometimes a spare one; key / value bytes 77 and key_rope NaN
  // where no key is.
  Index used = 0, most = 0;
  for (Index l : c.kv_len) used += (l + kBs - 1) / kBs, most = std::max(most, (l + kBs - 1) / kBs);
  c.mb = std::max<Index>(1, most + r.range(0, 1));
  c.nb = std::max<Index>(1, used + (r.chance(0.3) ? 1 : 0));
  std::vector<i32> ids(z(c.nb));
  for (Index i = 0; i < c.nb; ++i) ids[z(i)] = static_cast<i32>(i);
  std::shuffle(ids.begin(), ids.end(), r.g);
  c.table.assign(z(c.B * c.mb), -1);
  c.k.assign(z(c.nb * kBlockK), i8(77));
  if (!c.same_kv) c.v.assign(z(c.nb * kBlockK), i8(77));
  c.kr.assign(z(c.nb * kBlockR), bfloat16(kNaN));
  Index next = 0;
  for (Index b = 0; b < c.B; ++b) {
    const auto& bt = c.ref[z(b)];
    for (Index j = 0; j < c.kv_len[z(b)]; ++j) {
      if (j % kBs == 0) c.table[z(b * c.mb + j / kBs)] = ids[z(next++)];
      const Index blk = c.table[z(b * c.mb + j / kBs)], tok = j % kBs;
      for (Index d = 0; d < kD; d += 32) {  // a run of 32 channels at a time
        std::memcpy(&c.k[nz_at(blk, tok, d, 32, kD)], &bt.k8[z(j * kD + d)], 32);
        if (!c.same_kv) std::memcpy(&c.v[nz_at(blk, tok, d, 32, kD)], &bt.v8[z(j * kD + d)], 32);
      }
      for (Index e = 0; e < kR; ++e)
        c.kr[nz_at(blk, tok, e, 16, kR)] = bfloat16(static_cast<float>(bt.kr[z(j * kR + e)]));
    }
  }
  c.in.actual_seq_lengths_kv.assign(c.kv_len.begin(), c.kv_len.end());
  c.dqk = {uniform(r, 0.01f, 0.03f)};
  c.dqv = {uniform(r, 0.005f, 0.02f)};
  c.p.num_heads = c.N;
  c.p.num_key_value_heads = c.N == 1 && r.chance(0.2) ? 0 : 1;
  c.p.scale_value = uniform(r, 0.02f, 0.06f);
  c.p.block_size = kBs;
  c.p.query_quant_mode = 3;
  c.p.inner_precise = r.range(0, 1);
  c.p.sparse_mode = t ? (r.chance(0.5) ? 3 : 0) : (c.S > 1 ? 3 : 0);
  if (c.p.sparse_mode == 3) c.in.atten_mask = mask_of({2048, 2048});
  c.nmajor = r.chance(0.25);
  c.p.input_layout = !c.nmajor ? c.layout : t ? "TND_NTD" : c.layout + "_NBSD";
  c.o.assign(z(std::max<Index>(1, rows(c) * c.N * kD)), bfloat16(kOutSentinel));
  c.lse.assign(z(std::max<Index>(1, rows(c) * c.N)), kLseSentinel);
  if (r.chance(0.3)) c.lse_out = StridedView<float>(c.lse.data(), lse_shape(c));  // never written
  set_views(c);
  if (r.chance(0.3)) c.ex.kv_split = r.range(8, 600);
  if (r.chance(0.3)) c.ex.kv_tile = r.range(8, 600);  // (the full quantization uses 512)
  if (r.chance(0.2)) c.ex.q_tile = r.range(1, 4);
}

void build(Mq& c, Rng& r) { build_with(c, r, Force{}); }

void rebuild(Mq& c, Rng& r, const Force& f) {
  c = Mq{};
  build_with(c, r, f);
}

// ---- Checks ------------------------------------------------------------------------------------

// The case in a line, for a defect's message.
std::string summary(const Mq& c) {
  std::string s = c.p.input_layout + " N " + std::to_string(c.N) + " kv";
  for (Index l : c.kv_len) s += " " + std::to_string(l);
  s += " q";
  for (Index l : c.q_len) s += " " + std::to_string(l);
  return s + " dqK " + std::to_string(c.dqk[0]) + " dqV " + std::to_string(c.dqv[0]) + " scale " +
         std::to_string(c.p.scale_value) + " sparse " + std::to_string(c.p.sparse_mode);
}

// Every element against the reference: bf16 rounding (2^-8 relative), the row's near-tie slack
// (its magnitude: the reference's slack takes dqV's sign), 1e-4 of the row's largest |value|
// (rows without a visible key: exactly 0).
std::string against_reference(const Mq& c) {
  ref::cann::MlaQuant pr;
  pr.num_heads = static_cast<int>(c.N);
  pr.scale = c.p.scale_value;
  pr.dqk = c.dqk[0];
  pr.dqv = c.dqv[0];
  pr.causal = c.p.sparse_mode == 3;
  const auto want = ref::cann::mla_full_quant(pr, c.ref);
  const Index R = rows(c), N = c.N;
  if (static_cast<Index>(want.slack.size()) != R * N) return "reference size mismatch";
  for (Index row = 0; row < R; ++row)
    for (Index h = 0; h < N; ++h) {
      const size_t w0 = z((row * N + h) * kD);
      const Index at = c.nmajor ? (h * R + row) * kD : (row * N + h) * kD;
      double big = 0.0;
      for (Index d = 0; d < kD; ++d) big = std::max(big, std::fabs(want.out[w0 + z(d)]));
      for (Index d = 0; d < kD; ++d) {
        const double w = want.out[w0 + z(d)], g = static_cast<float>(c.o[z(at + d)]);
        const double tol =
            0x1p-8 * std::fabs(w) + std::fabs(want.slack[z(row * N + h)]) + 1e-4 * big;
        if (!(std::fabs(g - w) <= tol))
          return "row " + std::to_string(row) + " head " + std::to_string(h) + " element " +
                 std::to_string(d) + ": got " + std::to_string(g) + ", want " + std::to_string(w) +
                 " (" + summary(c) + ")";
      }
    }
  return "";
}

void invoke(Mq& c, bool run, int threads) {
  attnref::ExecConfig ex = c.ex;
  ex.threads = threads;
  if (c.half_out) {  // (the instantiation of entries_fia.cpp's int8 probe)
    const attnref::FusedInferAttentionScoreOutputs<half> o{
        StridedView<half>(c.ho.data(), c.out.shape()), c.lse_out};
    run ? attnref::fused_infer_attention_score(c.p, c.in, o, ex)
        : attnref::validate(c.p, c.in, o, ex);
    return;
  }
  const attnref::FusedInferAttentionScoreOutputs<bfloat16> o{c.out, c.lse_out};
  run ? attnref::fused_infer_attention_score(c.p, c.in, o, ex)
      : attnref::validate(c.p, c.in, o, ex);
}

std::string verify(const Mq& c) {
  std::string e = against_reference(c);
  if (!e.empty()) return e;
  for (float x : c.lse)
    if (!(x == kLseSentinel)) return "softmax_lse written with softmax_lse_flag off";
  // The other thread count; a value that is the key's tensor read from a copy of it instead.
  Mq twin;
  twin.p = c.p, twin.in = c.in, twin.ex = c.ex, twin.lse_out = c.lse_out;
  std::vector<i8> copy;
  if (c.same_kv && c.in.value[0].data() == c.k.data()) {
    copy = c.k;
    twin.in.value = {support::with_data<const i8>(c.in.value[0], copy.data())};
  }
  twin.o.assign(c.o.size(), bfloat16(kOutSentinel));
  twin.out = StridedView<bfloat16>(twin.o.data(), c.out.shape());
  try {
    invoke(twin, true, 3 - c.threads);
  } catch (const std::exception& x) {
    return std::string("the rerun rejected the call: ") + x.what();
  }
  if (!fuzz::same_bits(c.o, twin.o))
    return copy.empty() ? "another thread count changed the bits"
                        : "another thread count / a copy of the key as value changed the bits";
  return "";
}

// ---- Perturbations -----------------------------------------------------------------------------

using Ok = bool (*)(const Mq&);
using Change = void (*)(Mq&, Rng&);

// Dimension d of v, a view of buf, set to e; buf grows to match (in bounds if wrongly accepted).
template <class U, class V>
void bump(std::vector<U>& buf, StridedView<V>& v, int d, Index e, U fill) {
  v = support::resized(v, d, e);
  buf.resize(std::max(buf.size(), z(std::max<Index>(1, v.numel()))), fill);
  v = support::with_data(v, buf.data());
}

// The value as a tensor of its own (a copy of the key's when shared).
void own_value(Mq& c) {
  if (c.same_kv) c.v = c.k, c.same_kv = false;
  c.in.value = {StridedView<const i8>(c.v.data(), kshape(c.nb))};
}

// At least n floats (0.5) in c.spare (one call per edit: the next one moves the buffer).
const float* spare(Mq& c, Index n) {
  c.spare.assign(z(std::max<Index>(n, 1)), 0.5f);
  return c.spare.data();
}

template <class X>
X pick(Rng& r, const std::vector<X>& list) {
  return list[z(r.range(0, static_cast<Index>(list.size()) - 1))];
}

bool has_keys(const Mq& c) { return *std::max_element(c.kv_len.begin(), c.kv_len.end()) > 0; }

const std::vector<fuzz::Perturbation<Mq>>& perturbations() {
  using CF = StridedView<const float>;
  // must: attnref must reject; fine: defined (applicable when ok holds, null: always).
  const auto must = [](auto n, Ok o, Change f) { return fuzz::edit<Mq>(n, true, o, f); };
  const auto fine = [](auto n, Ok o, Change f) { return fuzz::edit<Mq>(n, false, o, f); };
  const Ok is_tnd = [](const Mq& c) { return tnd(c); };
  const Ok not_tnd = [](const Mq& c) { return !tnd(c); };
  static const std::vector<fuzz::Perturbation<Mq>> list{
      // fia_mla_quant_rules.
      must("query_quant_mode not 3", nullptr,
           [](Mq& c, Rng& r) {
             c.p.query_quant_mode = pick<i64>(r, {0, 2, 1, 4, -1});
           }),
      must("dequant_scale_query missing", nullptr,
           [](Mq& c, Rng&) { c.in.dequant_scale_query = {}; }),
      must("dequant_scale_query of another shape", nullptr,
           [](Mq& c, Rng& r) {
             const Index B = c.B, S = c.S, T = c.T, N = c.N;
             Shape s =
                 tnd(c)
                     ? pick<Shape>(
                           r, {{T, N, 1}, {T + 1, N}, {T, N + 1}, {T * N}, {1, T, N}, {c.B, 1, N}})
                     : pick<Shape>(r, {{B, S, N, 1},
                                       {B * S, N},
                                       {B, S + 1, N},
                                       {B, S, N + 1},
                                       {B + 1, S, N},
                                       {B, N, S}});
             if (s == dshape(c)) s = {B, S, N + 1};  // ([B, N, S] with S == N)
             c.dqq.resize(std::max(c.dqq.size(), z(numel(s))), 0.02f);
             c.in.dequant_scale_query = CF(c.dqq.data(), s);
           }),
      must("key / value antiquant scale not of shape (1), or missing", nullptr,
           [](Mq& c, Rng& r) {
             auto& s = r.chance(0.5) ? c.in.key_antiquant_scale : c.in.value_antiquant_scale;
             const Index w = r.range(0, 3);
             if (w == 0) s = {};
             if (w == 1) s = CF(spare(c, 2), {2});
             if (w == 2) s = CF(spare(c, 1), {1, 1});
             if (w == 3) s = CF(spare(c, 512), {512});
           }),
      must("key / value antiquant offset given", nullptr,
           [](Mq& c, Rng& r) {
             const float* s = spare(c, 2);
             const Index w = r.range(0, 2);
             if (w != 1) c.in.key_antiquant_offset = CF(s, {1});
             if (w != 0) c.in.value_antiquant_offset = CF(s + 1, {1});
           }),
      must("key / value antiquant mode not 0", nullptr,
           [](Mq& c, Rng& r) {
             const i64 m = pick<i64>(r, {1, 2, 3, 4, 5, -1});
             const Index w = r.range(0, 2);
             if (w != 1) c.p.key_antiquant_mode = m;
             if (w != 0) c.p.value_antiquant_mode = m;
           }),
      must("combined antiquant fields / per-token scales", nullptr,
           [](Mq& c, Rng& r) {
             c.junk.assign(2 * kD, i8(1));
             const StridedView<const i8> a(c.junk.data(), {2, kD});
             const Index w = r.range(0, 2);
             if (w == 0) c.in.antiquant_scale = a;
             if (w == 1) c.in.antiquant_offset = a;
             if (w == 2)
               c.p.antiquant_mode = 1,
               c.in.antiquant_scale_per_token = CF(spare(c, 2 * c.B * 640), {2, c.B, 640});
           }),
      must("pse_shift (half)", nullptr,
           [](Mq& c, Rng&) {
             const Index q = std::max<Index>(1, tnd(c) ? c.T : c.S), cols = c.mb * kBs;
             c.junk_h.assign(z(c.N * q * cols), half(0.01f));
             c.in.pse_shift = StridedView<const half>(c.junk_h.data(), {1, c.N, q, cols});
           }),
      must("a shared prefix", nullptr,
           [](Mq& c, Rng& r) {
             c.junk.assign(2 * kD, i8(1));
             const StridedView<const i8> pre(c.junk.data(), {1, 1, kD});
             const Index w = r.range(0, 2);
             if (w != 1) c.in.key_shared_prefix = pre;
             if (w != 0) c.in.value_shared_prefix = pre;
             if (r.chance(0.3)) c.in.actual_shared_prefix_len = {1};
           }),
      must("BNSD, BNSD_NBSD or BNSD_BSND layout", not_tnd,
           [](Mq& c, Rng& r) {
             const std::string l = pick<std::string>(r, {"BNSD", "BNSD_NBSD", "BNSD_BSND"});
             c.p.input_layout = l;
             c.in.query = StridedView<const i8>(c.q.data(), {c.B, c.N, c.S, kD});
             c.in.query_rope = StridedView<const bfloat16>(c.qr.data(), {c.B, c.N, c.S, kR});
             c.out = StridedView<bfloat16>(c.o.data(), l == "BNSD_NBSD" ? Shape{c.N, c.B, c.S, kD}
                                                       : l == "BNSD"    ? Shape{c.B, c.N, c.S, kD}
                                                                        : Shape{c.B, c.S, c.N, kD});
           }),
      must("NTD_TND layout", is_tnd,
           [](Mq& c, Rng&) {
             c.p.input_layout = "NTD_TND";
             c.in.query = StridedView<const i8>(c.q.data(), {c.N, c.T, kD});
             c.in.query_rope = StridedView<const bfloat16>(c.qr.data(), {c.N, c.T, kR});
             c.out = StridedView<bfloat16>(c.o.data(), {c.T, c.N, kD});
           }),
      must("key / value tensor lists", nullptr,
           [](Mq& c, Rng& r) {
             if (r.chance(0.7)) c.in.key.push_back(c.in.key[0]);
             if (r.chance(0.7) || c.in.key.size() == 1) c.in.value.push_back(c.in.value[0]);
           }),
      must("params.block_size not 128", nullptr,
           [](Mq& c, Rng& r) {
             c.p.block_size = pick<i64>(r, {16, 0, 64, 256, -128});
           }),
      must("NZ caches of 16-token blocks with block_size 16", nullptr,
           [](Mq& c, Rng&) {
             c.p.block_size = 16;
             const Shape s{c.nb * 8, 1, kD / 32, 16, 32};
             c.in.key = {StridedView<const i8>(c.k.data(), s)};
             c.in.value = {support::with_data<const i8>(c.in.key[0], c.in.value[0].data())};
             c.in.key_rope = StridedView<const bfloat16>(c.kr.data(), {c.nb * 8, 1, 4, 16, 16});
           }),
      must("key or value cache not NZ [blockNum, 1, 16, 128, 32]", nullptr,
           [](Mq& c, Rng& r) {
             const Index nb = c.nb;
             const Shape s = pick<Shape>(r, {{nb, kBs, kD},
                                             {nb, 1, kBs, kD},
                                             {nb, 1, 32, kBs, 16},
                                             {nb, 2, 8, kBs, 32},
                                             {nb, 1, 16, 32, 128},
                                             {nb * kBs, kD},
                                             {nb, 1, 16, kBs, 32, 1}});
             const Index w = r.range(0, 2);
             if (w != 1) c.in.key[0] = support::reshaped(c.in.key[0], s);
             if (w != 0) c.in.value[0] = support::reshaped(c.in.value[0], s);
           }),
      must("key_rope not NZ [blockNum, 1, 4, 128, 16] of the key's blocks", nullptr,
           [](Mq& c, Rng& r) {
             const Index nb = c.nb;
             const Shape s = pick<Shape>(r, {{nb, 1, 8, kBs, 8},
                                             {nb, kBs, kR},
                                             {nb, 1, kBs, kR},
                                             {nb, 1, 4, 64, 16},
                                             {nb - 1, 1, 4, kBs, 16},
                                             {nb + 1, 1, 4, kBs, 16},
                                             {nb, 2, 2, kBs, 16}});
             c.kr.resize(std::max(c.kr.size(), z(numel(s))), bfloat16(kNaN));
             c.in.key_rope = StridedView<const bfloat16>(c.kr.data(), s);
           }),
      must("value cache of other blocks than the key's", nullptr,
           [](Mq& c, Rng& r) {
             own_value(c);
             bump(c.v, c.in.value[0], 0, r.chance(0.5) ? c.nb - 1 : c.nb + r.range(1, 2), i8(77));
           }),
      must("softmax_lse_flag", nullptr,
           [](Mq& c, Rng& r) {
             c.p.softmax_lse_flag = true;
             c.lse_out = r.chance(0.8) ? StridedView<float>(c.lse.data(), lse_shape(c))
                                       : StridedView<float>{};
           }),
      // The MLA plan's rules.
      must("Q_S, or a TND batch's query rows, 17 or more", nullptr,
           [](Mq& c, Rng& r) {
             const Index n = r.range(1, 2), q = r.range(17, 18);
             rebuild(c, r, r.chance(0.5) ? Force{n, q, 0} : Force{n, 0, q});
           }),
      must("num_heads not a power of two (the query of that N)", nullptr,
           [](Mq& c, Rng& r) {
             rebuild(c, r, Force{pick<Index>(r, {3, 5, 6, 12}), 0, 0});
           }),
      must("params.num_heads 0, negative, past 128 or another power of two", nullptr,
           [](Mq& c, Rng& r) {
             c.p.num_heads = pick<i64>(r, {0, -1, -2, 256, kHuge, 2 * c.N});
           }),
      must("num_key_value_heads not 1", nullptr,
           [](Mq& c, Rng& r) {
             c.p.num_key_value_heads = pick<i64>(r, {2, 3, -1, 4, c.N > 1 ? 0 : 2});
           }),
      must(
          "sparse_mode 3 with Q_S 1", [](const Mq& c) { return !tnd(c) && c.S == 1; },
          [](Mq& c, Rng& r) {
            c.p.sparse_mode = 3;
            if (r.chance(0.8)) c.in.atten_mask = mask_of({2048, 2048});
          }),
      must(
          "sparse_mode 0 with Q_S > 1", [](const Mq& c) { return !tnd(c) && c.S > 1; },
          [](Mq& c, Rng& r) {
            c.p.sparse_mode = 0;
            if (r.chance(0.7)) c.in.atten_mask = {};
          }),
      must("sparse_mode 1, 2, 4 or out of range", nullptr,
           [](Mq& c, Rng& r) {
             c.p.sparse_mode = pick<i64>(r, {1, 2, 4, -1, 5});
           }),
      must(
          "atten_mask with sparse_mode 0", [](const Mq& c) { return c.p.sparse_mode == 0; },
          [](Mq& c, Rng& r) {
            c.in.atten_mask = mask_of(r.chance(0.7) ? Shape{2048, 2048} : Shape{c.B, 1, 1, 128});
          }),
      must(
          "atten_mask missing or of another shape with sparse_mode 3",
          [](const Mq& c) { return c.p.sparse_mode == 3; },
          [](Mq& c, Rng& r) {
            const Index w = r.range(0, 5);
            static const Shape bad[] = {
                {2048, 2047}, {2047, 2048}, {2, 2048, 2048}, {1, 2048, 2048}, {1, 1, 2048, 2048}};
            c.in.atten_mask = w == 0 ? StridedView<const std::uint8_t>{} : mask_of(bad[w - 1]);
          }),
      must("inner_precise 2, 3 or out of range", nullptr,
           [](Mq& c, Rng& r) {
             c.p.inner_precise = pick<i64>(r, {2, 3, -1, 4});
           }),
      must("kv padding, sink, deq / quant scales", nullptr,
           [](Mq& c, Rng& r) {
             static const float one[1] = {1.0f};
             static const i64 pad[1] = {0};
             static const bfloat16 sink[16] = {};
             const CF f(one, {1});
             const Index w = r.range(0, 5);
             if (w == 0) c.in.kv_padding_size = StridedView<const i64>(pad, {1});
             if (w == 1) c.in.learnable_sink = StridedView<const bfloat16>(sink, {c.N});
             if (w == 2) c.in.deq_scale1 = f;
             if (w == 3) c.in.quant_scale1 = f;
             if (w == 4) c.in.quant_scale2 = f;
             if (w == 5) c.in.quant_offset2 = f;
           }),
      must("query_rope or key_rope missing", nullptr,
           [](Mq& c, Rng& r) { (r.chance(0.5) ? c.in.query_rope : c.in.key_rope) = {}; }),
      must("query_rope of head size 32 or another batch / length / heads", nullptr,
           [](Mq& c, Rng& r) {
             auto& x = c.in.query_rope;
             const bool last = r.chance(0.4);
             const int d = last ? x.rank() - 1 : static_cast<int>(r.range(0, x.rank() - 2));
             const Index e = last ? (c.layout == "BSH" ? c.N * 32 : 32) : x.size(d) + 1;
             bump(c.qr, x, d, e, bfloat16(0.5f));
           }),
      must(
          "a head-major layout with an output of the base layout's shape",
          [](const Mq& c) { return oshape(c, true) != oshape(c, false); },
          [](Mq& c, Rng&) {
            c.nmajor = true;
            c.p.input_layout = tnd(c) ? "TND_NTD" : c.layout + "_NBSD";
            c.out = StridedView<bfloat16>(c.o.data(), oshape(c, false));
          }),
      must("attention_out of another shape", nullptr,
           [](Mq& c, Rng& r) {
             const int d = static_cast<int>(r.range(0, c.out.rank() - 1));
             bump(c.o, c.out, d, c.out.size(d) + 1, bfloat16(kOutSentinel));
           }),
      must(
          "attention_out overlapping the key cache",
          [](const Mq& c) { return c.out.numel() > 0 && c.out.numel() * 2 <= c.nb * kBlockK; },
          [](Mq& c, Rng&) {
            c.out = StridedView<bfloat16>(reinterpret_cast<bfloat16*>(c.k.data()), c.out.shape());
          }),
      must("a half attention_out", nullptr,
           [](Mq& c, Rng&) {
             c.half_out = true;
             c.ho.assign(c.o.size(), half(kOutSentinel));
           }),
      // Block table and lengths.
      must("block_table missing or of another shape", nullptr,
           [](Mq& c, Rng& r) {
             const Index w = r.range(0, 2);
             if (w == 0) c.in.block_table = {};
             if (w == 1) bump(c.table, c.in.block_table, 0, c.B + 1, i32(0));
             if (w == 2) c.in.block_table = StridedView<const i32>(c.table.data(), {c.B * c.mb});
           }),
      must("a block_table entry a sequence uses out of [0, blockNum)", has_keys,
           [](Mq& c, Rng& r) {
             Index b = r.range(0, c.B - 1);
             while (c.kv_len[z(b)] == 0) b = (b + 1) % c.B;
             const i32 bad =
                 pick<i32>(r, {-1, static_cast<i32>(c.nb), static_cast<i32>(c.nb + 7),
                               std::numeric_limits<i32>::max(), std::numeric_limits<i32>::min()});
             c.table[z(b * c.mb + r.range(0, (c.kv_len[z(b)] - 1) / kBs))] = bad;
             c.want_out_of_range = true;
           }),
      must("actual_seq_lengths_kv past the block table, negative or huge", nullptr,
           [](Mq& c, Rng& r) {
             auto& kv = c.in.actual_seq_lengths_kv;
             kv[z(r.range(0, c.B - 1))] =
                 pick<i64>(r, {c.mb * kBs + r.range(1, 3), -1, -r.range(2, 700), kHuge,
                               std::numeric_limits<i64>::max()});
           }),
      must("actual_seq_lengths_kv empty, or of 2 values for 3 batches", nullptr,
           [](Mq& c, Rng& r) {  // (one value broadcasts)
             c.in.actual_seq_lengths_kv.resize(c.B == 3 && r.chance(0.5) ? 2 : 0);
           }),
      must("actual_seq_lengths missing, decreasing or not ending at T (TND)", is_tnd,
           [](Mq& c, Rng& r) {
             auto& a = c.in.actual_seq_lengths;
             const Index w = r.range(0, 3);
             if (w == 0) a.clear();
             if (w == 1) a.back() += r.range(1, 2);
             if (w >= 2) a[0] = w == 2 ? a.back() + 1 : -1;
           }),
      // Extents and data.
      must("an input view of a huge extent or size overflow", nullptr,
           [](Mq& c, Rng& r) {
             const Index w = r.range(0, 4);
             if (w == 0) c.in.query = support::resized(c.in.query, 0, kHuge);
             if (w == 1) c.in.key[0] = support::resized(c.in.key[0], 0, kHuge);
             if (w == 2)
               c.in.value[0] =
                   support::resized(support::resized(c.in.value[0], 0, kHuge), 3, kHuge);
             if (w == 3)
               c.in.dequant_scale_query = support::resized(c.in.dequant_scale_query, 0, kHuge);
             if (w == 4) c.in.block_table = support::resized(c.in.block_table, 0, kHuge);
           }),
      must("an input view with a negative extent", nullptr,
           [](Mq& c, Rng& r) {
             const Index w = r.range(0, 4);
             const auto neg = [&r](auto& v) {
               v = support::resized(v, static_cast<int>(r.range(0, v.rank() - 1)), -1);
             };
             if (w == 0) neg(c.in.query);
             if (w == 1) neg(c.in.key[0]);
             if (w == 2) neg(c.in.key_rope);
             if (w == 3) neg(c.in.dequant_scale_query);
             if (w == 4) neg(c.in.key_antiquant_scale);
           }),
      must("an input with null data and elements", nullptr,
           [](Mq& c, Rng& r) {
             for (int tries = 0; tries < 16; ++tries) {
               const Index w = r.range(0, 8);
               const auto null = [](auto& v) {
                 if (v.numel() == 0) return false;
                 v = support::with_data(v, nullptr);
                 return true;
               };
               if ((w == 0 && null(c.in.query)) || (w == 1 && null(c.in.query_rope)) ||
                   (w == 2 && null(c.in.key[0])) || (w == 3 && null(c.in.value[0])) ||
                   (w == 4 && null(c.in.key_rope)) || (w == 5 && null(c.in.dequant_scale_query)) ||
                   (w == 6 && null(c.in.key_antiquant_scale)) ||
                   (w == 7 && null(c.in.value_antiquant_scale)) ||
                   (w == 8 && null(c.in.block_table)))
                 return;
             }
             c.in.key[0] = support::with_data(c.in.key[0], nullptr);  // (never empty)
           }),
      // Unusual but defined.
      fine("garbage in block_table past each sequence's blocks", nullptr,
           [](Mq& c, Rng& r) {
             for (Index b = 0; b < c.B; ++b)
               for (Index j = (c.kv_len[z(b)] + kBs - 1) / kBs; j < c.mb; ++j)
                 c.table[z(b * c.mb + j)] = r.chance(0.3) ? std::numeric_limits<i32>::max()
                                                          : static_cast<i32>(r.range(-999, 999));
           }),
      fine("actual_seq_lengths_kv longer than the batch (the rest ignored)", nullptr,
           [](Mq& c, Rng& r) {
             for (Index i = r.range(1, 2); i > 0; --i)
               c.in.actual_seq_lengths_kv.push_back(r.range(-5, 5000));
           }),
      fine("key_rope_antiquant_scale given (reserved, ignored)", nullptr,
           [](Mq& c, Rng& r) {
             c.junk_bf.assign(z(kR), bfloat16(1e4f));
             c.in.key_rope_antiquant_scale =
                 StridedView<const bfloat16>(c.junk_bf.data(), {r.chance(0.5) ? kR : 1});
           }),
      fine(
          "the 2048 x 2048 mask of ones (content not read)",
          [](const Mq& c) { return c.p.sparse_mode == 3; },
          [](Mq& c, Rng&) {
            c.in.atten_mask = mask_of({2048, 2048}, true);
          }),
      fine("scales zero or negative (dqQ, dqK, dqV, scale_value)", nullptr,
           [](Mq& c, Rng& r) {
             const Index w = r.range(0, 3);
             if (w == 0)
               for (size_t i = 0; i < c.ref.size(); ++i)
                 for (double& x : c.ref[i].dqq) x = -x;
             if (w == 0)
               for (float& x : c.dqq) x = -x;
             if (w == 1) c.dqk[0] = r.chance(0.5) ? 0.0f : -c.dqk[0];
             if (w == 2) c.dqv[0] = r.chance(0.5) ? 0.0f : -c.dqv[0];
             if (w == 3) c.p.scale_value = r.chance(0.5) ? 0.0 : -c.p.scale_value;
           }),
  };
  return list;
}

// ---- Registration ------------------------------------------------------------------------------

void validate_only(Mq& c) { invoke(c, false, 0); }

void restride_inputs(Mq& c, support::Restrider& r) {
  c.in.for_each_view([&](const std::string& name, auto& view) {
    if (name != "atten_mask") r(name, view);  // 4 M elements, content not read
  });
}

void run(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, perturbations(), build,
      fuzz::Named{"fused_infer_attention_score_mla_quant", "fused_infer_attention_score"},
      [](Mq& c) {
        fuzz::call_expecting_range(c.want_out_of_range, [&] { invoke(c, true, c.threads); });
      },
      verify, &Mq::q, &Mq::qr, &Mq::dqq, &Mq::k, &Mq::v, &Mq::kr, &Mq::table, &Mq::dqk, &Mq::dqv,
      &Mq::o, &Mq::ho, &Mq::lse, &Mq::junk, &Mq::junk_bf, &Mq::junk_h, &Mq::spare);
}

// (a case costs about eight of the rope entry's: each call copies the NZ caches into bf16
// stand-ins, and P is quantized row by row; a quarter of the cases)
const fuzz::Register reg("fused_infer_attention_score_mla_quant", run, 4);

}  // namespace fuzz_fia_mla_quant
