// Fuzz entry "prompt_flash_attention_int8" (int8 q / k / v; fp16 or int8 output, per-tensor or
// per-channel quant_scale2 / quant_offset2; every layout, sparse modes 0, 2, 3, actual lengths,
// GQA, quant_block_size) against ref::cann::pfa_quant with the unit tests' tolerances.

#include <attnref/attnref.hpp>
#include <limits>

#include "fuzz/entries_int8.hpp"
#include "fuzz/fuzz.hpp"
#include "reference/cann_pfa_quant.hpp"
#include "support/views.hpp"

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

void validate_only(Pfa8& c) {
  if (c.int8_out)
    attnref::validate(c.p, c.in, attnref::PromptFlashAttentionOutputs<i8>{c.out8});
  else
    attnref::validate(c.p, c.in, attnref::PromptFlashAttentionOutputs<half>{c.out});
}

void run(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, perturbations(), build,
      fuzz::Named{"prompt_flash_attention_int8", "prompt_flash_attention"},
      [seed](Pfa8& c) {
        const int t = static_cast<int>(seed % 2 + 1);
        if (c.int8_out)
          attnref::prompt_flash_attention(c.p, c.in,
                                          attnref::PromptFlashAttentionOutputs<i8>{c.out8}, {t});
        else
          attnref::prompt_flash_attention(c.p, c.in,
                                          attnref::PromptFlashAttentionOutputs<half>{c.out}, {t});
      },
      verify, &Pfa8::q, &Pfa8::k, &Pfa8::v, &Pfa8::o, &Pfa8::o8, &Pfa8::sc, &Pfa8::qs2, &Pfa8::qo2);
}

const fuzz::Register reg("prompt_flash_attention_int8", run);

}  // namespace fuzz_pfa_int8
