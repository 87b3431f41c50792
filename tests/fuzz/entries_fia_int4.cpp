// Fuzz entry "fused_infer_attention_score_int4" (CANN FusedInferAttentionScore with int4 key /
// value, cann/detail/fia_int4.hpp): int32 key / value words each holding eight signed 4-bit
// values (value k in bits 4k..4k+3), so the last dimension is D / 8 (BSH: KV_N·D / 8). Valid
// cases: Q_S == 1 in BSH / BSND / BNSD, a half query (a third of the cases bf16), head size 64 or
// 128, GQA, kv lengths 0–40 (batches without keys), one tensor or a tensor list (one tensor of
// batch 1 per sequence), the shared prefix (int4, batch 1), IFA's [B, S'] mask and pse_shift
// sometimes, the separate antiquant in modes 0 / 0 per channel (every listed shape but the
// per-tensor (1)), 1 / 1 per token, 3 / 3 per token and head, and key 0 / value 1 (half only),
// offsets in 60 % of the cases, softmax_lse on and off, one or two threads. The rule: the int4
// call gives, bit for bit, what the same call with int8 key / value holding the unpacked values
// gives (run with the other thread count); that call is the fuzzed and reference-checked one of
// entries_fia.cpp. Every int4 rule is a perturbation: wrong word counts, Q_S 2 and the prompt
// layouts, mode pairs int4 does not take, per-tensor scales, a missing scale, the legacy
// antiquant fields, quant_scale2, kv_padding_size, block_table, head size 32, rope / sink inputs,
// huge / negative extents, null data, kv lengths past the tensor. (run_case adds validate()
// against the call, and a rerun of each valid case over strided copies of the inputs.)

#include <attnref/attnref.hpp>
#include <limits>
#include <type_traits>

#include "fuzz/fuzz.hpp"
#include "support/views.hpp"

