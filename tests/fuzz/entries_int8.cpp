// Fuzz entries of the int8 paths, each against its independent reference with the unit tests'
// tolerances: "prompt_flash_attention_int8" (int8 q / k / v; fp16 or int8 output, per-tensor or
// per-channel quant_scale2 / quant_offset2; every layout, sparse modes 0, 2, 3, actual lengths,
// GQA, quant_block_size) against ref::cann::pfa_quant; "paged_attention_int8" (DEQUANT_FUSION with
// offsets and logN; QKV_OFFLINE / ONLINE, decode or SPEC; NORM / SPEC masks; shuffled tables)
// against ref::paged_rows / ref::paged_qkv; "self_attention_int8" (qkv full quantization: causal,
// NORM, NORM_COMPRESS, high precision, clamp, MLA) against ref::atb_qkv_quant.

#include <attnref/attnref.hpp>
#include <limits>

#include "fuzz/fuzz.hpp"
#include "reference/atb_paged_modes.hpp"
#include "reference/atb_qkv_quant.hpp"
#include "reference/cann_pfa_quant.hpp"
#include "support/views.hpp"

namespace fuzz_int8_util {

using attnref::half;
using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;
using R = fuzz::Rng;
using i8 = std::int8_t;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

size_t z(Index i) { return static_cast<size_t>(i); }
std::vector<i8> i8s(R& r, Index n, int lim = 128) {
  std::vector<i8> x(z(n));
  for (i8& e : x) e = static_cast<i8>(r.range(-lim, lim - 1));
  return x;
}
float unit(R& r) { return static_cast<float>(r.range(0, 1000)) / 1000.0f; }
float non_finite(R& r) { return r.chance(0.5) ? kNaN : r.chance(0.5) ? kInf : -kInf; }
double as_half(double x) { return static_cast<float>(half(static_cast<float>(x))); }
std::string at(size_t i, double got, double want) {
  return "element " + std::to_string(i) + ": got " + std::to_string(got) + ", want " +
         std::to_string(want);
}

}  // namespace fuzz_int8_util

// ---- PromptFlashAttention, int8 q / k / v ------------------------------------------------

namespace fuzz_pfa_int8 {

using namespace fuzz_int8_util;
using F1 = StridedView<const float>;

// The compressed 2048 x 2048 mask of sparse modes 2 / 3 (attnref does not read its content):
// shared, not watched, not restrided (4 M elements per case would dominate the run).
const std::uint8_t* causal_mask() {
  static const std::vector<std::uint8_t> m(2048 * 2048, 0);
  return m.data();
}

struct Pfa8 {
  std::string layout;
  bool int8_out = false;
  Index B = 1, S1 = 1, S2 = 1, N = 1, KVN = 1, D = 1, Dv = 1, sm = 0;
  std::vector<Index> q_len, kv_len;  // per batch
  std::vector<i8> q, k, v, o8;
  std::vector<half> o;
  std::vector<float> sc, qs2, qo2;  // sc: deq_scale1, quant_scale1, deq_scale2
  attnref::PromptFlashAttentionParams p;
  attnref::PromptFlashAttentionInputs<i8> in;
  StridedView<half> out;
  StridedView<i8> out8;
  bool tnd() const { return layout == "TND"; }
  std::string out_layout() const { return layout == "BNSD_BSND" ? "BSND" : layout; }
};

std::vector<Index> shape(const std::string& l, Index B, Index S, Index n, Index w) {
  if (l == "BSH") return {B, S, n * w};
  if (l == "BNSD" || l == "BNSD_BSND") return {B, n, S, w};
  if (l == "TND") return {S, n, w};
  return {B, S, n, w};
}

// Offset of element (b, s, h, e) of a tensor in layout l (TND: s is the global token).
Index offset(const std::string& l, Index b, Index s, Index h, Index e, Index S, Index n, Index w) {
  if (l == "BNSD" || l == "BNSD_BSND") return ((b * n + h) * S + s) * w + e;
  if (l == "TND") return (s * n + h) * w + e;
  return ((b * S + s) * n + h) * w + e;
}

void build(Pfa8& c, R& r) {
  const char* layouts[] = {"BSH", "BSND", "BNSD", "BNSD_BSND", "TND"};
  c.layout = layouts[r.range(0, 4)];
  const bool tnd = c.tnd(), lens = tnd || r.chance(0.5);
  c.int8_out = r.chance(0.5);
  c.B = r.range(1, 3), c.KVN = r.range(1, 2), c.N = c.KVN * r.range(1, 3);
  c.D = r.range(1, 24), c.Dv = c.layout == "BSH" ? c.D : r.range(1, 24);
  c.sm = tnd ? 3 * r.range(0, 1) : r.chance(0.4) ? 0 : r.range(2, 3);
  for (Index b = 0; b < c.B; ++b) {
    c.q_len.push_back(r.range(tnd ? 0 : 1, 6));
    c.kv_len.push_back(r.range(tnd ? 0 : 1, 20));
    c.S1 = tnd ? (b ? c.S1 : 0) + c.q_len.back() : std::max(c.S1, c.q_len.back());
    c.S2 = tnd ? (b ? c.S2 : 0) + c.kv_len.back() : std::max(c.S2, c.kv_len.back());
  }
  if (!tnd) c.S1 += r.range(0, 1), c.S2 += r.range(0, 1);
  if (!lens) c.q_len.assign(z(c.B), c.S1), c.kv_len.assign(z(c.B), c.S2);  // the extents
  if (lens && !tnd && r.chance(0.2))
    (r.chance(0.5) ? c.q_len : c.kv_len)[z(r.range(0, c.B - 1))] = 0;
  for (Index b = 0; lens && b < c.B; ++b) {  // TND: cumulative
    c.in.actual_seq_lengths.push_back((tnd && b ? c.in.actual_seq_lengths.back() : 0) +
                                      c.q_len[z(b)]);
    c.in.actual_seq_lengths_kv.push_back((tnd && b ? c.in.actual_seq_lengths_kv.back() : 0) +
                                         c.kv_len[z(b)]);
  }
  const Index bb = tnd ? 1 : c.B;
  c.q = i8s(r, bb * c.S1 * c.N * c.D);
  c.k = i8s(r, bb * c.S2 * c.KVN * c.D);
  c.v = i8s(r, bb * c.S2 * c.KVN * c.Dv);
  const float qs1 = static_cast<float>(r.range(20, 127));  // around the unit test's scales
  c.sc = {(0.5f + 1.5f * unit(r)) / 4096.0f * (r.chance(0.1) ? -1.0f : 1.0f), qs1,
          (0.2f + 0.8f * unit(r)) / qs1};
  auto& p = c.p;
  p.num_heads = c.N;
  p.num_key_value_heads = c.KVN == c.N && r.chance(0.5) ? 0 : c.KVN;
  p.input_layout = c.layout;
  p.sparse_mode = c.sm;
  p.scale_value = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)));
  p.inner_precise = r.range(0, 3);
  if (r.chance(0.3)) p.pre_tokens = r.range(-3, 3), p.next_tokens = r.range(-3, 3);  // unused
  p.quant_block_size = r.chance(0.6) ? static_cast<int>(r.range(1, 8)) : 128;
  c.in.query = StridedView<const i8>(c.q.data(), shape(c.layout, c.B, c.S1, c.N, c.D));
  c.in.key = StridedView<const i8>(c.k.data(), shape(c.layout, c.B, c.S2, c.KVN, c.D));
  c.in.value = StridedView<const i8>(c.v.data(), shape(c.layout, c.B, c.S2, c.KVN, c.Dv));
  c.in.deq_scale1 = F1(&c.sc[0], {1});
  c.in.quant_scale1 = F1(&c.sc[1], {1});
  c.in.deq_scale2 = F1(&c.sc[2], {1});
  if (c.sm >= 2) {  // [2048, 2048], [1, 2048, 2048] or [1, 1, 2048, 2048]
    std::vector<Index> ms(z(r.range(0, 2)), 1);
    ms.insert(ms.end(), {2048, 2048});
    c.in.atten_mask = StridedView<const std::uint8_t>(causal_mask(), ms);
  }
  const auto os = shape(c.out_layout(), c.B, c.S1, c.N, c.Dv);
  const Index on = bb * c.S1 * c.N * c.Dv, ch = r.chance(0.5) ? c.N * c.Dv : 1;
  if (!c.int8_out) {
    c.o.assign(z(on), half(555.0f));
    c.out = StridedView<half>(c.o.data(), os);
    return;
  }
  c.o8.assign(z(on), i8{-77});
  c.out8 = StridedView<i8>(c.o8.data(), os);
  const std::vector<Index> qshape =
      ch > 1 && r.chance(0.5) ? std::vector<Index>{c.N, c.Dv} : std::vector<Index>{ch};
  const bool offset = r.chance(0.6);
  for (Index i = 0; i < ch; ++i) {
    c.qs2.push_back(0.05f + 3.0f * unit(r));
    if (offset) c.qo2.push_back(static_cast<float>(r.range(-30, 30)) / 10.0f);
  }
  c.in.quant_scale2 = F1(c.qs2.data(), qshape);
  if (offset) c.in.quant_offset2 = F1(c.qo2.data(), qshape);
}

