// Fuzz entries of ATB SelfAttention's other modes, fp32, against ref::atb_self_attention (and
// the naive reference): "self_attention_decoder" (calcType DECODER over the [layerNum, batch,
// maxSeqLen, kvHead * headSize] caches: token_offset, layer_id, kv-bypass, batchRunStatus, NORM
// masks, logN, the sliding window and the rolling SWA cache; the new token's cache row checked
// bit for bit), "self_attention_prefix" (PREFIX_ENCODER over shuffled paged caches, causal
// bottom-right) and "self_attention_bnsd" (inputLayout BNSD: PA_ENCODER, or ENCODER / DECODER /
// UNDEFINED reading BNSD caches with kv-bypass). Every rejection must name self_attention.

#include <attnref/attnref.hpp>
#include <limits>

#include "fuzz/fuzz.hpp"
#include "reference/atb_self_attention.hpp"
#include "reference/naive_attention.hpp"
#include "support/cast.hpp"

namespace fuzz_sa_modes {

using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;
using P = attnref::SelfAttentionParams;
using R = fuzz::Rng;
using i32 = std::int32_t;
using V3 = StridedView<const float, 3>;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 555.0f;

using support::z;
std::vector<double> span(const std::vector<float>& x, Index at, Index n) {
  return std::vector<double>(x.begin() + at, x.begin() + at + n);
}
float binary(R& r) { return r.chance(0.3) ? 1.0f : 0.0f; }

// The reference problem of a batch of sequences (fp32 scores; a mask term is -3e38 x 0 / 1).
ref::AtbSelfAttention problem(const P& p, Index nh, Index nkv, Index d, Index dv) {
  ref::AtbSelfAttention r;
  r.num_heads = static_cast<int>(nh), r.num_kv_heads = static_cast<int>(nkv);
  r.head_size = static_cast<int>(d), r.v_head_size = static_cast<int>(dv);
  r.q_scale = p.q_scale, r.qk_scale = p.qk_scale;
  r.to_dtype = [](double x) { return static_cast<double>(static_cast<float>(x)); };
  return r;
}

// ---- DECODER -----------------------------------------------------------------------------

struct Dec {
  Index B = 1, nh = 1, nkv = 1, d = 1, dv = 1, L = 1, M = 1, mb = 1, mw = 1;
  bool bypass = false, rolling = false;
  std::vector<float> q, k, v, kc, vc, o, mask, ln;
  P p;
  attnref::SelfAttentionInputs<float> in;
  attnref::SelfAttentionOutputs<float> out;
  bool active(Index b) const {
    return !p.batch_run_status_enable || in.batch_run_status[z(b)] == 1;
  }
  Index kv(Index b) const {  // keys sequence b attends: cache rows [0, kv)
    const Index off = in.token_offset[z(b)];
    return !active(b) ? 0 : rolling ? std::min(p.window_size, off) : off;
  }
  Index at(Index b, Index row, Index width) const {  // cache row of layer_id
    return ((in.layer_id * B + b) * M + row) * nkv * width;
  }
};

void build(Dec& c, R& r) {
  c.B = r.range(1, 3), c.nkv = r.range(1, 2), c.nh = c.nkv * r.range(1, 3);
  c.d = r.range(1, 24), c.dv = r.range(1, 24), c.L = r.range(1, 2), c.M = r.range(1, 12);
  P& p = c.p;
  p.num_heads = static_cast<int>(c.nh), p.num_kv_heads = static_cast<int>(c.nkv);
  p.calc_type = P::CalcType::Decoder;
  p.qk_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  if (r.chance(0.3)) p.q_scale = static_cast<float>(r.range(50, 150)) / 100.0f;
  c.bypass = r.chance(0.3);
  if (c.bypass) p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass;
  if (r.chance(0.25)) {  // SWA: the generated window (no mask), maybe the rolling cache
    p.mask_type = P::MaskType::SlidingWindowNorm;
    p.window_size = r.range(1, c.M);
    c.rolling = r.chance(0.5);
    if (c.rolling) p.cache_type = P::CacheType::Swa;
  } else {
    if (r.chance(0.5)) p.kernel_type = P::KernelType::HighPrecision;
    if (r.chance(0.3)) p.mask_type = P::MaskType::Norm;
    if (r.chance(0.3)) p.scale_type = P::ScaleType::LogN;
    p.batch_run_status_enable = r.chance(0.3);
  }
  auto& in = c.in;
  in.seq_len.assign(z(c.B), 1);
  in.layer_id = r.range(0, c.L - 1);
  for (Index b = 0; b < c.B; ++b) {
    in.token_offset.push_back(r.range(1, c.rolling ? 3 * c.M : c.M));
    in.batch_run_status.push_back(p.batch_run_status_enable ? r.chance(0.7) : 1);
    // A dynamic batch's inactive sequence: kv length 0, below its seq_len of 1 (accepted).
    if (in.batch_run_status.back() == 0 && r.chance(0.5)) in.token_offset.back() = 0;
  }
  c.q = r.normals<float>(c.B * c.nh * c.d);
  c.k = r.normals<float>(c.B * c.nkv * c.d);
  c.v = r.normals<float>(c.B * c.nkv * c.dv);
  c.kc.assign(z(c.L * c.B * c.M * c.nkv * c.d), kNaN);  // NaN but in the rows read
  c.vc.assign(z(c.L * c.B * c.M * c.nkv * c.dv), kNaN);
  for (Index b = 0; b < c.B; ++b)
    for (Index row = 0; row < c.kv(b); ++row) {
      for (Index e = 0; e < c.nkv * c.d; ++e) c.kc[z(c.at(b, row, c.d) + e)] = r.normal();
      for (Index e = 0; e < c.nkv * c.dv; ++e) c.vc[z(c.at(b, row, c.dv) + e)] = r.normal();
    }
  in.query = V3(c.q.data(), {c.B, c.nh, c.d});
  if (!c.bypass) {
    in.key = V3(c.k.data(), {c.B, c.nkv, c.d});
    in.value = V3(c.v.data(), {c.B, c.nkv, c.dv});
  }
  if (p.mask_type == P::MaskType::Norm) {  // [1 or batch, 1, >= maxSeqLen], binary
    c.mb = r.chance(0.5) ? 1 : c.B, c.mw = c.M + r.range(0, 1);
    c.mask.resize(z(c.mb * c.mw));
    for (float& m : c.mask) m = binary(r);
    in.mask = V3(c.mask.data(), {c.mb, 1, c.mw});
  }
  if (p.scale_type == P::ScaleType::LogN) {
    c.ln.resize(z(c.B + r.range(0, 1)));  // [>= batch]
    for (float& x : c.ln) x = 0.5f + 0.1f * r.normal();
    in.log_n = StridedView<const float, 1>(c.ln.data(), {static_cast<Index>(c.ln.size())});
  }
  c.o.assign(z(c.B * c.nh * c.dv), kSentinel);
  c.out.out = StridedView<float, 3>(c.o.data(), {c.B, c.nh, c.dv});
  c.out.key_cache = StridedView<float, 4>(c.kc.data(), {c.L, c.B, c.M, c.nkv * c.d});
  c.out.value_cache = StridedView<float, 4>(c.vc.data(), {c.L, c.B, c.M, c.nkv * c.dv});
}

// The caches: as before but the new token's row of each active sequence (none with kv-bypass);
// the output: the reference over the cache rows [0, kv) (zero rows for inactive sequences).
std::string verify_dec(const Dec& c, std::vector<float> kc, std::vector<float> vc) {
  const Index wk = c.nkv * c.d, wv = c.nkv * c.dv;
  for (Index b = 0; b < c.B && !c.bypass; ++b) {
    const Index off = c.in.token_offset[z(b)];
    if (!c.active(b)) continue;
    const Index row = c.rolling ? (off - 1) % c.p.window_size : off - 1;
    std::copy_n(c.k.begin() + b * wk, wk, kc.begin() + c.at(b, row, c.d));
    std::copy_n(c.v.begin() + b * wv, wv, vc.begin() + c.at(b, row, c.dv));
  }
  if (!fuzz::same_bits(c.kc, kc) || !fuzz::same_bits(c.vc, vc)) return "cache contents differ";
  ref::AtbSelfAttention r = problem(c.p, c.nh, c.nkv, c.d, c.dv);
  std::vector<std::vector<double>> q, k, v;
  for (Index b = 0; b < c.B; ++b) {
    r.seq_len.push_back(1);
    r.kv_len.push_back(static_cast<int>(c.kv(b)));
    q.push_back(span(c.q, b * c.nh * c.d, c.nh * c.d));
    k.push_back(span(kc, c.at(b, 0, c.d), c.kv(b) * wk));
    v.push_back(span(vc, c.at(b, 0, c.dv), c.kv(b) * wv));
  }
  if (c.p.scale_type == P::ScaleType::LogN) r.log_n = c.ln, r.log_n_per_batch = true;
  if (c.p.mask_type == P::MaskType::Norm)
    r.mask = [&c](int b, int, int j) { return -3e38 * c.mask[z((c.mb == 1 ? 0 : b) * c.mw + j)]; };
  if (c.p.window_size > 0 && !c.rolling)  // the window: the last w keys
    r.mask = [&r, &c](int b, int, int j) {
      return j < r.kv_len[z(b)] - c.p.window_size ? -3e38 : 0.0;
    };
  std::vector<double> want;
  for (const auto& x : ref::atb_self_attention(r, q, k, v))
    want.insert(want.end(), x.begin(), x.end());
  return fuzz::compare(std::vector<double>(c.o.begin(), c.o.end()), want, 2e-4);
}

using PD = fuzz::Perturbation<Dec>;
using DecOk = bool (*)(const Dec&);
using DecEdit = void (*)(Dec&, R&);
PD must(const char* n, DecEdit e) { return fuzz::edit<Dec>(n, true, nullptr, e); }
PD must(const char* n, DecOk ok, DecEdit e) { return fuzz::edit<Dec>(n, true, ok, e); }

bool writes(const Dec& c) { return !c.bypass; }
bool brs(const Dec& c) { return c.p.batch_run_status_enable; }
bool norm(const Dec& c) { return c.p.mask_type == P::MaskType::Norm; }

const std::vector<PD>& dec_perturbations() {
  static const std::vector<PD> list{
      // The token_offset range is checked on active sequences only (an inactive one reads and
      // writes no cache row).
      must(
          "token_offset past maxSeqLen", [](const Dec& c) { return !c.rolling && c.active(0); },
          [](Dec& c, R&) { c.in.token_offset[0] = c.M + 1; }),
      must("token_offset below seq_len or missing",
           [](Dec& c, R& r) {
             if (c.active(0) && r.chance(0.5))
               c.in.token_offset[0] = 0;
             else
               c.in.token_offset.pop_back();
           }),
      must("layer_id out of range", [](Dec& c, R& r) { c.in.layer_id = r.chance(0.5) ? -1 : c.L; }),
      must(
          "an additive -10000 in a binary mask",
          [](const Dec& c) { return norm(c) && c.kv(0) > 0; },
          [](Dec& c, R&) { c.mask[0] = -10000.0f; }),
      must("seq_len not 1", [](Dec& c, R& r) { c.in.seq_len[z(r.range(0, c.B - 1))] = 2; }),
      must("batch_run_status not 0 or 1", brs,
           [](Dec& c, R& r) {
             c.in.batch_run_status[z(r.range(0, c.B - 1))] = r.chance(0.5) ? 2 : -1;
           }),
      must("batch_run_status size mismatch", brs,
           [](Dec& c, R&) { c.in.batch_run_status.push_back(1); }),
      must(
          "value cache maxSeqLen differs", [](const Dec& c) { return c.M > 1; },
          [](Dec& c, R&) {
            c.out.value_cache =
                StridedView<float, 4>(c.vc.data(), {c.L, c.B, c.M - 1, c.nkv * c.dv});
          }),
      must(
          "key cache hidden size mismatch", [](const Dec& c) { return c.d > 1; },
          [](Dec& c, R&) {
            c.out.key_cache =
                StridedView<float, 4>(c.kc.data(), {c.L, c.B, c.M, c.nkv * (c.d - 1)});
          }),
      must("key shape mismatch or missing", writes,
           [](Dec& c, R& r) {
             c.in.key = r.chance(0.5) ? V3() : V3(c.k.data(), {c.B, c.nkv + 1, 0});
           }),
      must("caches missing", [](Dec& c, R&) { c.out.key_cache = {}; }),
      must("num_heads mismatch", [](Dec& c, R&) { c.p.num_heads += static_cast<int>(c.nkv); }),
      must(
          "num_kv_heads not dividing", [](const Dec& c) { return c.nh > 2; },
          [](Dec& c, R&) { c.p.num_kv_heads = static_cast<int>(c.nh - 1); }),
      must("value cache null",
           [](Dec& c, R&) {
             c.out.value_cache = StridedView<float, 4>(nullptr, c.out.value_cache.shape());
           }),
      must("key cache size overflows",
           [](Dec& c, R&) {
             c.out.key_cache = StridedView<float, 4>(c.kc.data(), {kHuge, kHuge, c.M, c.nkv * c.d},
                                                     {0, 0, c.nkv * c.d, 1});
           }),
      must(
          "out overlaps the key cache", [](const Dec& c) { return c.kc.size() >= c.o.size(); },
          [](Dec& c, R&) { c.out.out = StridedView<float, 3>(c.kc.data(), c.out.out.shape()); }),
      must(
          "the value cache overlaps the key cache",
          [](const Dec& c) { return writes(c) && c.kc.size() >= c.vc.size(); },
          [](Dec& c, R&) {
            c.out.value_cache = StridedView<float, 4>(c.kc.data(), c.out.value_cache.shape());
          }),
      must(
          "the query lies in the key cache",
          [](const Dec& c) { return writes(c) && c.kc.size() >= c.q.size(); },
          [](Dec& c, R&) { c.in.query = V3(c.kc.data(), c.in.query.shape()); }),
      must(
          "the value lies in the value cache",
          [](const Dec& c) { return writes(c) && c.vc.size() >= c.v.size(); },
          [](Dec& c, R&) { c.in.value = V3(c.vc.data(), c.in.value.shape()); }),
      must("mask missing for NORM", norm, [](Dec& c, R&) { c.in.mask = V3(); }),
      must(
          "mask narrower than the keys", [](const Dec& c) { return norm(c) && c.kv(0) > 0; },
          [](Dec& c, R&) {
            c.in.mask = V3(c.mask.data(), {c.mb, 1, c.kv(0) - 1}, {c.mw, c.mw, 1});
          }),
      must(
          "mask with the SWA decoder", [](const Dec& c) { return c.p.window_size > 0; },
          [](Dec& c, R&) {
            c.mask.assign(z(c.M), 0.0f);
            c.in.mask = V3(c.mask.data(), {1, 1, c.M});
          }),
      must(
          "log_n shorter than the batch",
          [](const Dec& c) { return c.p.scale_type == P::ScaleType::LogN; },
          [](Dec& c, R&) {
            c.in.log_n = StridedView<const float, 1>(c.ln.data(), {c.B - 1}, {1});
          }),
      must("unknown calc_type", [](Dec& c, R&) { c.p.calc_type = static_cast<P::CalcType>(5); }),
      must("unknown mask_type", [](Dec& c, R&) { c.p.mask_type = static_cast<P::MaskType>(10); }),
      must("qk_scale infinite",
           [](Dec& c, R&) { c.p.qk_scale = std::numeric_limits<float>::infinity(); }),
      must(
          "rolling cache smaller than the window", [](const Dec& c) { return c.rolling; },
          [](Dec& c, R&) { c.p.window_size = c.M + 1, c.in.token_offset[0] = c.M + 1; }),
      fuzz::edit<Dec>("every sequence inactive", false, brs,
                      [](Dec& c, R&) { c.in.batch_run_status.assign(z(c.B), 0); }),
  };
  return list;
}

void validate_only(Dec& c) { attnref::validate(c.p, c.in, c.out); }

void run_dec(fuzz::Run& run, std::uint64_t seed) {
  std::vector<float> kc0, vc0;  // the caches as built, for the expectation
  fuzz::run_case(
      run, seed, dec_perturbations(), build,
      fuzz::Named{"self_attention_decoder", "self_attention"},
      [&](Dec& c) {
        kc0 = c.kc, vc0 = c.vc;
        attnref::self_attention(c.p, c.in, c.out, {static_cast<int>(seed % 2 + 1)});
      },
      [&](const Dec& c) { return verify_dec(c, kc0, vc0); }, &Dec::q, &Dec::k, &Dec::v, &Dec::kc,
      &Dec::vc, &Dec::o, &Dec::mask, &Dec::ln);
}

const fuzz::Register reg_dec("self_attention_decoder", run_dec);

// ---- PREFIX_ENCODER ----------------------------------------------------------------------

struct Pre {
  Index B = 1, nh = 1, nkv = 1, d = 16, dv = 16, T = 0;
  std::vector<Index> seq, kv;
  fuzz::Pool pool;
  std::vector<float> q, o;
  P p;
  attnref::SelfAttentionInputs<float> in;
  StridedView<float, 3> out;
};

void build(Pre& c, R& r) {
  c.B = r.range(1, 3), c.nkv = r.range(1, 2), c.nh = c.nkv * r.range(1, 3);
  c.d = 16 * r.range(1, 2), c.dv = 16 * r.range(1, 2);  // PREFIX_ENCODER: multiples of 16
  for (Index b = 0; b < c.B; ++b) {
    c.seq.push_back(r.range(0, 6));
    c.kv.push_back(c.seq.back() + r.range(0, 20));
    c.T += c.seq.back();
  }
  make_pool(c.pool, r, c.kv, r.range(1, 8), c.nkv * c.d, c.nkv * c.dv);
  P& p = c.p;
  p.num_heads = static_cast<int>(c.nh), p.num_kv_heads = static_cast<int>(c.nkv);
  p.calc_type = P::CalcType::PrefixEncoder, p.mask_type = P::MaskType::CausalMask;
  p.is_triu_mask = 1, p.kernel_type = P::KernelType::HighPrecision;
  p.qk_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  c.q = r.normals<float>(c.T * c.nh * c.d);
  c.o.assign(z(c.T * c.nh * c.dv), kSentinel);
  c.in.query = V3(c.q.data(), {c.T, c.nh, c.d});
  c.in.key = V3(c.pool.k.data(), {c.pool.nb, c.pool.pbs, c.nkv * c.d});
  c.in.value = V3(c.pool.v.data(), {c.pool.nb, c.pool.pbs, c.nkv * c.dv});
  c.in.block_tables = StridedView<const i32, 2>(c.pool.table.data(), {c.B, c.pool.mb});
  c.in.seq_len = c.seq, c.in.kv_seq_len = c.kv;
  c.out = StridedView<float, 3>(c.o.data(), {c.T, c.nh, c.dv});
}

// Query i of a sequence of q queries over kv keys sees the keys j <= i + kv - q.
std::string verify_pre(const Pre& c) {
  ref::Problem pr;
  pr.num_heads = static_cast<int>(c.nh), pr.num_kv_heads = static_cast<int>(c.nkv);
  pr.head_size = static_cast<int>(c.d), pr.v_head_size = static_cast<int>(c.dv);
  pr.scale = c.p.qk_scale, pr.causal = ref::Causal::kBottomRight;
  ref::Seqs q, k, v;
  for (Index b = 0, t = 0; b < c.B; t += c.seq[z(b)], ++b) {
    pr.q_len.push_back(static_cast<int>(c.seq[z(b)]));
    pr.kv_len.push_back(static_cast<int>(c.kv[z(b)]));
    q.push_back(span(c.q, t * c.nh * c.d, c.seq[z(b)] * c.nh * c.d));
    k.push_back(c.pool.dense(b, c.kv[z(b)], false));
    v.push_back(c.pool.dense(b, c.kv[z(b)], true));
  }
  std::vector<double> want;
  for (const auto& x : ref::attention(pr, q, k, v).o) want.insert(want.end(), x.begin(), x.end());
  return fuzz::compare(std::vector<double>(c.o.begin(), c.o.end()), want, 2e-4);
}

using PP = fuzz::Perturbation<Pre>;
using PreOk = bool (*)(const Pre&);
using PreEdit = void (*)(Pre&, R&);
PP must(const char* n, PreEdit e) { return fuzz::edit<Pre>(n, true, nullptr, e); }
PP must(const char* n, PreOk ok, PreEdit e) { return fuzz::edit<Pre>(n, true, ok, e); }

const std::vector<PP>& pre_perturbations() {
  using T2 = StridedView<const i32, 2>;
  static const std::vector<PP> list{
      must(
          "block table entry out of range", [](const Pre& c) { return c.kv[0] > 0; },
          [](Pre& c, R& r) {
            c.pool.table[z(r.range(0, c.pool.blocks(c.kv[0]) - 1))] =
                r.chance(0.5) ? -1 : static_cast<i32>(c.pool.nb + r.range(0, 3));
          }),
      must("kv_seq_len past the table",
           [](Pre& c, R& r) {
             c.in.kv_seq_len[z(r.range(0, c.B - 1))] = c.pool.mb * c.pool.pbs + 1;
           }),
      must(
          "kv_seq_len below seq_len", [](const Pre& c) { return c.seq[0] > 0; },
          [](Pre& c, R&) { c.in.kv_seq_len[0] = c.seq[0] - 1; }),
      must("kv_seq_len size mismatch", [](Pre& c, R&) { c.in.kv_seq_len.pop_back(); }),
      must("block_tables missing", [](Pre& c, R&) { c.in.block_tables = {}; }),
      must(
          "block_tables null", [](const Pre& c) { return c.pool.mb > 0; },
          [](Pre& c, R&) {
            c.in.block_tables = T2(nullptr, {c.B, c.pool.mb});
          }),
      must("block_tables size overflows",
           [](Pre& c, R&) {
             c.in.block_tables = T2(c.pool.table.data(), {kHuge, kHuge}, {0, 0});
           }),
      must(
          "block_tables rows fewer than the sequences", [](const Pre& c) { return c.B > 1; },
          [](Pre& c, R&) {
            c.in.block_tables = T2(c.pool.table.data(), {c.B - 1, c.pool.mb});
          }),
      must("block size 0",
           [](Pre& c, R&) {
             c.in.key = V3(c.pool.k.data(), {c.pool.nb, 0, c.nkv * c.d});
             c.in.value = V3(c.pool.v.data(), {c.pool.nb, 0, c.nkv * c.dv});
           }),
      must("head size not a multiple of 16",
           [](Pre& c, R&) {
             c.in.value = V3(c.pool.v.data(), {c.pool.nb, c.pool.pbs, c.nkv * (c.dv - 8)});
             c.out = StridedView<float, 3>(c.o.data(), {c.T, c.nh, c.dv - 8});
           }),
      must("key hidden size mismatch",
           [](Pre& c, R&) {
             c.in.key = V3(c.pool.k.data(), {c.pool.nb, c.pool.pbs, c.nkv * c.d - 1});
           }),
      must(
          "value blocks differ from key", [](const Pre& c) { return c.pool.nb > 0; },
          [](Pre& c, R&) {
            c.in.value = V3(c.pool.v.data(), {c.pool.nb - 1, c.pool.pbs, c.nkv * c.dv});
          }),
      must("mask_type NORM", [](Pre& c, R&) { c.p.mask_type = P::MaskType::Norm; }),
      must("is_triu_mask 0", [](Pre& c, R&) { c.p.is_triu_mask = 0; }),
      must("kernel DEFAULT", [](Pre& c, R&) { c.p.kernel_type = P::KernelType::Default; }),
      must("q_scale not 1", [](Pre& c, R&) { c.p.q_scale = 0.5f; }),
      must("kv-bypass", [](Pre& c, R&) { c.p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass; }),
      must(
          "out overlaps the key cache",
          [](const Pre& c) { return c.T > 0 && c.pool.k.size() >= c.o.size(); },
          [](Pre& c, R&) { c.out = StridedView<float, 3>(c.pool.k.data(), c.out.shape()); }),
      must(
          "query null", [](const Pre& c) { return c.T > 0; },
          [](Pre& c, R&) { c.in.query = V3(nullptr, c.in.query.shape()); }),
      must("num_heads mismatch", [](Pre& c, R&) { c.p.num_heads += static_cast<int>(c.nkv); }),
      must("seq_len sum differs from the query", [](Pre& c, R&) { c.in.seq_len[0] += 1; }),
      fuzz::edit<Pre>("garbage in the block table past the lengths", false, nullptr,
                      [](Pre& c, R& r) {
                        for (Index b = 0; b < c.B; ++b)
                          for (Index j = c.pool.blocks(c.kv[z(b)]); j < c.pool.mb; ++j)
                            c.pool.table[z(b * c.pool.mb + j)] =
                                static_cast<i32>(r.range(-9, 1 << 30));
                      }),
  };
  return list;
}

void validate_only(Pre& c) {
  attnref::validate(c.p, c.in, attnref::SelfAttentionOutputs<float>{c.out});
}

void run_pre(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, pre_perturbations(), build, fuzz::Named{"self_attention_prefix", "self_attention"},
      [seed](Pre& c) {
        attnref::self_attention(c.p, c.in, attnref::SelfAttentionOutputs<float>{c.out},
                                {static_cast<int>(seed % 2 + 1)});
      },
      verify_pre, &Pre::q, &Pre::o, &Pre::pool);
}