namespace fuzz_fia_int4 {

using attnref::bfloat16;
using attnref::half;
using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;
using i8 = std::int8_t;
using i32 = std::int32_t;

constexpr float kLseSentinel = 4321.0f;
constexpr float kOutSentinel = 777.0f;

enum Store { kTensor, kList };

size_t z(Index i) { return static_cast<size_t>(i); }

template <class T>
struct Int4 {
  using Q = T;
  std::string layout;
  int store = kTensor;
  int threads = 1;
  Index B = 1, N = 1, KVN = 1, D = 64;
  Index S2 = 0;                     // the tensor's S
  Index P = 0, Ps = 0, W = 0;       // prefix rows in use / of the tensors; per-token columns
  std::vector<Index> kv_len, kv_s;  // per batch; kv_s: each list tensor's S
  std::vector<T> q, o, pse, aqs;    // aqs: the legacy antiquant_scale or rope (perturbations)
  std::vector<float> lse, ks, ko, vs, vo, spare;
  std::vector<i8> k8, v8, pk8, pv8;  // the values, one a byte (the int8 twin's key / value)
  std::vector<i32> k, v, pk, pv;     // the same values packed eight to a word
  std::vector<i32> spare32, table;
  std::vector<std::uint8_t> mask;
  std::vector<std::int64_t> pad;
  attnref::FusedInferAttentionScoreParams p;
  attnref::FusedInferAttentionScoreInputs<T, i32> in;
  StridedView<T> out;
  StridedView<float> lse_out;
};

// The vendor shape of a (B, S, heads, width) tensor in the layout.
std::vector<Index> shape(const std::string& layout, Index B, Index S, Index n, Index w) {
  if (layout == "BSH") return {B, S, n * w};
  if (layout == "BNSD") return {B, n, S, w};
  return {B, S, n, w};
}

// The same shape in int32 words (the last dimension an eighth).
std::vector<Index> packed(std::vector<Index> s) {
  s.back() /= 8;
  return s;
}

// The last dimension every packed tensor must have.
template <class C>
Index words(const C& c) {
  return (c.layout == "BSH" ? c.KVN * c.D : c.D) / 8;
}

Index numel(const std::vector<Index>& s) {
  Index n = 1;
  for (Index e : s) n *= e;
  return n;
}

// n values in [-8, 7] (sixteen nibbles of each 64-bit draw: a case draws up to 64 K values).
std::vector<i8> values(fuzz::Rng& r, Index n) {
  std::vector<i8> x(z(n));
  std::uint64_t bits = 0;
  for (size_t i = 0; i < x.size(); ++i, bits >>= 4) {
    if (i % 16 == 0) bits = r.g();
    x[i] = static_cast<i8>(static_cast<int>(bits & 0xFu) - 8);
  }
  return x;
}

// Eight values a word, value k in bits 4k..4k+3 (at least one word: a non-null buffer).
std::vector<i32> pack(const std::vector<i8>& x) {
  std::vector<i32> w(std::max<size_t>(1, x.size() / 8), 0);
  for (size_t i = 0; i < x.size(); ++i) {
    const auto nib = static_cast<std::uint32_t>(x[i]) & 0xFu;
    w[i / 8] = static_cast<i32>(static_cast<std::uint32_t>(w[i / 8]) | nib << (4 * (i % 8)));
  }
  return w;
}

float uniform(fuzz::Rng& r, float lo, float hi) {
  return std::uniform_real_distribution<float>(lo, hi)(r.g);
}

Index max_of(const std::vector<Index>& x) {
  Index m = 0;
  for (Index e : x) m = std::max(m, e);
  return m;
}

// The key positions a mask / pse / per-token row must cover: prefix + the longest sequence.
template <class C>
Index cols(const C& c) {
  return c.P + max_of(c.kv_len);
}

// One side's separate scale (and offset): mode 0 (1, KV_N, 1, D), (1, KV_N, D) or (1, KV_N·D);
// mode 1 (1, B, W); mode 3 (B, KV_N, W).
template <class C>
void scale_side(C& c, fuzz::Rng& r, bool value, std::int64_t mode, bool offsets) {
  const Index kvn = c.KVN, D = c.D;
  std::vector<Index> s;
  if (mode == 0) {
    const std::vector<std::vector<Index>> shapes{{1, kvn, 1, D}, {1, kvn, D}, {1, kvn * D}};
    s = shapes[z(r.range(0, 2))];
  } else {
    s = mode == 1 ? std::vector<Index>{1, c.B, c.W} : std::vector<Index>{c.B, kvn, c.W};
  }
  std::vector<float>& sc = value ? c.vs : c.ks;
  std::vector<float>& off = value ? c.vo : c.ko;
  sc.clear(), off.clear();
  for (Index i = 0; i < numel(s); ++i) {
    sc.push_back(uniform(r, 0.004f, 0.024f));
    if (offsets) off.push_back(uniform(r, -8.0f, 8.0f));
  }
  (value ? c.in.value_antiquant_scale : c.in.key_antiquant_scale) =
      StridedView<const float>(sc.data(), s);
  if (offsets)
    (value ? c.in.value_antiquant_offset : c.in.key_antiquant_offset) =
        StridedView<const float>(off.data(), s);
}

template <class C>
void build(C& c, fuzz::Rng& r) {
  using T = typename C::Q;
  const char* layouts[] = {"BSH", "BSND", "BNSD"};
  c.layout = layouts[r.range(0, 2)];
  c.store = r.chance(0.4) ? kList : kTensor;
  c.threads = static_cast<int>(r.range(1, 2));
  c.B = r.range(1, 3);
  c.KVN = r.range(1, 2);
  c.N = c.KVN * r.range(1, 3);
  c.D = r.chance(0.6) ? 64 : 128;
  const Index kw = c.KVN * c.D;
  c.p.input_layout = c.layout;
  c.p.num_heads = c.N;
  c.p.num_key_value_heads = c.KVN == c.N && r.chance(0.3) ? 0 : c.KVN;
  c.p.scale_value = 1.0 / std::sqrt(static_cast<double>(c.D));
  c.p.softmax_lse_flag = r.chance(0.6);
  c.p.inner_precise = r.range(0, 1);
  for (Index b = 0; b < c.B; ++b) c.kv_len.push_back(r.chance(0.2) ? 0 : r.range(1, 40));
  const bool lens = r.chance(0.6);
  if (c.store == kTensor) {
    c.S2 = max_of(c.kv_len) + r.range(0, 2);
    if (!lens) c.kv_len.assign(z(c.B), c.S2);
    c.k8 = values(r, c.B * c.S2 * kw);
    c.v8 = values(r, c.B * c.S2 * kw);
  } else {
    for (Index b = 0; b < c.B; ++b) {
      c.kv_s.push_back(c.kv_len[z(b)] + r.range(0, 2));
      if (!lens) c.kv_len[z(b)] = c.kv_s.back();
    }
    const Index total = [&] {
      Index t = 0;
      for (Index s : c.kv_s) t += s * kw;
      return t;
    }();
    c.k8 = values(r, total);
    c.v8 = values(r, total);
  }
  c.k = pack(c.k8);
  c.v = pack(c.v8);
  if (c.store == kTensor) {
    const std::vector<Index> s = packed(shape(c.layout, c.B, c.S2, c.KVN, c.D));
    c.in.key.emplace_back(c.k.data(), s);
    c.in.value.emplace_back(c.v.data(), s);
  } else {
    Index base = 0;  // in words
    for (Index b = 0; b < c.B; ++b) {
      const std::vector<Index> s = packed(shape(c.layout, 1, c.kv_s[z(b)], c.KVN, c.D));
      c.in.key.emplace_back(c.k.data() + base, s);
      c.in.value.emplace_back(c.v.data() + base, s);
      base += numel(s);
    }
  }
  if (lens) {
    c.in.actual_seq_lengths_kv.assign(c.kv_len.begin(), c.kv_len.end());
    const bool same =
        std::all_of(c.kv_len.begin(), c.kv_len.end(), [&](Index l) { return l == c.kv_len[0]; });
    if (same && r.chance(0.3)) c.in.actual_seq_lengths_kv.resize(1);  // one value broadcasts
  }
  if (c.store == kTensor && r.chance(0.3)) {  // the shared prefix: Ps rows, the first P in use
    c.P = r.chance(0.15) ? 0 : r.range(1, 6);
    c.Ps = std::max<Index>(1, c.P + r.range(0, 2));
    c.pk8 = values(r, c.Ps * kw);
    c.pv8 = values(r, c.Ps * kw);
    c.pk = pack(c.pk8);
    c.pv = pack(c.pv8);
    const std::vector<Index> s = packed(shape(c.layout, 1, c.Ps, c.KVN, c.D));
    c.in.key_shared_prefix = StridedView<const i32>(c.pk.data(), s);
    c.in.value_shared_prefix = StridedView<const i32>(c.pv.data(), s);
    if (c.P != c.Ps || r.chance(0.3)) c.in.actual_shared_prefix_len = {c.P};
  }
  if (r.chance(0.25)) {  // IFA's mask [B, S'] (or its rank-3 / rank-4 forms), S' >= the columns
    const Index m = cols(c) + r.range(0, 2);
    c.mask.assign(z(std::max<Index>(1, c.B * m)), 0);
    for (auto& e : c.mask) e = r.chance(0.25) ? 1 : 0;
    const Index rank = r.range(2, 4);
    c.in.atten_mask = StridedView<const std::uint8_t>(
        c.mask.data(), rank == 2   ? std::vector<Index>{c.B, m}
                       : rank == 3 ? std::vector<Index>{c.B, 1, m}
                                   : std::vector<Index>{c.B, 1, 1, m});
  }
  if (r.chance(0.2)) {  // pse_shift [B or 1, N, 1, >= the columns]
    const Index pb = r.chance(0.5) ? 1 : c.B, m = cols(c) + r.range(0, 2);
    c.pse = r.normals<T>(std::max<Index>(1, pb * c.N * m));
    c.in.pse_shift = StridedView<const T>(c.pse.data(), {pb, c.N, 1, m});
  }
  // The separate antiquant: 0 / 0, 1 / 1, 3 / 3, or (half) key 0 / value 1.
  c.W = cols(c) + r.range(0, 2);
  const Index pair = r.range(0, std::is_same_v<T, half> ? 3 : 2);
  c.p.key_antiquant_mode = pair == 0 || pair == 3 ? 0 : pair == 1 ? 1 : 3;
  c.p.value_antiquant_mode = pair == 0 ? 0 : pair == 2 ? 3 : 1;
  const bool offsets = r.chance(0.6);
  scale_side(c, r, false, c.p.key_antiquant_mode, offsets);
  scale_side(c, r, true, c.p.value_antiquant_mode, offsets);
  c.q = r.normals<T>(c.B * c.N * c.D);
  c.o.assign(c.q.size(), T(kOutSentinel));
  c.in.query = StridedView<const T>(c.q.data(), shape(c.layout, c.B, 1, c.N, c.D));
  c.out = StridedView<T>(c.o.data(), c.in.query.shape());
  c.lse.assign(z(c.B * c.N), kLseSentinel);
  if (c.p.softmax_lse_flag || r.chance(0.5))  // flag off: given (never written) or absent
    c.lse_out = StridedView<float>(c.lse.data(), {c.B, c.N, 1, 1});
}

// ---- The int8 twin -----------------------------------------------------------------------------

// The int8 view of the values a packed view (into `w`) holds: the same place in `x`.
StridedView<const i8> twin_view(const StridedView<const i32>& v, const std::vector<i32>& w,
                                const std::vector<i8>& x) {
  if (v.absent()) return {};
  attnref::Dims s = v.shape();
  s[s.size() - 1] *= 8;
  return StridedView<const i8>(x.data() + (v.data() - w.data()) * 8, s);
}

// An output view's place in `to` (a buffer of the size of `from`, which the view is over).
template <class X>
StridedView<X> moved(const StridedView<X>& v, const std::vector<X>& from, std::vector<X>& to) {
  if (v.absent()) return {};
  return StridedView<X>(to.data() + (v.data() - from.data()), v.shape(), v.strides());
}

// The same call with int8 key / value (and prefix) holding the unpacked values, into fresh
// sentinel-filled outputs, with the other thread count: both outputs must have the int4 call's
// bits.
template <class C>
std::string verify(const C& c) {
  using T = typename C::Q;
  attnref::FusedInferAttentionScoreInputs<T, i8> t;
  for (const auto& v : c.in.key) t.key.push_back(twin_view(v, c.k, c.k8));
  for (const auto& v : c.in.value) t.value.push_back(twin_view(v, c.v, c.v8));
  t.key_shared_prefix = twin_view(c.in.key_shared_prefix, c.pk, c.pk8);
  t.value_shared_prefix = twin_view(c.in.value_shared_prefix, c.pv, c.pv8);
  t.query = c.in.query;
  t.pse_shift = c.in.pse_shift;
  t.atten_mask = c.in.atten_mask;
  t.actual_seq_lengths = c.in.actual_seq_lengths;
  t.actual_seq_lengths_kv = c.in.actual_seq_lengths_kv;
  t.key_antiquant_scale = c.in.key_antiquant_scale;
  t.key_antiquant_offset = c.in.key_antiquant_offset;
  t.value_antiquant_scale = c.in.value_antiquant_scale;
  t.value_antiquant_offset = c.in.value_antiquant_offset;
  t.actual_shared_prefix_len = c.in.actual_shared_prefix_len;
  std::vector<T> o8(c.o.size(), T(kOutSentinel));
  std::vector<float> l8(c.lse.size(), kLseSentinel);
  const attnref::FusedInferAttentionScoreOutputs<T> o{moved(c.out, c.o, o8),
                                                      moved(c.lse_out, c.lse, l8)};
  try {
    attnref::fused_infer_attention_score(c.p, t, o, {3 - c.threads});
  } catch (const std::exception& e) {
    return std::string("the int8 twin rejected the call: ") + e.what();
  }
  if (!fuzz::same_bits(c.o, o8)) return "attention_out differs from int8 key / value";
  if (!fuzz::same_bits(c.lse, l8)) return "softmax_lse differs from int8 key / value";
  if (!c.p.softmax_lse_flag)
    for (float x : c.lse)
      if (!(x == kLseSentinel)) return "softmax_lse written with softmax_lse_flag off";
  return "";
}

// ---- Perturbations -----------------------------------------------------------------------------

template <class C>
bool is_list(const C& c) {
  return c.store == kList && c.B > 1;
}
template <class C>
bool has_prefix(const C& c) {
  return !c.in.key_shared_prefix.absent();
}
template <class C>
bool has_flag(const C& c) {
  return c.p.softmax_lse_flag;
}
template <class C>
bool has_offsets(const C& c) {
  return !c.in.key_antiquant_offset.absent();
}

// At least n floats (0.01) in c.spare (one call per edit: the next one moves the buffer).
template <class C>
const float* spare(C& c, Index n) {
  c.spare.assign(z(std::max<Index>(n, 1)), 0.01f);
  return c.spare.data();
}

// Every packed view of the call: key / value (each list element) and the prefix.
template <class C>
std::vector<StridedView<const i32>*> packed_views(C& c) {
  std::vector<StridedView<const i32>*> all;
  for (auto& v : c.in.key) all.push_back(&v);
  for (auto& v : c.in.value) all.push_back(&v);
  if (has_prefix(c)) all.push_back(&c.in.key_shared_prefix);
  if (has_prefix(c)) all.push_back(&c.in.value_shared_prefix);
  return all;
}

// One of `list`, at random.
template <class X>
X pick(fuzz::Rng& r, const std::vector<X>& list) {
  return list[z(r.range(0, static_cast<Index>(list.size()) - 1))];
}

// An output view with another shape, over a buffer large enough for it.
template <class C>
void regrow_out(C& c, const std::vector<Index>& s) {
  using T = typename C::Q;
  if (c.o.size() < z(numel(s))) c.o.resize(z(numel(s)), T(kOutSentinel));
  c.out = StridedView<T>(c.o.data(), s);
}

// The int4 rules (cann/detail/fia_int4.hpp).
template <class C>
std::vector<fuzz::Perturbation<C>> int4_edits() {
  using T = typename C::Q;
  return {
      fuzz::edit<C>("packed key / value / prefix with a wrong word count", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      StridedView<const i32>& v = *pick(r, packed_views(c));
                      const Index w = words(c);
                      attnref::Dims s = v.shape();
                      s[s.size() - 1] = pick(r, std::vector<Index>{w - 1, w + 1, 8 * w, w / 2});
                      std::vector<Index> sv(s.begin(), s.end());
                      c.spare32.assign(z(std::max<Index>(1, numel(sv))), 0x12345678);
                      v = StridedView<const i32>(c.spare32.data(), s);
                    }),
      fuzz::edit<C>("query with Q_S 2", true, nullptr,
                    [](C& c, fuzz::Rng&) {
                      c.q.resize(c.q.size() * 2, T(0.5f));
                      c.in.query =
                          StridedView<const T>(c.q.data(), shape(c.layout, c.B, 2, c.N, c.D));
                      regrow_out(c, shape(c.layout, c.B, 2, c.N, c.D));
                      c.lse.assign(c.lse.size() * 2, kLseSentinel);
                      if (!c.lse_out.absent())
                        c.lse_out = StridedView<float>(c.lse.data(), {c.B, c.N, 2, 1});
                    }),
      fuzz::edit<C>("a layout of the prompt branch (TND, NTD_TND, BNSD_BSND)", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      c.p.input_layout = c.layout == "BSH"
                                             ? (r.chance(0.5) ? "TND" : "NTD_TND")
                                             : (r.chance(0.5) ? "BNSD_BSND" : "NTD_TND");
                    }),
      fuzz::edit<C>("a mode pair int4 does not take", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      const std::int64_t pairs[][2] = {{2, 2}, {4, 4},   {5, 5}, {1, 0},
                                                       {0, 3}, {3, 0},   {1, 3}, {3, 1},
                                                       {0, 2}, {-1, -1}, {6, 6}, {2, 1}};
                      const auto* pr = pairs[r.range(0, 11)];
                      c.p.key_antiquant_mode = pr[0];
                      c.p.value_antiquant_mode = pr[1];
                    }),
      fuzz::edit<C>(
          "a per-tensor scale (1) in mode 0", true,
          [](const C& c) { return c.p.key_antiquant_mode == 0 || c.p.value_antiquant_mode == 0; },
          [](C& c, fuzz::Rng& r) {
            const float* s = spare(c, 2);
            const bool key =
                c.p.key_antiquant_mode == 0 && (c.p.value_antiquant_mode != 0 || r.chance(0.5));
            (key ? c.in.key_antiquant_scale : c.in.value_antiquant_scale) =
                StridedView<const float>(s, {1});
            auto& off = key ? c.in.key_antiquant_offset : c.in.value_antiquant_offset;
            if (!off.absent()) off = StridedView<const float>(s + 1, {1});
          }),
      fuzz::edit<C>("a separate scale missing (or both)", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      const Index side = r.range(0, 2);
                      if (side != 1) c.in.key_antiquant_scale = {};
                      if (side != 0) c.in.value_antiquant_scale = {};
                      if (side == 2 && r.chance(0.5))
                        c.in.key_antiquant_offset = c.in.value_antiquant_offset = {};
                    }),
      fuzz::edit<C>("one separate offset without the other", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      const bool value = r.chance(0.5);
                      auto& off = value ? c.in.value_antiquant_offset : c.in.key_antiquant_offset;
                      const auto& sc =
                          value ? c.in.value_antiquant_scale : c.in.key_antiquant_scale;
                      if (!off.absent())
                        off = {};
                      else
                        off = StridedView<const float>(spare(c, sc.numel()), sc.shape());
                    }),
      fuzz::edit<C>("the legacy antiquant fields beside the separate scales", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      const Index kw = c.KVN * c.D, how = r.range(0, 2);
                      c.aqs.assign(z(2 * kw), T(0.01f));
                      const StridedView<const T> a(c.aqs.data(), {2, kw});
                      const StridedView<const float> t(spare(c, 2 * c.B * c.W), {2, c.B, c.W});
                      if (how == 0) c.in.antiquant_scale = a;
                      if (how == 1) c.in.antiquant_offset = a;
                      if (how == 2) c.p.antiquant_mode = 1, c.in.antiquant_scale_per_token = t;
                    }),
      fuzz::edit<C>("quant_scale2 / quant_offset2 (int8 output)", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      const StridedView<const float> s(spare(c, 1), {1});
                      (r.chance(0.5) ? c.in.quant_scale2 : c.in.quant_offset2) = s;
                    }),
      fuzz::edit<C>("kv_padding_size", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      c.pad.assign(1, r.range(0, 1));
                      c.in.kv_padding_size = StridedView<const std::int64_t>(c.pad.data(), {1});
                    }),
      fuzz::edit<C>("block_table", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      c.table.assign(z(c.B), 0);
                      c.in.block_table = StridedView<const i32>(c.table.data(), {c.B, 1});
                      if (r.chance(0.5)) c.p.block_size = 16;
                    }),
      fuzz::edit<C>("head size 32 (query heads split in two or four)", true, nullptr,
                    [](C& c, fuzz::Rng&) {  // (key / value and softmax_lse left as they are)
                      const Index f = c.D / 32;
                      c.p.num_heads = c.N * f;
                      c.p.num_key_value_heads = c.KVN * f;
                      const std::vector<Index> s = shape(c.layout, c.B, 1, c.N * f, 32);
                      c.in.query = StridedView<const T>(c.q.data(), s);
                      c.out = StridedView<T>(c.o.data(), s);
                    }),
      fuzz::edit<C>(
          "separate key 0 / value 1 with a bf16 query", true,
          [](const C&) { return std::is_same_v<T, bfloat16>; },
          [](C& c, fuzz::Rng&) {
            const Index kw = c.KVN * c.D;
            const float* s = spare(c, kw + c.B * c.W);
            c.p.key_antiquant_mode = 0;
            c.p.value_antiquant_mode = 1;
            c.in.key_antiquant_scale = StridedView<const float>(s, {1, kw});
            c.in.value_antiquant_scale = StridedView<const float>(s + kw, {1, c.B, c.W});
            c.in.key_antiquant_offset = c.in.value_antiquant_offset = {};
          }),
      fuzz::edit<C>(
          "per-token scales with too few columns", true,
          [](const C& c) { return c.p.value_antiquant_mode != 0 && cols(c) > 0; },
          [](C& c, fuzz::Rng&) {  // the value's (and the key's when per token too)
            const Index w = cols(c) - 1;
            const bool head = c.p.value_antiquant_mode == 3;
            const std::vector<Index> s =
                head ? std::vector<Index>{c.B, c.KVN, w} : std::vector<Index>{1, c.B, w};
            c.in.value_antiquant_scale = StridedView<const float>(c.vs.data(), s);
            if (has_offsets(c))
              c.in.value_antiquant_offset = StridedView<const float>(c.vo.data(), s);
            if (c.p.key_antiquant_mode == 0) return;
            c.in.key_antiquant_scale = StridedView<const float>(c.ks.data(), s);
            if (has_offsets(c))
              c.in.key_antiquant_offset = StridedView<const float>(c.ko.data(), s);
          }),
      fuzz::edit<C>("query_rope / key_rope or learnable_sink (MLA / TND only)", true, nullptr,
                    [](C& c, fuzz::Rng& r) {  // rope: the query's and key's shapes, head size 64
                      c.aqs.assign(z(c.B * std::max(c.N, c.KVN) * std::max<Index>(c.S2, 1) * 64),
                                   T(0.5f));
                      const std::vector<Index> qs = shape(c.layout, c.B, 1, c.N, 64);
                      const std::vector<Index> ks = shape(c.layout, c.B, c.S2, c.KVN, 64);
                      if (r.chance(0.3)) {
                        static const bfloat16 sink[6] = {};
                        c.in.learnable_sink = StridedView<const bfloat16>(sink, {c.N});
                      } else {
                        c.in.query_rope = StridedView<const T>(c.aqs.data(), qs);
                        if (c.store == kTensor)
                          c.in.key_rope = StridedView<const T>(c.aqs.data(), ks);
                      }
                    }),
      fuzz::edit<C>("inner_precise 2 or 3 (Q_S == 1)", true, nullptr,
                    [](C& c, fuzz::Rng& r) { c.p.inner_precise = r.range(2, 3); }),
  };
}