// Query row i sees a prefix of its sequence's keys (mode 0: all; 2: j <= i; 3: j <= i + lk - lq):
// the reference on those n keys with the row as its query 0. n = 0: 0 (int8: the quantized 0);
// padded rows 0. fp16: the unit test's 1e-3 + 1e-3 |w| + slack; int8: the step range of x ± slack.
std::string verify(const Pfa8& c) {
  const Index W = std::max(c.D, c.Dv);  // the reference has one head size: zero padding
  ref::cann::PfaQuant rp;
  rp.heads = static_cast<int>(c.N), rp.kv_heads = static_cast<int>(c.KVN);
  rp.d = static_cast<int>(W), rp.block = c.p.quant_block_size;
  rp.deq1 = c.sc[0], rp.qs1 = c.sc[1], rp.deq2 = c.sc[2];
  rp.scale = static_cast<float>(c.p.scale_value);
  Index q0 = 0, k0 = 0;
  for (Index b = 0; b < c.B; q0 += c.q_len[z(b)], k0 += c.kv_len[z(b)], ++b) {
    const Index lq = c.q_len[z(b)], lk = c.kv_len[z(b)];
    const Index qb = c.tnd() ? q0 : 0, kb = c.tnd() ? k0 : 0;
    for (Index i = 0; i < (c.tnd() ? lq : c.S1); ++i) {
      const Index n = i >= lq     ? 0
                      : c.sm == 0 ? lk
                                  : std::clamp<Index>(i + 1 + (c.sm == 3 ? lk - lq : 0), 0, lk);
      ref::cann::PfaQuantResult res;
      if (n > 0) {
        rp.seq = static_cast<int>(n);
        std::vector<i8> q8(z(n * c.N * W), 0), k8(z(n * c.KVN * W), 0), v8(k8.size(), 0);
        for (Index h = 0; h < c.N; ++h)
          for (Index e = 0; e < c.D; ++e)
            q8[z(h * W + e)] = c.q[z(offset(c.layout, b, qb + i, h, e, c.S1, c.N, c.D))];
        for (Index j = 0; j < n; ++j)
          for (Index h = 0; h < c.KVN; ++h) {
            for (Index e = 0; e < c.D; ++e)
              k8[z((j * c.KVN + h) * W + e)] =
                  c.k[z(offset(c.layout, b, kb + j, h, e, c.S2, c.KVN, c.D))];
            for (Index e = 0; e < c.Dv; ++e)
              v8[z((j * c.KVN + h) * W + e)] =
                  c.v[z(offset(c.layout, b, kb + j, h, e, c.S2, c.KVN, c.Dv))];
          }
        res = ref::cann::pfa_quant(rp, q8, k8, v8);
      }
      for (Index h = 0; h < c.N; ++h)
        for (Index e = 0; e < c.Dv; ++e) {
          const size_t o = z(offset(c.out_layout(), b, qb + i, h, e, c.S1, c.N, c.Dv));
          const double w = n > 0 ? res.out[z(h * W + e)] : 0.0, sl = n > 0 ? res.slack[z(h)] : 0;
          const std::string row = "batch " + std::to_string(b) + " row " + std::to_string(i) + " ";
          if (!c.int8_out) {
            const double got = static_cast<float>(c.o[o]);
            if (!(std::fabs(got - w) <= 1e-3 + 1e-3 * std::fabs(w) + sl * 1.01))
              return row + at(o, got, w);
            continue;
          }
          const size_t ch = c.qs2.size() == 1 ? 0 : z(h * c.Dv + e);
          const double x = i >= lq ? 0.0 : w * c.qs2[ch] + (c.qo2.empty() ? 0.0 : c.qo2[ch]);
          const double s = i >= lq ? 0.0 : 1e-2 + sl * std::fabs(c.qs2[ch]);
          const double got = c.o8[o], lo = std::clamp(std::nearbyint(x - s), -128.0, 127.0),
                       hi = std::clamp(std::nearbyint(x + s), -128.0, 127.0);
          if (got < lo || got > hi) return row + "int8 " + at(o, got, x);
        }
    }
  }
  return "";
}