const fuzz::Register reg_pre("self_attention_prefix", run_pre);

// ---- BNSD --------------------------------------------------------------------------------

struct Bn {
  bool pa = false;  // PA_ENCODER over BNSD q / k / v, else a cache calcType with kv-bypass
  Index B = 1, nh = 1, nkv = 1, d = 1, dv = 1, S = 1, L = 1, M = 1, mb = 1, mr = 1, mw = 1;
  std::vector<float> q, k, v, kc, vc, o, mask;
  P p;
  attnref::SelfAttentionBnsdInputs<float> in;
  attnref::SelfAttentionBnsdOutputs<float> out;
  bool active(Index b) const {
    return !p.batch_run_status_enable || in.batch_run_status[z(b)] == 1;
  }
  Index kv(Index b) const {
    if (pa) return in.seq_len[z(b)];
    return active(b) ? in.token_offset[z(b)] : 0;
  }
};

void build(Bn& c, R& r) {
  using C = P::CalcType;
  const C calc[] = {C::PaEncoder, C::Encoder, C::Decoder, C::Undefined};
  P& p = c.p;
  p.calc_type = calc[r.range(0, 3)];
  c.pa = p.calc_type == C::PaEncoder;
  const bool dec = p.calc_type == C::Decoder;
  c.B = r.range(1, 3), c.nkv = r.range(1, 2), c.nh = c.nkv * r.range(1, 3);
  c.d = r.range(1, 24), c.dv = r.range(1, 24), c.S = r.range(1, dec ? 2 : 8);
  c.L = r.range(1, 2), c.M = c.S + r.range(0, 6);
  p.num_heads = static_cast<int>(c.nh), p.num_kv_heads = static_cast<int>(c.nkv);
  p.input_layout = P::InputLayout::BNSD;
  p.qk_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  auto& in = c.in;
  for (Index b = 0; b < c.B; ++b) in.seq_len.push_back(dec ? 1 : r.range(0, c.S));
  c.q.assign(z(c.B * c.nh * c.S * c.d), kNaN);  // NaN in the padding rows, never read
  c.k.assign(z(c.B * c.nkv * c.S * c.d), kNaN);
  c.v.assign(z(c.B * c.nkv * c.S * c.dv), kNaN);
  auto fill = [&](std::vector<float>& x, Index heads, Index rows, Index len, Index b, Index w) {
    for (Index h = 0; h < heads; ++h)
      for (Index e = ((b * heads + h) * rows) * w; e < ((b * heads + h) * rows + len) * w; ++e)
        x[z(e)] = r.normal();
  };
  for (Index b = 0; b < c.B; ++b) fill(c.q, c.nh, c.S, in.seq_len[z(b)], b, c.d);
  in.query = StridedView<const float, 4>(c.q.data(), {c.B, c.nh, c.S, c.d});
  if (c.pa) {
    for (Index b = 0; b < c.B; ++b)
      fill(c.k, c.nkv, c.S, in.seq_len[z(b)], b, c.d),
          fill(c.v, c.nkv, c.S, in.seq_len[z(b)], b, c.dv);
    in.key = StridedView<const float, 4>(c.k.data(), {c.B, c.nkv, c.S, c.d});
    in.value = StridedView<const float, 4>(c.v.data(), {c.B, c.nkv, c.S, c.dv});
  } else {
    p.kvcache_cfg = P::KvCacheCfg::KBypassVBypass;
    if (r.chance(0.5)) p.kernel_type = P::KernelType::HighPrecision;
    p.mask_type = dec || r.chance(0.5) ? P::MaskType::Norm : P::MaskType::CausalMask;
    p.batch_run_status_enable = r.chance(0.3);
    in.layer_id = r.range(0, c.L - 1);
    for (Index b = 0; b < c.B; ++b) {
      in.token_offset.push_back(r.range(in.seq_len[z(b)], c.M));
      in.batch_run_status.push_back(p.batch_run_status_enable ? r.chance(0.7) : 1);
      if (in.batch_run_status.back() == 0 && r.chance(0.5)) in.token_offset.back() = 0;
    }
    c.kc.assign(z(c.L * c.B * c.nkv * c.M * c.d), kNaN);
    c.vc.assign(z(c.L * c.B * c.nkv * c.M * c.dv), kNaN);
    for (Index b = 0; b < c.B; ++b)
      fill(c.kc, c.nkv, c.M, c.kv(b), in.layer_id * c.B + b, c.d),
          fill(c.vc, c.nkv, c.M, c.kv(b), in.layer_id * c.B + b, c.dv);
    c.out.key_cache = StridedView<const float, 5>(c.kc.data(), {c.L, c.B, c.nkv, c.M, c.d});
    c.out.value_cache = StridedView<const float, 5>(c.vc.data(), {c.L, c.B, c.nkv, c.M, c.dv});
    if (p.mask_type == P::MaskType::Norm) {  // [1 or batch, >= maxQ, >= maxKv], binary
      c.mb = r.chance(0.5) ? 1 : c.B, c.mr = c.S + r.range(0, 1), c.mw = c.M + r.range(0, 1);
      c.mask.resize(z(c.mb * c.mr * c.mw));
      for (float& m : c.mask) m = binary(r);
      in.mask = V3(c.mask.data(), {c.mb, c.mr, c.mw});
    }
  }
  c.o.assign(z(c.B * c.nh * c.S * c.dv), kSentinel);
  c.out.out = StridedView<float, 4>(c.o.data(), {c.B, c.nh, c.S, c.dv});
}