// Extents, data and lengths.
template <class C>
std::vector<fuzz::Perturbation<C>> view_edits() {
  return {
      fuzz::edit<C>("packed view size overflows", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      StridedView<const i32>& v = *pick(r, packed_views(c));
                      v = support::resized(support::resized(v, 0, kHuge), 1, kHuge);
                    }),
      fuzz::edit<C>("packed view of a huge extent (past the int8 stand-in's limit)", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      StridedView<const i32>& v = *pick(r, packed_views(c));
                      v = support::resized(v, static_cast<int>(r.range(0, v.rank() - 2)), kHuge);
                    }),
      fuzz::edit<C>("packed view with a negative extent", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      StridedView<const i32>& v = *pick(r, packed_views(c));
                      const int d = static_cast<int>(r.range(0, v.rank() - 1));
                      v = support::resized(v, d, -v.size(d) - 1);
                    }),
      fuzz::edit<C>("query or a scale with a negative extent", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      if (r.chance(0.5)) {
                        const int d = static_cast<int>(r.range(0, c.in.query.rank() - 1));
                        c.in.query = support::resized(c.in.query, d, -2);
                      } else {
                        auto& s =
                            r.chance(0.5) ? c.in.key_antiquant_scale : c.in.value_antiquant_scale;
                        s = support::resized(s, static_cast<int>(r.range(0, s.rank() - 1)), -1);
                      }
                    }),
      fuzz::edit<C>(
          "packed key / value / prefix with null data", true,
          [](const C& c) {  // (the prefix has a row at least)
            const auto full = [](const StridedView<const i32>& v) { return v.numel() > 0; };
            return has_prefix(c) || std::any_of(c.in.key.begin(), c.in.key.end(), full) ||
                   std::any_of(c.in.value.begin(), c.in.value.end(), full);
          },
          [](C& c, fuzz::Rng& r) {
            std::vector<StridedView<const i32>*> full;
            for (auto* v : packed_views(c))
              if (v->numel() > 0) full.push_back(v);
            StridedView<const i32>& v = *pick(r, full);
            v = support::with_data<const i32>(v, nullptr);
          }),
      fuzz::edit<C>(
          "a scale with null data", true,
          [](const C& c) {  // (per token: W > 0)
            return c.in.key_antiquant_scale.numel() > 0 && c.in.value_antiquant_scale.numel() > 0;
          },
          [](C& c, fuzz::Rng& r) {
            auto& s = r.chance(0.5) ? c.in.key_antiquant_scale : c.in.value_antiquant_scale;
            s = support::with_data<const float>(s, nullptr);
          }),
      fuzz::edit<C>("query absent", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      c.in.query = {};
                      if (r.chance(0.3)) c.p.input_layout = "NTD_TND";
                    }),
      fuzz::edit<C>("kv lengths past the tensor", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      const Index b = r.range(0, c.B - 1);
                      const Index s = c.store == kList ? c.kv_s[z(b)] : c.S2;
                      c.in.actual_seq_lengths_kv.assign(c.kv_len.begin(), c.kv_len.end());
                      c.in.actual_seq_lengths_kv[z(b)] = s + r.range(1, 2);
                    }),
      fuzz::edit<C>("kv lengths negative or huge", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      c.in.actual_seq_lengths_kv.assign(c.kv_len.begin(), c.kv_len.end());
                      c.in.actual_seq_lengths_kv[z(r.range(0, c.B - 1))] =
                          pick(r, std::vector<std::int64_t>{
                                      -1, kHuge, std::numeric_limits<std::int64_t>::max()});
                    }),
      fuzz::edit<C>("tensor list shorter than the batch", true, is_list<C>,
                    [](C& c, fuzz::Rng&) {
                      c.in.key.pop_back();
                      c.in.value.pop_back();
                    }),
      fuzz::edit<C>("key / value lists of different lengths", true, nullptr,
                    [](C& c, fuzz::Rng&) { c.in.value.push_back(c.in.value.back()); }),
      fuzz::edit<C>("shared prefix with a tensor list", true, is_list<C>,
                    [](C& c, fuzz::Rng&) {
                      const std::vector<Index> s = packed(shape(c.layout, 1, 2, c.KVN, c.D));
                      c.pk.assign(z(numel(s)), 0);
                      c.pv.assign(z(numel(s)), 0);
                      c.in.key_shared_prefix = StridedView<const i32>(c.pk.data(), s);
                      c.in.value_shared_prefix = StridedView<const i32>(c.pv.data(), s);
                    }),
      fuzz::edit<C>("key_shared_prefix without value_shared_prefix (or the reverse)", true,
                    has_prefix<C>,
                    [](C& c, fuzz::Rng& r) {
                      (r.chance(0.5) ? c.in.key_shared_prefix : c.in.value_shared_prefix) = {};
                    }),
      fuzz::edit<C>("num_heads out of range or not a multiple of num_key_value_heads", true,
                    nullptr,
                    [](C& c, fuzz::Rng& r) {
                      c.p.num_heads =
                          pick(r, std::vector<std::int64_t>{0, -1, 257, kHuge, c.KVN == 2 ? 3 : 0});
                    }),
      fuzz::edit<C>("softmax_lse shape mismatch or missing with the flag", true, has_flag<C>,
                    [](C& c, fuzz::Rng& r) {
                      if (r.chance(0.3)) {
                        c.lse_out = {};
                        return;
                      }
                      c.lse.resize(c.lse.size() + z(c.N), kLseSentinel);
                      c.lse_out = StridedView<float>(
                          c.lse.data(), r.chance(0.5) ? std::vector<Index>{c.B, c.N, 1}
                                                      : std::vector<Index>{c.B + 1, c.N, 1, 1});
                    }),
      fuzz::edit<C>("attention_out shape mismatch", true, nullptr,
                    [](C& c, fuzz::Rng&) {
                      const attnref::Dims os = c.out.shape();
                      std::vector<Index> s(os.begin(), os.end());
                      s.back() += 1;
                      regrow_out(c, s);
                    }),
      fuzz::edit<C>(
          "softmax_lse strided", false, has_flag<C>,
          [](C& c, fuzz::Rng&) {  // every other float, the gaps left alone
            c.lse.assign(c.lse.size() * 2, kLseSentinel);
            c.lse_out = StridedView<float>(c.lse.data(), {c.B, c.N, 1, 1}, {2 * c.N, 2, 2, 2});
          }),
      fuzz::edit<C>(
          "softmax_lse of any shape with the flag off", false,
          [](const C& c) { return !c.p.softmax_lse_flag; },
          [](C& c, fuzz::Rng&) {
            c.lse.resize(c.lse.size() + 3, kLseSentinel);
            c.lse_out = StridedView<float>(c.lse.data(), {static_cast<Index>(c.lse.size())});
          }),
  };
}