using PP = fuzz::Perturbation<Pfa8>;
using Ok = bool (*)(const Pfa8&);
using Edit = void (*)(Pfa8&, R&);
PP must(const char* n, Ok ok, Edit e) { return fuzz::edit<Pfa8>(n, true, ok, e); }
PP must(const char* n, Edit e) { return fuzz::edit<Pfa8>(n, true, nullptr, e); }
bool int8_out(const Pfa8& c) { return c.int8_out; }
bool int8_rows(const Pfa8& c) { return c.int8_out && !c.o8.empty(); }
bool fp16_out(const Pfa8& c) { return !c.int8_out; }
bool has_q(const Pfa8& c) { return !c.q.empty(); }
bool has_lengths(const Pfa8& c) { return !c.in.actual_seq_lengths.empty(); }

const std::vector<PP>& perturbations() {
  static const std::vector<PP> list{
      must("query null", has_q,
           [](Pfa8& c, R&) { c.in.query = support::with_data(c.in.query, nullptr); }),
      must("key extent negative",
           [](Pfa8& c, R&) { c.in.key = support::resized(c.in.key, 0, -c.in.key.size(0) - 1); }),
      must("value size overflows",
           [](Pfa8& c, R&) {
             c.in.value = support::resized(support::resized(c.in.value, 0, kHuge), 1, kHuge);
           }),
      must("deq_scale1 missing", [](Pfa8& c, R&) { c.in.deq_scale1 = {}; }),
      must("quant_scale1 not per tensor",
           [](Pfa8& c, R& r) { c.in.quant_scale1 = F1(c.sc.data(), {r.range(2, 3)}); }),
      must("int8 scale not finite", [](Pfa8& c, R& r) { c.sc[z(r.range(0, 2))] = non_finite(r); }),
      must("quant_scale2 with fp16 output", fp16_out,
           [](Pfa8& c, R&) { c.in.quant_scale2 = F1(c.sc.data(), {1}); }),
      must("quant_scale2 missing or mis-sized", int8_out,
           [](Pfa8& c, R& r) {
             c.qs2.assign(z(c.N * c.Dv + 1), 2.0f),
                 c.in.quant_scale2 = r.chance(0.5) ? F1() : F1(c.qs2.data(), {c.N * c.Dv + 1});
           }),
      must("quant_offset2 shape differs", int8_out,
           [](Pfa8& c, R&) {
             c.qo2.assign(c.qs2.size() + 1, 1.0f);
             c.in.quant_offset2 = F1(c.qo2.data(), {static_cast<Index>(c.qo2.size())});
           }),
      must("quant_block_size out of range",
           [](Pfa8& c, R& r) { c.p.quant_block_size = r.chance(0.5) ? 1025 : -r.range(0, 2); }),
      must("sparse_mode out of range",
           [](Pfa8& c, R& r) { c.p.sparse_mode = r.chance(0.5) ? r.range(5, 9) : -1; }),
      must("mask missing or not the 2048 tile",
           [](Pfa8& c, R& r) {
             if (c.sm == 0) c.p.sparse_mode = r.range(1, 3);  // each needs a mask
             c.in.atten_mask = {};
             if (c.sm > 0 && r.chance(0.5))
               c.in.atten_mask = StridedView<const std::uint8_t>(causal_mask(), {2048, 2047});
           }),
      must("actual lengths out of range", has_lengths,
           [](Pfa8& c, R&) {  // TND: the last cumulative length past T1
             (c.tnd() ? c.in.actual_seq_lengths.back() : c.in.actual_seq_lengths_kv[0]) += 1 + c.S2;
           }),
      must("int8 output overlaps the query", int8_rows,
           [](Pfa8& c, R&) {
             c.q.resize(std::max(c.q.size(), c.o8.size()));
             c.in.query = support::with_data(c.in.query, c.q.data());
             c.out8 = support::with_data(c.out8, c.q.data());
           }),
      fuzz::edit<Pfa8>("quant_scale1 saturates P8", false, nullptr,
                       [](Pfa8& c, R& r) { c.sc[1] = r.chance(0.7) ? 1000.0f : -1000.0f; }),
  };
  return list;
}

// Every input view but the shared compressed mask (never read, and 4 M elements).
void restride_inputs(Pfa8& c, support::Restrider& r) {
  c.in.for_each_view([&r](const std::string& name, auto& v) {
    if (name != "atten_mask") r(name, v);
  });
}

void run(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, perturbations(), build,
      fuzz::Named{"prompt_flash_attention_int8", "prompt_flash_attention"},
      [seed](Pfa8& c) {
        const int t = static_cast<int>(seed % 2 + 1);
        if (c.int8_out)
          attnref::prompt_flash_attention(c.p, c.in,
                                          attnref::PromptFlashAttentionOutputs<i8>{c.out8}, t);
        else
          attnref::prompt_flash_attention(c.p, c.in,
                                          attnref::PromptFlashAttentionOutputs<half>{c.out}, t);
      },
      verify, &Pfa8::q, &Pfa8::k, &Pfa8::v, &Pfa8::o, &Pfa8::o8, &Pfa8::sc, &Pfa8::qs2, &Pfa8::qo2);
}