std::string verify_bn(const Bn& c) {
  ref::AtbSelfAttention r = problem(c.p, c.nh, c.nkv, c.d, c.dv);
  std::vector<std::vector<double>> q(z(c.B)), k(z(c.B)), v(z(c.B));
  // Rows [0, len) of x[b], a BNSD [.][heads][n][w] tensor, appended as [len][heads][w].
  auto rows = [](std::vector<double>& dst, const std::vector<float>& x, Index b, Index heads,
                 Index n, Index len, Index w) {
    for (Index i = 0; i < len; ++i)
      for (Index h = 0; h < heads; ++h)
        for (Index e = 0; e < w; ++e) dst.push_back(x[z(((b * heads + h) * n + i) * w + e)]);
  };
  for (Index b = 0; b < c.B; ++b) {
    const Index len = c.in.seq_len[z(b)], cb = c.pa ? b : c.in.layer_id * c.B + b;
    r.seq_len.push_back(static_cast<int>(len));
    r.kv_len.push_back(static_cast<int>(c.kv(b)));
    rows(q[z(b)], c.q, b, c.nh, c.S, len, c.d);
    rows(k[z(b)], c.pa ? c.k : c.kc, cb, c.nkv, c.pa ? c.S : c.M, c.kv(b), c.d);
    rows(v[z(b)], c.pa ? c.v : c.vc, cb, c.nkv, c.pa ? c.S : c.M, c.kv(b), c.dv);
  }
  if (c.p.mask_type == P::MaskType::Norm)
    r.mask = [&c](int b, int i, int j) {
      return -3e38 * c.mask[z(((c.mb == 1 ? 0 : b) * c.mr + i) * c.mw + j)];
    };
  if (c.p.mask_type == P::MaskType::CausalMask)
    r.mask = [](int, int i, int j) { return j > i ? -3e38 : 0.0; };
  const auto want = ref::atb_self_attention(r, q, k, v);
  std::vector<double> got, exp;
  for (Index b = 0; b < c.B; ++b) {  // [len][nh][dv] rows; the padding rows must be 0
    rows(got, c.o, b, c.nh, c.S, c.in.seq_len[z(b)], c.dv);
    exp.insert(exp.end(), want[z(b)].begin(), want[z(b)].end());
    for (Index h = 0; h < c.nh; ++h)
      for (Index e = ((b * c.nh + h) * c.S + c.in.seq_len[z(b)]) * c.dv;
           e < (b * c.nh + h + 1) * c.S * c.dv; ++e)
        if (c.o[z(e)] != 0.0f) return "padding row not 0";
  }
  return fuzz::compare(got, exp, 2e-4);
}