template <class C>
const std::vector<fuzz::Perturbation<C>>& perturbations() {
  static const std::vector<fuzz::Perturbation<C>> list = [] {
    std::vector<fuzz::Perturbation<C>> all = int4_edits<C>();
    for (auto& e : view_edits<C>()) all.push_back(e);
    return all;
  }();
  return list;
}

template <class C>
void invoke(C& c, bool run) {
  const attnref::FusedInferAttentionScoreOutputs<typename C::Q> o{c.out, c.lse_out};
  if (run)
    attnref::fused_infer_attention_score(c.p, c.in, o, {c.threads});
  else
    attnref::validate(c.p, c.in, o);
}

template <class C>
void validate_only(C& c) {
  invoke(c, false);
}

template <class C>
void restride_inputs(C& c, support::Restrider& r) {
  c.in.for_each_view([&](const std::string& name, auto& view) { r(name, view); });
}

template <class T>
void run_t(fuzz::Run& run, std::uint64_t seed) {
  using C = Int4<T>;
  fuzz::run_case(
      run, seed, perturbations<C>(), build<C>,
      fuzz::Named{"fused_infer_attention_score_int4", "fused_infer_attention_score"},
      [](C& c) { invoke(c, true); }, verify<C>, &C::q, &C::k, &C::v, &C::pk, &C::pv, &C::o, &C::lse,
      &C::pse, &C::aqs, &C::ks, &C::ko, &C::vs, &C::vo, &C::spare, &C::spare32, &C::table, &C::mask,
      &C::pad);
}

// Two thirds of the cases with a half query, a third bf16.
void run(fuzz::Run& run, std::uint64_t seed) {
  if (seed % 3 == 2) return run_t<bfloat16>(run, seed);
  run_t<half>(run, seed);
}

const fuzz::Register reg("fused_infer_attention_score_int4", run);

}  // namespace fuzz_fia_int4