const fuzz::Register reg("prompt_flash_attention_int8", run);

}  // namespace fuzz_pfa_int8

// ---- PagedAttention, int8 caches (DEQUANT_FUSION) and int8 q / caches (QKV) --------------

namespace fuzz_pa_int8 {

using namespace fuzz_int8_util;
using P = attnref::PagedAttentionParams;
using i32 = std::int32_t;
template <class T>
StridedView<const T, 1> vec(const std::vector<T>& x) {
  return {x.empty() ? nullptr : x.data(), {static_cast<Index>(x.size())}};
}

struct Pa8 {
  bool qkv = true, online = true, want_oor = false;
  int mask = 0;  // 0 none, 1 NORM rows [mb, 1, S], 2 NORM square [1, S, S], 3 SPEC [tokens, S]
  Index batch = 1, nh = 1, nkv = 1, d = 1, dv = 1, bs = 1, blocks = 1, maxb = 1, S = 1, mb = 1;
  std::vector<Index> ctx, ql, qcu;  // context, query tokens and first token of each sequence
  std::vector<i8> q8, kc, vc;
  std::vector<half> qh, m, o;
  std::vector<float> kd, vd, ps, ln;
  std::vector<i32> ko, vo, table;
  P p;
  attnref::PagedAttentionInputs<i8, i8, half> in8;    // QKV_OFFLINE / QKV_ONLINE
  attnref::PagedAttentionInputs<half, i8, half> inh;  // DEQUANT_FUSION
  StridedView<half, 3> out;
  Index tokens() const { return qcu.back(); }
  template <class F>
  void each(F&& f) {  // f(the inputs in use)
    return qkv ? f(in8) : f(inh);
  }
};

void build(Pa8& c, R& r) {
  c.qkv = r.chance(0.6), c.online = c.qkv && r.chance(0.5);
  const bool spec = c.qkv && r.chance(0.3);
  c.batch = r.range(1, 3), c.nkv = r.range(1, 2), c.nh = c.nkv * r.range(1, 3);
  c.d = r.range(1, 24), c.dv = r.range(1, 24), c.bs = r.range(1, 8);
  c.qcu.push_back(0);
  for (Index b = 0; b < c.batch; ++b) {
    c.ctx.push_back(r.range(0, 40));
    c.ql.push_back(spec ? r.range(0, std::min<Index>(c.ctx.back(), 4)) : 1);
    c.qcu.push_back(c.qcu.back() + c.ql.back());
    c.maxb = std::max(c.maxb, (c.ctx.back() + c.bs - 1) / c.bs);
    c.S = std::max(c.S, c.ctx.back() + r.range(0, 2));
  }
  c.blocks = c.batch * c.maxb + r.range(1, 3);  // shuffled, a spare block or more
  std::vector<i32> ids(z(c.blocks));
  for (Index i = 0; i < c.blocks; ++i) ids[z(i)] = static_cast<i32>(i);
  std::shuffle(ids.begin(), ids.end(), r.g);
  c.table.assign(z(c.batch * c.maxb), -1);
  for (Index b = 0, next = 0; b < c.batch; ++b)
    for (Index j = 0; j * c.bs < c.ctx[z(b)]; ++j) c.table[z(b * c.maxb + j)] = ids[z(next++)];
  c.kc = i8s(r, c.blocks * c.bs * c.nkv * c.d);
  c.vc = i8s(r, c.blocks * c.bs * c.nkv * c.dv);
  auto& p = c.p;
  p.num_heads = static_cast<int>(c.nh);
  p.num_kv_heads = c.nkv == c.nh && r.chance(0.5) ? 0 : static_cast<int>(c.nkv);
  p.qk_scale = r.chance(0.5) ? 0.125f : static_cast<float>(1.0 / std::sqrt(double(c.d)));
  p.quant_block_size = r.chance(0.6) ? static_cast<int>(r.range(1, 8)) : 128;
  // Masks (-10000 holes): SPEC takes NORM square or SPEC; decode none or NORM rows, whose
  // columns past each context hold NaN (never read).
  c.mask = spec ? static_cast<int>(r.range(2, 3)) : r.chance(0.4) ? 1 : 0;
  if (c.mask == 1) c.mb = r.chance(0.5) ? 1 : c.batch;
  const Index rows = c.mask == 1 ? c.mb : c.mask == 2 ? c.S : c.tokens();
  for (Index i = 0; c.mask > 0 && i < rows * c.S; ++i) {
    const bool past = c.mask == 1 && c.mb > 1 && i % c.S >= c.ctx[z(i / c.S)];
    c.m.push_back(half(past ? kNaN : r.chance(0.2) ? -10000.0f : 0.0f));
  }
  p.mask_type = c.mask == 0   ? P::MaskType::Undefined
                : c.mask == 3 ? P::MaskType::Spec
                              : P::MaskType::Norm;
  if (spec) p.calc_type = P::CalcType::Spec;
  c.o.assign(z(c.tokens() * c.nh * c.dv), half(555.0f));
  c.out = StridedView<half, 3>(c.o.data(), {c.tokens(), c.nh, c.dv});
  if (c.qkv) {
    p.quant_type = c.online ? P::QuantType::QkvOnline : P::QuantType::QkvOffline;
    p.out_data_type = P::OutDataType::Float16;
    for (Index h = 0; h < c.nh; ++h) {  // the unit test's magnitudes
      c.kd.push_back((r.chance(0.3) ? -1.0f : 1.0f) * (1e-3f + 2e-3f * unit(r)));
      c.vd.push_back(2e-3f + 2e-2f * unit(r));
      if (!c.online) c.ps.push_back(20.0f + 107.0f * unit(r));
    }
    c.q8 = i8s(r, c.tokens() * c.nh * c.d, 41);
    c.in8.query = {c.q8.data(), {c.tokens(), c.nh, c.d}};
    if (spec) c.in8.q_seq_lens = c.ql;
  } else {
    p.quant_type = P::QuantType::DequantFusion;
    p.has_quant_offset = r.chance(0.5);
    for (Index i = 0; i < c.nkv * (c.d + c.dv); ++i) {  // per channel, 0.05 / 0.005 / 0.0005
      const Index ch = i < c.nkv * c.d ? i : i - c.nkv * c.d;
      (ch == i ? c.kd : c.vd).push_back((0.5f + unit(r)) * 0.05f * std::pow(0.1f, float(ch % 3)));
      if (p.has_quant_offset) (ch == i ? c.ko : c.vo).push_back(static_cast<i32>(r.range(-20, 20)));
    }
    for (Index i = 0; i < c.tokens() * c.nh * c.d; ++i) c.qh.push_back(half(r.normal()));
    c.inh.query = {c.qh.data(), {c.tokens(), c.nh, c.d}};
    if (r.chance(0.3)) {
      p.scale_type = P::ScaleType::LogN;
      for (Index b = 0; b < c.batch; ++b) c.ln.push_back(0.5f + unit(r));
      c.inh.log_n = vec(c.ln);
    }
  }
  c.each([&c](auto& in) {
    in.key_cache = {c.kc.data(), {c.blocks, c.bs, c.nkv, c.d}};
    in.value_cache = {c.vc.data(), {c.blocks, c.bs, c.nkv, c.dv}};
    in.block_tables = {c.table.data(), {c.batch, c.maxb}};
    in.context_lens = c.ctx;
    if (c.mask == 1) in.mask = {c.m.data(), {c.mb, 1, c.S}};
    if (c.mask == 2) in.mask = {c.m.data(), {1, c.S, c.S}};
    if (c.mask == 3) in.spec_mask = {c.m.data(), {c.tokens(), c.S}};
    in.k_descale = vec(c.kd), in.v_descale = vec(c.vd), in.p_scale = vec(c.ps);
    in.k_offset = vec(c.ko), in.v_offset = vec(c.vo);
  });
}

// The keys and values gathered through the table. QKV: within 2^-9 relative, the fp32
// accumulation bound and the row's near-tie slack (the unit test's rule; plus half fp16's
// subnormal step); DEQUANT_FUSION: the fp16 policy against the reference rounded to fp16.
std::string verify(const Pa8& c) {
  std::vector<int> seq;  // the sequence of each query token
  for (Index b = 0; b < c.batch; ++b) seq.insert(seq.end(), z(c.ql[z(b)]), static_cast<int>(b));
  const std::function<float(int, int)> mask = [&c, &seq](int x, int t) {
    const Index b = seq[z(x)];
    const Index row = c.mask == 1   ? (c.mb == 1 ? 0 : b)
                      : c.mask == 2 ? c.ctx[z(b)] - c.ql[z(b)] + x - c.qcu[z(b)]
                                    : x;
    return static_cast<float>(c.m[z(row * c.S + t)]);
  };
  std::vector<ref::Rows8> k(z(c.batch)), v(z(c.batch));
  for (Index b = 0; b < c.batch; ++b)
    for (Index t = 0; t < c.ctx[z(b)]; ++t) {
      const Index h0 = (c.table[z(b * c.maxb + t / c.bs)] * c.bs + t % c.bs) * c.nkv;
      k[z(b)].emplace_back(c.kc.begin() + h0 * c.d, c.kc.begin() + (h0 + c.nkv) * c.d);
      v[z(b)].emplace_back(c.vc.begin() + h0 * c.dv, c.vc.begin() + (h0 + c.nkv) * c.dv);
    }
  const int nh = static_cast<int>(c.nh), nkv = static_cast<int>(c.nkv);
  const int d = static_cast<int>(c.d), dv = static_cast<int>(c.dv);
  if (c.qkv) {
    ref::PagedQkv pr{nh, nkv, d, dv, c.p.qk_scale, c.kd, c.vd, c.ps, c.p.quant_block_size,
                     {}, 6e-6};
    if (c.mask) pr.mask = mask;
    ref::Rows8 q;
    for (Index x = 0; x < c.tokens(); ++x)
      q.emplace_back(c.q8.begin() + x * c.nh * c.d, c.q8.begin() + (x + 1) * c.nh * c.d);
    const ref::QkvResult w = ref::paged_qkv(pr, q, seq, k, v);
    for (size_t i = 0; i < c.o.size(); ++i) {
      const double got = static_cast<float>(c.o[i]);
      const double allowed =
          0x1p-9 * std::fabs(w.out[i]) + 1e-5 * w.mag[i] + w.slack[i / z(c.dv)] + 0x1p-25;
      if (!(std::fabs(got - w.out[i]) <= allowed)) return at(i, got, w.out[i]);
    }
    return "";
  }
  ref::PagedModes pr{nh, nkv, d, dv, c.p.qk_scale, {c.ln.begin(), c.ln.end()}, {}};
  if (c.mask) pr.bias = [&mask](int x, int, int t) { return static_cast<double>(mask(x, t)); };
  ref::Rows q(z(c.tokens()));
  std::vector<ref::Rows> kf(k.size()), vf(v.size());
  for (size_t i = 0; i < c.qh.size(); ++i) q[i / z(c.nh * c.d)].push_back(float(c.qh[i]));
  for (size_t b = 0; b < k.size(); ++b)
    for (size_t t = 0; t < k[b].size(); ++t) {
      kf[b].push_back(ref::dequant(k[b][t].data(), c.kd, c.ko));
      vf[b].push_back(ref::dequant(v[b][t].data(), c.vd, c.vo));
    }
  std::vector<double> want, got;
  for (double x : ref::paged_rows(pr, q, seq, kf, vf)) want.push_back(as_half(x));
  for (const half& x : c.o) got.push_back(static_cast<float>(x));
  return fuzz::compare(got, want, 1e-3);
}

using PP = fuzz::Perturbation<Pa8>;
using Ok = bool (*)(const Pa8&);
using Edit = void (*)(Pa8&, R&);
PP must(const char* n, Ok ok, Edit e) { return fuzz::edit<Pa8>(n, true, ok, e); }
PP must(const char* n, Edit e) { return fuzz::edit<Pa8>(n, true, nullptr, e); }
bool qkv(const Pa8& c) { return c.qkv; }
bool offline(const Pa8& c) { return c.qkv && !c.online; }
bool keys(const Pa8& c) { return *std::max_element(c.ctx.begin(), c.ctx.end()) > 0; }
bool rows(const Pa8& c) { return !c.o.empty(); }

const std::vector<PP>& perturbations() {
  static const std::vector<PP> list{
      must("block table entry out of range", keys,
           [](Pa8& c, R& r) {  // the last block of a sequence with keys: -1 or past numBlocks
             Index b = r.range(0, c.batch - 1);
             while (c.ctx[z(b)] == 0) b = (b + 1) % c.batch;
             c.table[z(b * c.maxb + (c.ctx[z(b)] - 1) / c.bs)] =
                 r.chance(0.5) ? -1 : static_cast<i32>(c.blocks + r.range(0, 3));
             c.want_oor = true;
           }),
      must("block_tables null",
           [](Pa8& c, R&) {
             c.each([](auto& in) { in.block_tables = {nullptr, in.block_tables.shape()}; });
           }),
      must("key_cache null",
           [](Pa8& c, R&) {
             c.each([](auto& in) { in.key_cache = {nullptr, in.key_cache.shape()}; });
           }),
      must("context_lens negative",
           [](Pa8& c, R& r) {
             const size_t b = z(r.range(0, c.batch - 1));
             c.each([b](auto& in) { in.context_lens[b] = -1; });
           }),
      must("query size overflows",
           [](Pa8& c, R&) {
             c.each([](auto& in) { in.query = {in.query.data(), {kHuge, kHuge, 1}, {0, 0, 1}}; });
           }),
      must("k_descale mis-sized",
           [](Pa8& c, R&) {
             c.kd.push_back(1.0f);
             c.each([&c](auto& in) { in.k_descale = vec(c.kd); });
           }),
      must("v_descale missing", [](Pa8& c, R&) { c.each([](auto& in) { in.v_descale = {}; }); }),
      must("a scale not finite",
           [](Pa8& c, R& r) {  // was accepted, giving NaN heads
             std::vector<float>& s = !c.ps.empty() && r.chance(0.3) ? c.ps
                                     : r.chance(0.5)                ? c.kd
                                                                    : c.vd;
             s[z(r.range(0, static_cast<Index>(s.size()) - 1))] = non_finite(r);
           }),
      must("p_scale against the mode",
           [](Pa8& c, R&) {  // given for online / dequant, missing for offline
             c.ps.assign(c.online || !c.qkv ? z(c.nh) : 0, 50.0f);
             c.each([&c](auto& in) { in.p_scale = vec(c.ps); });
           }),
      must("offsets against has_quant_offset",
           [](Pa8& c, R&) { c.p.has_quant_offset = c.qkv || c.ko.empty(); }),
      must("quant_type against the types",
           [](Pa8& c, R& r) {
             c.p.quant_type = static_cast<P::QuantType>(c.qkv ? r.range(0, 1) : r.range(2, 3));
             if (r.chance(0.2)) c.p.quant_type = static_cast<P::QuantType>(4);
           }),
      must("out_data_type mismatch", qkv,
           [](Pa8& c, R& r) {
             c.p.out_data_type =
                 r.chance(0.5) ? P::OutDataType::BFloat16 : P::OutDataType::Undefined;
           }),
      must("quant_block_size out of range",
           [](Pa8& c, R& r) { c.p.quant_block_size = r.chance(0.5) ? 0 : 1025; }),
      must("mask_type out of range",
           [](Pa8& c, R& r) { c.p.mask_type = static_cast<P::MaskType>(r.chance(0.5) ? 6 : -1); }),
      must("LogN or q_scale with an int8 query", qkv,
           [](Pa8& c, R& r) {
             c.p.q_scale = r.chance(0.5) ? 0.5f : 0.0f;
             if (c.p.q_scale == 0.0f) c.p.scale_type = P::ScaleType::LogN;
             c.ln.assign(z(c.batch), 1.0f);
             c.in8.log_n = vec(c.ln);
           }),
      must("out overlaps the query", rows,
           [](Pa8& c, R&) {
             if (c.qkv) {  // fp16 output over the int8 query
               c.q8.resize(std::max(c.q8.size(), 2 * c.o.size()));
               c.in8.query = {c.q8.data(), c.in8.query.shape()};
               c.out = {reinterpret_cast<half*>(c.q8.data()), c.out.shape()};
             } else {
               c.qh.resize(std::max(c.qh.size(), c.o.size()));
               c.inh.query = {c.qh.data(), c.inh.query.shape()};
               c.out = {c.qh.data(), c.out.shape()};
             }
           }),
      fuzz::edit<Pa8>("offline p_scale saturates P8", false, offline,
                      [](Pa8& c, R& r) { c.ps[z(r.range(0, c.nh - 1))] = 1000.0f; }),
  };
  return list;
}

void run(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, perturbations(), build, fuzz::Named{"paged_attention_int8", "paged_attention"},
      [seed](Pa8& c) {
        try {
          c.each([&](auto& in) {
            attnref::paged_attention(c.p, in, attnref::PagedAttentionOutputs<half>{c.out},
                                     static_cast<int>(seed % 2 + 1));
          });
        } catch (const std::invalid_argument& e) {  // a bad block table entry: out_of_range
          if (c.want_oor) throw std::runtime_error(std::string("not out_of_range: ") + e.what());
          throw;
        }
      },
      verify, &Pa8::q8, &Pa8::qh, &Pa8::kc, &Pa8::vc, &Pa8::o, &Pa8::table, &Pa8::m, &Pa8::kd,
      &Pa8::vd, &Pa8::ps, &Pa8::ko, &Pa8::vo, &Pa8::ln);
}