using PB = fuzz::Perturbation<Bn>;
using BnOk = bool (*)(const Bn&);
using BnEdit = void (*)(Bn&, R&);
PB must(const char* n, BnEdit e) { return fuzz::edit<Bn>(n, true, nullptr, e); }
PB must(const char* n, BnOk ok, BnEdit e) { return fuzz::edit<Bn>(n, true, ok, e); }

bool pa(const Bn& c) { return c.pa; }
bool caches(const Bn& c) { return !c.pa; }

const std::vector<PB>& bn_perturbations() {
  using Q4 = StridedView<const float, 4>;
  using C5 = StridedView<const float, 5>;
  using O4 = StridedView<float, 4>;
  static const std::vector<PB> list{
      must("seq_len past S", [](Bn& c, R& r) { c.in.seq_len[z(r.range(0, c.B - 1))] = c.S + 1; }),
      must("seq_len size mismatch", [](Bn& c, R&) { c.in.seq_len.push_back(1); }),
      must(
          "seq_len not 1 for the decoder",
          [](const Bn& c) { return c.p.calc_type == P::CalcType::Decoder; },
          [](Bn& c, R&) { c.in.seq_len[0] = 0; }),
      must(
          "token_offset past maxSeqLen", [](const Bn& c) { return !c.pa && c.active(0); },
          [](Bn& c, R&) { c.in.token_offset[0] = c.M + 1; }),
      must(
          "token_offset below seq_len",
          [](const Bn& c) { return !c.pa && c.active(0) && c.in.seq_len[0] > 0; },
          [](Bn& c, R&) { c.in.token_offset[0] = c.in.seq_len[0] - 1; }),
      must("layer_id out of range", caches, [](Bn& c, R&) { c.in.layer_id = c.L; }),
      must("caches written with BNSD", caches,
           [](Bn& c, R&) { c.p.kvcache_cfg = P::KvCacheCfg::KCacheVCache; }),
      must("no mask for a cache calcType", caches,
           [](Bn& c, R&) { c.p.mask_type = P::MaskType::Undefined, c.in.mask = V3(); }),
      must("PREFIX_ENCODER with BNSD",
           [](Bn& c, R&) { c.p.calc_type = P::CalcType::PrefixEncoder; }),
      must("a mask with PA_ENCODER", pa,
           [](Bn& c, R&) { c.p.mask_type = P::MaskType::CausalMask; }),
      must("HIGH_PRECISION with PA_ENCODER", pa,
           [](Bn& c, R&) { c.p.kernel_type = P::KernelType::HighPrecision; }),
      must("BSND layout with the BNSD inputs",
           [](Bn& c, R&) { c.p.input_layout = P::InputLayout::BSND; }),
      must(
          "key S differs from the query", [](const Bn& c) { return c.pa && c.S > 1; },
          [](Bn& c, R&) {
            c.in.key = Q4(c.k.data(), {c.B, c.nkv, c.S - 1, c.d});
          }),
      must(
          "key cache head size mismatch", [](const Bn& c) { return !c.pa && c.d > 1; },
          [](Bn& c, R&) {
            c.out.key_cache = C5(c.kc.data(), {c.L, c.B, c.nkv, c.M, c.d - 1});
          }),
      must(
          "value cache maxSeqLen differs", [](const Bn& c) { return !c.pa && c.M > 1; },
          [](Bn& c, R&) {
            c.out.value_cache = C5(c.vc.data(), {c.L, c.B, c.nkv, c.M - 1, c.dv});
          }),
      must("caches missing", caches, [](Bn& c, R&) { c.out.value_cache = C5(); }),
      must(
          "out shape mismatch", [](const Bn& c) { return c.dv > 1; },
          [](Bn& c, R&) {
            c.out.out = O4(c.o.data(), {c.B, c.nh, c.S, c.dv - 1});
          }),
      must(
          "out overlaps the query", [](const Bn& c) { return c.q.size() >= c.o.size(); },
          [](Bn& c, R&) { c.out.out = O4(c.q.data(), c.out.out.shape()); }),
      must(
          "out overlaps a cache", [](const Bn& c) { return !c.pa && c.kc.size() >= c.o.size(); },
          [](Bn& c, R&) { c.out.out = O4(c.kc.data(), c.out.out.shape()); }),
      must("query null", [](Bn& c, R&) { c.in.query = Q4(nullptr, c.in.query.shape()); }),
      must("query extent negative",
           [](Bn& c, R&) {
             c.in.query = Q4(c.q.data(), {c.B, c.nh, -1, c.d}, {0, 0, c.d, 1});
           }),
      must("head size above 256",
           [](Bn& c, R&) {
             c.o.resize(z(c.B * c.nh * c.S * 257), kSentinel);
             c.out.out = O4(c.o.data(), {c.B, c.nh, c.S, 257});
           }),
      must(
          "mask rows fewer than the queries",
          [](const Bn& c) { return c.p.mask_type == P::MaskType::Norm && c.in.seq_len[0] > 0; },
          [](Bn& c, R&) {
            c.in.mask =
                V3(c.mask.data(), {c.mb, c.in.seq_len[0] - 1, c.mw}, {c.mr * c.mw, c.mw, 1});
          }),
      must(
          "batch_run_status not 0 or 1", [](const Bn& c) { return c.p.batch_run_status_enable; },
          [](Bn& c, R& r) { c.in.batch_run_status[z(r.range(0, c.B - 1))] = 2; }),
      must("num_heads mismatch", [](Bn& c, R&) { c.p.num_heads += static_cast<int>(c.nkv); }),
      fuzz::edit<Bn>(
          "every sequence inactive", false, [](const Bn& c) { return c.p.batch_run_status_enable; },
          [](Bn& c, R&) { c.in.batch_run_status.assign(z(c.B), 0); }),
  };
  return list;
}

void validate_only(Bn& c) { attnref::validate(c.p, c.in, c.out); }

void run_bn(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, bn_perturbations(), build, fuzz::Named{"self_attention_bnsd", "self_attention"},
      [seed](Bn& c) {
        attnref::self_attention(c.p, c.in, c.out, {static_cast<int>(seed % 2 + 1)});
      },
      verify_bn, &Bn::q, &Bn::k, &Bn::v, &Bn::kc, &Bn::vc, &Bn::o, &Bn::mask);
}

const fuzz::Register reg_bn("self_attention_bnsd", run_bn);

}  // namespace fuzz_sa_modes