const fuzz::Register reg("paged_attention_int8", run);

}  // namespace fuzz_pa_int8

// ---- SelfAttention, qkv full quantization ------------------------------------------------

namespace fuzz_sa_int8 {

using namespace fuzz_int8_util;
using P = attnref::SelfAttentionParams;
using V1 = StridedView<const float, 1>;
using V3 = StridedView<const i8, 3>;

struct Sa8 {
  bool online = true, mla = false;
  int mk = 0;  // mask: 0 none, 1 CausalMask, 2 NORM [mb, ms, ms], 3 NORM_COMPRESS tile
  Index nh = 1, nkv = 1, d = 32, dv = 32, tokens = 0, ms = 1, mb = 1;
  std::vector<Index> seq;
  std::vector<i8> q, k, v;
  std::vector<float> qkd, vpv, ps;
  std::vector<half> m, o;
  std::vector<std::int32_t> offs;
  std::vector<double> mvals;  // the mask's values as stored
  P p;
  attnref::SelfAttentionQuantInputs<half> in;
  StridedView<half, 3> out;
  bool additive() const { return p.kernel_type == P::KernelType::Default; }  // fp16 output
};

void build(Sa8& c, R& r) {
  c.online = r.chance(0.5), c.mla = r.chance(0.2);
  c.nkv = r.range(1, 2), c.nh = c.nkv * r.range(1, 3), c.d = 32 * r.range(1, 2);
  c.dv = c.mla ? 32 : 32 * r.range(1, 2);
  for (Index b = r.range(1, 3); b > 0; --b) c.seq.push_back(r.range(0, 10));
  for (Index l : c.seq) c.tokens += l, c.ms = std::max(c.ms, l);
  c.q = i8s(r, c.tokens * c.nh * c.d);
  c.k = i8s(r, c.tokens * c.nkv * c.d);
  if (!c.mla) c.v = i8s(r, c.tokens * c.nkv * c.dv);
  const float base = 3.0f / (127.0f * 127.0f * std::sqrt(static_cast<float>(c.d)));
  for (Index h = 0; h < c.nh; ++h) {  // the unit test's magnitudes
    c.qkd.push_back(base * (0.5f + unit(r)) * 4.0f);
    c.vpv.push_back((0.5f + unit(r)) / 127.0f);
    if (!c.online) c.ps.push_back((0.5f + unit(r)) * 1.5f / 127.0f);
  }
  P& p = c.p;
  p.num_heads = static_cast<int>(c.nh);
  p.num_kv_heads = c.nkv == c.nh && r.chance(0.5) ? 0 : static_cast<int>(c.nkv);
  p.qk_scale = r.chance(0.5) ? 0.75f : 0.25f + unit(r);
  p.calc_type = P::CalcType::PaEncoder;
  p.quant_type = c.online ? P::QuantType::QkvOnline : P::QuantType::QkvOffline;
  p.out_data_type = P::OutDataType::Float16;
  if (r.chance(0.3)) p.kernel_type = P::KernelType::HighPrecision;
  if (r.chance(0.2)) p.clamp_type = P::ClampType::MinMax, p.clamp_min = -1.5f, p.clamp_max = 2.0f;
  p.quant_block_size = r.chance(0.6) ? r.range(1, 8) : 128;
  if (c.mla) p.mla_v_head_size = c.dv;
  c.mk = c.mla ? 2 * static_cast<int>(r.range(0, 1)) : static_cast<int>(r.range(0, 3));
  const float hidden = c.additive() ? -10000.0f : 1.0f;  // fp16 additive, or binary x -3e38
  if (c.mk == 1) p.mask_type = P::MaskType::CausalMask;
  if (c.mk == 2) {  // key 0 always visible (a binary mask hiding a whole row is -inf in fp16)
    p.mask_type = P::MaskType::Norm;
    c.mb = r.chance(0.5) ? 1 : static_cast<Index>(c.seq.size());
    for (Index i = 0; i < c.mb * c.ms * c.ms; ++i)
      c.mvals.push_back(i % c.ms != 0 && r.chance(0.3) ? hidden : 0.0f);
  }
  if (c.mk == 3) {  // the [128, 128] triangular tile
    p.mask_type = P::MaskType::NormCompress, p.is_triu_mask = 1, c.ms = 128;
    for (Index i = 0; i < 128 * 128; ++i) c.mvals.push_back(i % 128 > i / 128 ? hidden : 0.0f);
  }
  for (double x : c.mvals) c.m.push_back(half(static_cast<float>(x)));
  if (c.mk >= 2) c.in.mask = {c.m.data(), {c.mb, c.ms, c.ms}};
  c.in.query = V3(c.q.data(), {c.tokens, c.nh, c.d});
  c.in.key = V3(c.k.data(), {c.tokens, c.nkv, c.d});
  if (!c.mla) c.in.value = V3(c.v.data(), {c.tokens, c.nkv, c.dv});
  c.in.seq_len = c.seq;
  c.in.qk_descale = V1(c.qkd.data(), {c.nh});
  c.in.vpv_descale = V1(c.vpv.data(), {c.nh});
  if (!c.online) c.in.p_scale = V1(c.ps.data(), {c.nh});
  c.o.assign(z(c.tokens * c.nh * c.dv), half(555.0f));
  c.out = StridedView<half, 3>(c.o.data(), {c.tokens, c.nh, c.dv});
}

// The fp16 policy against the reference rounded to fp16; a row whose P̂ rounding sat on a tie
// may also move by two P8 steps (vpvDescale · P scale · 128, l >= 1).
std::string verify(const Sa8& c) {
  ref::AtbQkvQuant r;
  r.num_heads = static_cast<int>(c.nh), r.num_kv_heads = static_cast<int>(c.nkv);
  r.head_size = static_cast<int>(c.d), r.v_head_size = static_cast<int>(c.dv);
  for (Index l : c.seq) r.seq_len.push_back(static_cast<int>(l));
  r.qk_scale = c.p.qk_scale;
  r.clamp = c.p.clamp_type == P::ClampType::MinMax;
  r.clamp_min = c.p.clamp_min, r.clamp_max = c.p.clamp_max;
  r.qk_descale = c.qkd, r.vpv_descale = c.vpv, r.p_scale = c.ps;
  r.block = static_cast<int>(c.p.quant_block_size);
  const double coeff = c.additive() ? 1.0 : -3e38, hidden = c.additive() ? -10000.0 : 1.0;
  if (c.mk == 1) r.mask = [](int, int i, int j) { return j > i ? -INFINITY : 0.0; };
  if (c.mk == 2)
    r.mask = [&c, coeff](int b, int i, int j) {
      return c.mvals[z(((c.mb == 1 ? 0 : b) * c.ms + i) * c.ms + j)] * coeff;
    };
  if (c.mk == 3)  // the tile expanded: hidden blocks above the diagonal
    r.mask = [coeff, hidden](int, int i, int j) {
      if (j / 128 > i / 128) return -static_cast<double>(INFINITY);
      return j / 128 == i / 128 && j > i ? hidden * coeff : 0.0;
    };
  std::vector<std::vector<i8>> rq, rk, rv;
  Index t0 = 0;
  for (Index l : c.seq) {
    rq.emplace_back(c.q.begin() + t0 * c.nh * c.d, c.q.begin() + (t0 + l) * c.nh * c.d);
    rk.emplace_back(c.k.begin() + t0 * c.nkv * c.d, c.k.begin() + (t0 + l) * c.nkv * c.d);
    rv.emplace_back();
    for (Index t = t0; t < t0 + l; ++t)
      for (Index h = 0; h < c.nkv; ++h)
        for (Index e = 0; e < c.dv; ++e)  // MLA: V is the first dv elements of each K head
          rv.back().push_back(c.mla ? c.k[z((t * c.nkv + h) * c.d + e)]
                                    : c.v[z((t * c.nkv + h) * c.dv + e)]);
    t0 += l;
  }
  const ref::QuantResult want = ref::atb_qkv_quant(r, rq, rk, rv);
  size_t o = 0;
  for (size_t b = 0; b < want.out.size(); ++b)
    for (size_t i = 0; i < want.out[b].size(); ++i, ++o) {
      const size_t row = i / z(c.dv), h = row % z(c.nh);
      const double w = as_half(want.out[b][i]), got = static_cast<float>(c.o[o]);
      const double step = c.vpv[h] * (c.online ? 1.0 / 127.0 : c.ps[h]) * 128.0;
      if (!(std::fabs(got - w) <= 1e-3 + 1e-3 * std::fabs(w) + (want.tie[b][row] ? 2 * step : 0)))
        return at(o, got, w);
    }
  return "";
}

using PS = fuzz::Perturbation<Sa8>;
using Ok = bool (*)(const Sa8&);
using Edit = void (*)(Sa8&, R&);
PS must(const char* n, Ok ok, Edit e) { return fuzz::edit<Sa8>(n, true, ok, e); }
PS must(const char* n, Edit e) { return fuzz::edit<Sa8>(n, true, nullptr, e); }
bool offline(const Sa8& c) { return !c.online; }
bool tokens(const Sa8& c) { return c.tokens > 0; }
bool norm(const Sa8& c) { return c.mk == 2 && c.tokens > 0; }

const std::vector<PS>& perturbations() {
  static const std::vector<PS> list{
      must("query null", tokens, [](Sa8& c, R&) { c.in.query = V3(nullptr, c.in.query.shape()); }),
      must("key head size mismatch",
           [](Sa8& c, R&) {
             c.in.key = V3(c.k.data(), {c.tokens, c.nkv, c.d / 2});
           }),
      must("qk_descale missing", [](Sa8& c, R&) { c.in.qk_descale = {}; }),
      must("vpv_descale mis-sized",
           [](Sa8& c, R&) {
             c.vpv.push_back(0.01f);
             c.in.vpv_descale = V1(c.vpv.data(), {c.nh + 1});
           }),
      must("p_scale against the mode",
           [](Sa8& c, R&) {  // given for online, missing for offline
             c.ps.assign(c.online ? z(c.nh) : 0, 0.01f);
             c.in.p_scale = c.online ? V1(c.ps.data(), {c.nh}) : V1();
           }),
      must("p_scale not positive", offline,
           [](Sa8& c, R& r) { c.ps[z(r.range(0, c.nh - 1))] = r.chance(0.5) ? 0.0f : -0.01f; }),
      must("a descale not finite",
           [](Sa8& c, R& r) {
             (r.chance(0.5) ? c.qkd : c.vpv)[z(r.range(0, c.nh - 1))] = non_finite(r);
           }),
      must("head size not a multiple of 32",
           [](Sa8& c, R&) {
             c.in.query = V3(c.q.data(), {c.tokens, c.nh, c.d - 1});
           }),
      must("quant_type not a qkv quantization",
           [](Sa8& c, R& r) {
             const int bad[] = {-1, 0, 1, 4};  // Unquant, DequantFusion, out of range
             c.p.quant_type = static_cast<P::QuantType>(bad[r.range(0, 3)]);
           }),
      must("out_data_type mismatch",
           [](Sa8& c, R& r) {
             c.p.out_data_type =
                 r.chance(0.5) ? P::OutDataType::BFloat16 : P::OutDataType::Undefined;
           }),
      must("q_scale not 1", [](Sa8& c, R&) { c.p.q_scale = 0.5f; }),
      must("out overlaps the query", tokens,
           [](Sa8& c, R&) {  // fp16 output over the int8 query
             c.q.resize(std::max(c.q.size(), 2 * c.o.size()));
             c.in.query = V3(c.q.data(), c.in.query.shape());
             c.out = {reinterpret_cast<half*>(c.q.data()), c.out.shape()};
           }),
      must("NORM mask missing or short", norm,
           [](Sa8& c, R& r) {
             c.in.mask = {r.chance(0.5) ? nullptr : c.m.data(), {c.mb, c.ms - 1, c.ms}};
           }),
      fuzz::edit<Sa8>("reserved offsets given", false, nullptr,
                      [](Sa8& c, R&) {
                        c.offs.assign(z(c.nh), 3);
                        c.in.qk_offset = c.in.vpv_offset = {c.offs.data(), {c.nh}};
                      }),
      fuzz::edit<Sa8>("p_scale tiny: P8 saturates", false, offline,
                      [](Sa8& c, R& r) { c.ps[z(r.range(0, c.nh - 1))] = 1e-3f; }),
  };
  return list;
}

void run(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, perturbations(), build, fuzz::Named{"self_attention_int8", "self_attention"},
      [seed](Sa8& c) {
        attnref::self_attention(c.p, c.in, attnref::SelfAttentionOutputs<half>{c.out},
                                static_cast<int>(seed % 2 + 1));
      },
      verify, &Sa8::q, &Sa8::k, &Sa8::v, &Sa8::o, &Sa8::m, &Sa8::qkd, &Sa8::vpv, &Sa8::ps,
      &Sa8::offs);
}

const fuzz::Register reg("self_attention_int8", run);

}  // namespace fuzz_sa_int8
