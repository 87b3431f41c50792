// Fuzz entry "fused_infer_attention_score" (CANN FusedInferAttentionScore) against the naive
// reference, over four query / key-value type pairs: half / half, bf16 / bf16, and int8 K/V with a
// half or bf16 query (the incremental branch's antiquant; in 30 % of those cases the prompt
// branch's, see below). The incremental branch (Q_S == 1 in BSH / BSND / BNSD over one K/V tensor,
// one tensor per batch or a shuffled paged cache with block_table; IFA's [B, S'] masks) and the
// prompt branch (Q_S > 1 in BSH / BSND / BNSD / BNSD_BSND, and TND with any T; user masks, sparse
// modes 0–4, inner_precise 0–3, padded rows), GQA, actual lengths (batches without keys),
// softmax_lse on and off. With the flag, softmax_lse is the reference's ln Σ exp(scale·q·k + pse)
// over the row's visible keys, +inf for a prompt row without keys or a padded row, -3.40e38 for an
// incremental batch without keys, and the fill value for a row whose visible keys are all masked
// (-FLT_MAX prompt, -1e12 + ln n incremental); without it, softmax_lse is never written. TND cases
// sometimes carry V4's learnable sink (head size 64 or 128): exp(sink_h) joins each row's
// denominator, not lse. The V2 features: pse_shift in both branches (added after scaling; NaN where
// no row may read it); int8 K/V dequantized as (x8 + offset)·scale by the combined antiquant
// (antiquant_mode 0 in the query's type, every listed shape; antiquant_mode 1 per token) or the
// separate K / V antiquant (modes 0–5 and key 0 / value 1 with a half query), per-token columns
// past a batch's keys NaN; the shared prefix in both branches (BSH / BSND / BNSD, and BNSD_BSND
// with Q_S > 1): the reference puts prefix rows [0, P) in front of every sequence's keys (mask, pse
// and per-token columns [0, P) are the prefix's, causal anchors at the end of prefix + keys), the
// rows past P NaN. The separate antiquant's per-token modes 3 (B, KV_N, W), 4 (blockNum,
// blockSize) and 5 (blockNum, KV_N, blockSize) (4 and 5 over a paged cache: a key's scale in its
// block and row): the reference dequantizes each key / value by its (batch, head, position) scale,
// NaN in every slot no used key maps to. Paged K/V with Q_S > 1 (every prompt layout; caches
// [blockNum, bs, KV_N·D] or, BNSD / BNSD_BSND / TND, [blockNum, KV_N, bs, D]; blocks of 128 or 256,
// kv lengths up to a few hundred, per batch even with TND; masks and pse covering ceil(longest /
// bs)·bs keys): the reference reads key t of batch b from the block the table names, NaN in every
// row no sequence owns. int8 K/V with Q_S > 1 (cann/detail/fia_prompt_aq.hpp; one K/V tensor in
// BSH / BSND / BNSD / BNSD_BSND, Dv = D, no prefix; the prompt branch's masks, sparse modes, pse,
// lengths and lse): a half query with the combined antiquant_scale (antiquant_mode 0, fp16 (2) or
// the layout's per-channel shape, D 32 or 64), a bf16 query with the separate scales (Q_S up to
// 16; modes 0 / 0 in (KV_N, D), (KV_N, 1, D) or (KV_N·D), or 1 / 1 in (B, W >= the key's S)).
// Left padding with Q_S > 1 (cann/detail/fia_parts.hpp, fia_left_padding; a quarter of the
// prompt cases in BSH / BSND / BNSD / BNSD_BSND over one K/V tensor without a paged cache, prefix
// or separate scales, fp16 / bf16 or int8 K/V with the combined scales): query_padding_size and /
// or kv_padding_size ([1] or [], values from the slack down to 0 and negative ones, counted as 0;
// each with its actual lengths), a few spare rows; batch b's query rows [S1 - pad - qlen_b,
// S1 - pad) and keys [S2 - kvpad - kvlen_b, S2 - kvpad) hold the data, every other row poison. The
// reference reads the user mask and pse at those padded positions (pse NaN outside the windows),
// anchors the diagonals of sparse modes 2–4 in the windows, ignores pre / next tokens with sparse
// mode 0, and wants 0 (lse +inf) in every row outside a window. With Q_S == 1 query_padding_size
// is ignored (a perturbation).
// Every rejection the headers document for these features is a perturbation.

#include <attnref/attnref.hpp>
#include <cfloat>
#include <limits>
#include <type_traits>

#include "fuzz/fuzz.hpp"
#include "reference/cann_flash_attention.hpp"
#include "reference/naive_attention.hpp"
#include "support/views.hpp"

namespace fuzz_fia {

using attnref::bfloat16;
using attnref::half;
using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;
using i8 = std::int8_t;

constexpr float kLseSentinel = 4321.0f;
constexpr float kOutSentinel = 777.0f;
constexpr double kIncreEmpty = static_cast<double>(-3.40e38f);  // an incremental batch, no keys
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

enum Store { kTensor, kList, kPaged };  // the K/V (kList: Q_S == 1 only)
// int8 K/V's antiquant: antiquant_scale (antiquant_mode 0), antiquant_scale_per_token
// (antiquant_mode 1), or the separate key_ / value_antiquant_* tensors.
enum Aq { kNoAq, kCombined, kCombinedToken, kSeparate };

size_t z(Index i) { return static_cast<size_t>(i); }

float uniform(fuzz::Rng& r, float lo, float hi) {
  return std::uniform_real_distribution<float>(lo, hi)(r.g);
}

// One of `list`, at random.
template <class X>
const X& pick(fuzz::Rng& r, const std::vector<X>& list) {
  return list[z(r.range(0, static_cast<Index>(list.size()) - 1))];
}

// A random value: normal for a floating type, [-128, 127] for int8.
template <class X>
X one(fuzz::Rng& r) {
  if constexpr (std::is_same_v<X, i8>)
    return static_cast<i8>(r.range(-128, 127));
  else
    return X(r.normal());
}

// n random values: normal for a floating type, [-128, 127] for int8.
template <class X>
std::vector<X> draw(fuzz::Rng& r, Index n) {
  std::vector<X> x(z(n));
  for (X& e : x) e = one<X>(r);
  return x;
}

// What an element no one may read holds: NaN (reading it shows), or -128 for int8.
template <class X>
X poison() {
  if constexpr (std::is_same_v<X, i8>)
    return X(-128);
  else
    return X(kNaN);
}

template <class X>
double dbl(X x) {
  return static_cast<double>(static_cast<float>(x));
}

// One side's (key's or value's) dequantization as the reference applies it: (x8 + offset)·scale,
// per channel (index h·D + e) or per token (index (b·heads + head)·W + position; heads 1: every kv
// head alike). Offset empty: none.
struct Deq {
  bool token = false;
  Index heads = 1;
  std::vector<double> scale, offset;
};

template <class T, class K>
struct Fia {
  using Q = T;
  using KV = K;
  static constexpr bool kQuant = std::is_same_v<K, i8>;
  bool incre = false;  // Q_S == 1 in BSH / BSND / BNSD
  std::string layout;
  int store = kTensor;
  bool paged4 = false;  // BNSD paged cache [nb, KV_N, bs, D]
  Index B = 1, S1 = 1, S2 = 0, N = 1, KVN = 1, D = 1, Dv = 1;
  Index bs = 16, nb = 0, mb = 0;     // paged: block size, blocks, table columns
  std::vector<Index> q_len, kv_len;  // per batch (kv: without the prefix)
  std::vector<Index> kv_s, kv_base;  // tensor list: each tensor's S and element offset
  bool user_mask = false, compressed = false;
  Index m_b = 1, m_s1 = 1, m_s2 = 0;        // the user mask as [m_b][m_s1][m_s2] (incre: m_s1 = 1)
  Index P = 0, Ps = 0;                      // the shared prefix: rows in use, rows of its tensors
  Index pse_b = 0, pse_s1 = 0, pse_s2 = 0;  // pse_shift [pse_b][N][pse_s1][pse_s2]; 0: none
  int aq = kNoAq;
  Index W = 0;                         // per-token scale columns
  Deq dk, dv;                          // the reference's dequantization of int8 K and V
  std::vector<T> q, o, pse, aqs, aqo;  // aqs / aqo: antiquant_scale / antiquant_offset
  std::vector<K> k, v, pk, pv;         // pk / pv: key_ / value_shared_prefix
  std::vector<float> lse, tok_s, tok_o, ks, ko, vs, vo, spare;  // spare: bad-shape views
  std::vector<std::uint8_t> mask;
  std::vector<std::int32_t> table;
  std::vector<bfloat16> sink;  // learnable_sink (TND, D = Dv = 64 or 128)
  // Left padding (Q_S > 1): the values of query_padding_size ([0], [1]) and kv_padding_size
  // ([2], [3]; two each for the [2]-shaped perturbation), and the pads in effect (negative
  // values 0; -1: no tensor).
  std::vector<std::int64_t> pads;
  Index qpad = -1, kvpad = -1;
  bool int8_query = false;  // the probe: the same call with int8 query / key / value
  std::vector<i8> q8, k8, v8, p8;
  attnref::FusedInferAttentionScoreParams p;
  attnref::FusedInferAttentionScoreInputs<T, K> in;
  StridedView<T> out;
  StridedView<float> lse_out;
  Index lse_step = 1;              // softmax_lse element i at lse[i * lse_step] (2: a strided view)
  bool want_out_of_range = false;  // the perturbation must raise std::out_of_range
};

// The 2048 x 2048 compressed mask of sparse modes 2–4 (content not read).
const std::uint8_t* compressed_mask() {
  static const std::vector<std::uint8_t> m(2048 * 2048, 0);
  return m.data();
}

// The vendor shape of a (B, S, heads, width) tensor in the layout (TND: S = total tokens).
std::vector<Index> shape(const std::string& layout, Index B, Index S, Index n, Index w) {
  if (layout == "BSH") return {B, S, n * w};
  if (layout == "BNSD" || layout == "BNSD_BSND") return {B, n, S, w};
  if (layout == "TND") return {S, n, w};
  return {B, S, n, w};
}

// Offset of element (b, s, h, e) in that layout (TND: s is the global token).
Index offset(const std::string& layout, Index b, Index s, Index h, Index e, Index S, Index n,
             Index w) {
  if (layout == "BNSD" || layout == "BNSD_BSND") return ((b * n + h) * S + s) * w + e;
  if (layout == "TND") return (s * n + h) * w + e;
  return ((b * S + s) * n + h) * w + e;
}

// The layout of the prefix tensors: the key's (BNSD_BSND: BNSD).
template <class C>
std::string prefix_layout(const C& c) {
  return c.layout == "BNSD_BSND" ? "BNSD" : c.layout;
}

template <class C>
std::vector<Index> lse_shape(const C& c) {
  if (c.layout == "TND") return {c.S1, c.N, 1};
  return {c.B, c.N, c.S1, 1};
}

Index max_of(const std::vector<Index>& x) {
  Index m = 0;
  for (Index e : x) m = std::max(m, e);
  return m;
}

// Batch b's first query row / key in its tensor: 0, or with left padding S - pad - len_b.
template <class C>
Index q_start(const C& c, Index b) {
  return c.qpad < 0 ? 0 : c.S1 - c.qpad - c.q_len[z(b)];
}
template <class C>
Index kv_start(const C& c, Index b) {
  return c.kvpad < 0 ? 0 : c.S2 - c.kvpad - c.kv_len[z(b)];
}

// query_padding_size (kv: kv_padding_size) = value, a view of `shape` over c.pads (two values
// from the side's first); `pad` the pad in effect (the reference's; perturbations: none).
template <class C>
void set_pad(C& c, bool kv, std::int64_t value, const std::vector<Index>& shape, bool pad) {
  c.pads.resize(4, 0);
  const size_t at = kv ? 2 : 0;
  c.pads[at] = c.pads[at + 1] = value;
  (kv ? c.in.kv_padding_size : c.in.query_padding_size) =
      StridedView<const std::int64_t>(c.pads.data() + at, shape);
  if (pad) (kv ? c.kvpad : c.qpad) = std::max<std::int64_t>(0, value);
}

// The key positions an incremental mask / pse / per-token row must cover (prefix included).
template <class C>
Index incre_cols(const C& c) {
  return c.store == kPaged ? c.mb * c.bs : c.P + max_of(c.kv_len);
}

// Fills the user mask [m_b][m_s1][m_s2]: random holes, sometimes whole rows masked.
template <class C>
void fill_mask(C& c, fuzz::Rng& r) {
  c.mask.assign(z(std::max<Index>(1, c.m_b * c.m_s1 * c.m_s2)), 0);
  const bool full_rows = r.chance(0.4);
  for (Index b = 0; b < c.m_b; ++b)
    for (Index i = 0; i < c.m_s1; ++i) {
      const bool all = full_rows && r.chance(0.3);
      for (Index j = 0; j < c.m_s2; ++j)
        c.mask[z((b * c.m_s1 + i) * c.m_s2 + j)] = all || r.chance(0.25) ? 1 : 0;
    }
}

// The user mask [m_b][m_s1][m_s2] as a view of rank 2–4: incre [B, S'], [B, 1, S'] or
// [B, 1, 1, S']; prompt [S1', S2'] (m_b = 1), [m_b, S1', S2'] or [m_b, 1, S1', S2'].
template <class C>
StridedView<const std::uint8_t> mask_view(const C& c, fuzz::Rng& r) {
  const Index rank = r.range(c.incre || c.m_b == 1 ? 2 : 3, 4);
  const std::uint8_t* d = c.mask.data();
  if (rank == 2) return StridedView<const std::uint8_t>(d, {c.m_b * c.m_s1, c.m_s2});
  if (rank == 3) return StridedView<const std::uint8_t>(d, {c.m_b, c.m_s1, c.m_s2});
  return StridedView<const std::uint8_t>(d, {c.m_b, 1, c.m_s1, c.m_s2});
}

std::vector<std::int64_t> as_lengths(const std::vector<Index>& x) {
  return std::vector<std::int64_t>(x.begin(), x.end());
}

// The shared prefix: Ps rows in the key's layout with batch 1, the first P of them in use
// (actual_shared_prefix_len when P < Ps, sometimes when equal; P = 0: the call without one),
// the rows past P poisoned.
template <class C>
void build_prefix(C& c, fuzz::Rng& r) {
  using K = typename C::KV;
  c.P = r.chance(0.1) ? 0 : r.range(1, 6);
  c.Ps = std::max<Index>(1, c.P + r.range(0, 2));
  const std::string pl = prefix_layout(c);
  c.pk = draw<K>(r, c.Ps * c.KVN * c.D);
  c.pv = draw<K>(r, c.Ps * c.KVN * c.Dv);
  for (Index t = c.P; t < c.Ps; ++t)
    for (Index h = 0; h < c.KVN; ++h) {
      for (Index e = 0; e < c.D; ++e)
        c.pk[z(offset(pl, 0, t, h, e, c.Ps, c.KVN, c.D))] = poison<K>();
      for (Index e = 0; e < c.Dv; ++e)
        c.pv[z(offset(pl, 0, t, h, e, c.Ps, c.KVN, c.Dv))] = poison<K>();
    }
  c.in.key_shared_prefix = StridedView<const K>(c.pk.data(), shape(pl, 1, c.Ps, c.KVN, c.D));
  c.in.value_shared_prefix = StridedView<const K>(c.pv.data(), shape(pl, 1, c.Ps, c.KVN, c.Dv));
  if (c.P != c.Ps || r.chance(0.3)) c.in.actual_shared_prefix_len = {c.P};
}

// pse_shift [B or 1, N, s1, >= cols] in the query's type; with a batch of its own, NaN where no
// row may read (rows outside the batch's query rows, columns outside its prefix + keys; left
// padding: outside its windows).
template <class C>
void build_pse(C& c, fuzz::Rng& r, Index s1, Index cols) {
  using T = typename C::Q;
  c.pse_b = r.chance(0.5) ? 1 : c.B;
  c.pse_s1 = s1;
  c.pse_s2 = cols + r.range(0, 2);
  c.pse = draw<T>(r, c.pse_b * c.N * c.pse_s1 * c.pse_s2);
  if (c.pse_b == c.B)
    for (Index b = 0; b < c.B; ++b)
      for (Index h = 0; h < c.N; ++h)
        for (Index i = 0; i < c.pse_s1; ++i)
          for (Index j = 0; j < c.pse_s2; ++j)  // (a prefix comes without padding: j0 0)
            if (const Index i0 = q_start(c, b), j0 = kv_start(c, b);
                i < i0 || i >= i0 + c.q_len[z(b)] || j < j0 || j >= j0 + c.P + c.kv_len[z(b)])
              c.pse[z(((b * c.N + h) * c.pse_s1 + i) * c.pse_s2 + j)] = T(kNaN);
  c.in.pse_shift = StridedView<const T>(c.pse.data(), {c.pse_b, c.N, c.pse_s1, c.pse_s2});
}

// One side's antiquant values into sc / off (offsets: when `offsets`) and the reference's map d:
// per token [B][heads][W] (NaN past each batch's prefix + keys), or `groups` values over the KV_N·D
// channels (1: per tensor, KV_N: per head, KV_N·D: per channel); `round`: to the query's type.
template <class C>
void draw_side(C& c, fuzz::Rng& r, bool token, Index groups, bool offsets, bool round,
               std::vector<float>& sc, std::vector<float>& off, Deq& d, Index heads = 1) {
  using T = typename C::Q;
  const auto q = [round](float x) { return round ? static_cast<float>(T(x)) : x; };
  const Index n = token ? c.B * heads * c.W : groups;
  sc.clear(), off.clear();
  for (Index i = 0; i < n; ++i) {
    sc.push_back(q(uniform(r, 0.004f, 0.024f)));
    if (offsets) off.push_back(q(uniform(r, -8.0f, 8.0f)));
  }
  d = Deq{token, heads, {}, {}};
  if (token) {
    for (Index bh = 0; bh < c.B * heads; ++bh)
      for (Index t = c.P + c.kv_len[z(bh / heads)]; t < c.W; ++t) {
        sc[z(bh * c.W + t)] = kNaN;
        if (offsets) off[z(bh * c.W + t)] = kNaN;
      }
    d.scale.assign(sc.begin(), sc.end());
    d.offset.assign(off.begin(), off.end());
    return;
  }
  const Index per = c.KVN * c.D / groups;
  for (Index ch = 0; ch < c.KVN * c.D; ++ch) {
    d.scale.push_back(sc[z(ch / per)]);
    if (offsets) d.offset.push_back(off[z(ch / per)]);
  }
}

// Modes 4 / 5: the map of (batch, head, position) `dense` ([B][heads][W]) moved to the paged
// cache's slots (block, [head,] row) of each key, NaN in every slot no key maps to.
template <class C>
void page_side(const C& c, Index heads, const std::vector<double>& dense, std::vector<float>& to) {
  to.assign(z(c.nb * heads * c.bs), kNaN);
  for (Index b = 0; b < c.B; ++b)
    for (Index t = 0; t < c.kv_len[z(b)]; ++t)
      for (Index h = 0; h < heads; ++h)
        to[z((c.table[z(b * c.mb + t / c.bs)] * heads + h) * c.bs + t % c.bs)] =
            static_cast<float>(dense[z((b * heads + h) * c.W + t)]);
}

// One side of the separate K / V antiquant (fp32): mode 0 (1, KV_N, 1, D), (1, KV_N, D),
// (1, KV_N·D) or (1); mode 1 (1, B, W); mode 2 (KV_N); mode 3 (B, KV_N, W); modes 4 / 5 (paged
// cache) (blockNum, blockSize) / (blockNum, KV_N, blockSize), each key's scale where the key lives.
template <class C>
void separate_side(C& c, fuzz::Rng& r, bool value, std::int64_t mode, bool offsets) {
  const Index kvn = c.KVN, D = c.D, heads = mode == 3 || mode == 5 ? kvn : 1;
  std::vector<Index> s{1, c.B, c.W};
  Index groups = kvn * D;
  if (mode == 2) {
    s = {kvn}, groups = kvn;
  } else if (mode == 0) {
    const std::vector<std::vector<Index>> shapes{{1, kvn, 1, D}, {1, kvn, D}, {1, kvn * D}, {1}};
    s = shapes[z(r.range(0, 3))];
    if (s.size() == 1) groups = 1;
  } else if (mode >= 3) {
    s = mode == 3   ? std::vector<Index>{c.B, kvn, c.W}
        : mode == 4 ? std::vector<Index>{c.nb, c.bs}
                    : std::vector<Index>{c.nb, kvn, c.bs};
  }
  std::vector<float>& sc = value ? c.vs : c.ks;
  std::vector<float>& off = value ? c.vo : c.ko;
  Deq& d = value ? c.dv : c.dk;
  draw_side(c, r, mode == 1 || mode >= 3, groups, offsets, false, sc, off, d, heads);
  if (mode >= 4) {
    page_side(c, heads, d.scale, sc);
    if (offsets) page_side(c, heads, d.offset, off);
  }
  (value ? c.in.value_antiquant_scale : c.in.key_antiquant_scale) =
      StridedView<const float>(sc.data(), s);
  if (offsets)
    (value ? c.in.value_antiquant_offset : c.in.key_antiquant_offset) =
        StridedView<const float>(off.data(), s);
}

// The combined antiquant_scale (and antiquant_offset, when `offsets`) of shape s in the query's
// type, [0] the key's and [1] the value's: per tensor (2) or per channel (any other shape).
template <class C>
void combined_scales(C& c, fuzz::Rng& r, const std::vector<Index>& s, bool offsets) {
  using T = typename C::Q;
  const Index groups = s.size() == 1 ? 1 : c.KVN * c.D;
  std::vector<float> a, ao, b, bo;
  draw_side(c, r, false, groups, offsets, true, a, ao, c.dk);
  draw_side(c, r, false, groups, offsets, true, b, bo, c.dv);
  a.insert(a.end(), b.begin(), b.end());
  ao.insert(ao.end(), bo.begin(), bo.end());
  for (float x : a) c.aqs.push_back(T(x));
  for (float x : ao) c.aqo.push_back(T(x));
  c.in.antiquant_scale = StridedView<const T>(c.aqs.data(), s);
  if (offsets) c.in.antiquant_offset = StridedView<const T>(c.aqo.data(), s);
}

// The combined per-channel shape the prompt branch takes in the layout: BSH (2, KV_N·D), BSND
// (2, KV_N, D), BNSD and BNSD_BSND (2, KV_N, 1, D).
std::vector<Index> combined_prompt_shape(const std::string& layout, Index kvn, Index D) {
  if (layout == "BSH") return {2, kvn * D};
  if (layout == "BSND") return {2, kvn, D};
  return {2, kvn, 1, D};
}

// int8 K/V's scales (offsets in 60 % of the cases): combined per channel / per tensor in the
// query's type (antiquant_mode 0, every listed shape), combined per token (antiquant_mode 1,
// fp32 (2, B, W)), or separate (modes 0 / 0 to 3 / 3, 0 / 1 with a half query; half the paged
// cases 4 / 4 or 5 / 5).
template <class C>
void build_antiquant(C& c, fuzz::Rng& r) {
  using T = typename C::Q;
  const Index kvn = c.KVN, D = c.D, kw = kvn * D;
  c.W = incre_cols(c) + r.range(0, 2);
  const bool offsets = r.chance(0.6);
  std::vector<float> b, bo;
  c.aq = static_cast<int>(r.range(kCombined, kSeparate));
  if (c.aq == kCombined) {
    const std::vector<std::vector<Index>> shapes{
        {2, kvn, 1, D}, {2, 1, kvn, D}, {2, kvn, D}, {2, kw}, {2}};
    combined_scales(c, r, shapes[z(r.range(0, 4))], offsets);
  } else if (c.aq == kCombinedToken) {
    c.p.antiquant_mode = 1;
    draw_side(c, r, true, 0, offsets, false, c.tok_s, c.tok_o, c.dk);
    draw_side(c, r, true, 0, offsets, false, b, bo, c.dv);
    c.tok_s.insert(c.tok_s.end(), b.begin(), b.end());
    c.tok_o.insert(c.tok_o.end(), bo.begin(), bo.end());
    c.in.antiquant_scale_per_token = StridedView<const float>(c.tok_s.data(), {2, c.B, c.W});
    if (offsets)
      c.in.antiquant_offset_per_token = StridedView<const float>(c.tok_o.data(), {2, c.B, c.W});
  } else {
    const bool paged = c.store == kPaged && r.chance(0.5);
    const Index pair = paged            ? r.range(4, 5)
                       : r.chance(0.25) ? 3
                                        : r.range(0, std::is_same_v<T, half> ? 4 : 3);
    c.p.key_antiquant_mode = !paged && pair == 4 ? 0 : pair;  // (4 unpaged: key 0, value 1)
    c.p.value_antiquant_mode = !paged && pair == 4 ? 1 : pair;
    separate_side(c, r, false, c.p.key_antiquant_mode, offsets);
    separate_side(c, r, true, c.p.value_antiquant_mode, offsets);
  }
}

// int8 K/V with Q_S > 1 (offsets in 60 % of the cases): a half query takes the combined
// antiquant_scale (antiquant_mode 0, (2) or the layout's per-channel shape; D a multiple of 32),
// a bf16 query the separate scales (fp32; modes 0 / 0 in (KV_N, D), (KV_N, 1, D) or (KV_N·D), each
// side its own, or 1 / 1 in (B, W), W >= the key tensor's S, NaN past each batch's keys).
template <class C>
void build_prompt_antiquant(C& c, fuzz::Rng& r) {
  const Index kvn = c.KVN, D = c.D, kw = kvn * D;
  c.W = std::max<Index>(1, c.S2 + r.range(0, 2));
  const bool offsets = r.chance(0.6);
  if constexpr (std::is_same_v<typename C::Q, half>) {
    c.aq = kCombined;
    combined_scales(c, r,
                    r.chance(0.3) ? std::vector<Index>{2} : combined_prompt_shape(c.layout, kvn, D),
                    offsets);
  } else {
    c.aq = kSeparate;
    const std::int64_t mode = r.range(0, 1);
    c.p.key_antiquant_mode = c.p.value_antiquant_mode = mode;
    const std::vector<std::vector<Index>> shapes{{kvn, D}, {kvn, 1, D}, {kw}};
    for (const bool value : {false, true}) {
      const std::vector<Index> s = mode == 1 ? std::vector<Index>{c.B, c.W} : pick(r, shapes);
      std::vector<float>& sc = value ? c.vs : c.ks;
      std::vector<float>& off = value ? c.vo : c.ko;
      draw_side(c, r, mode == 1, kw, offsets, false, sc, off, value ? c.dv : c.dk);
      (value ? c.in.value_antiquant_scale : c.in.key_antiquant_scale) =
          StridedView<const float>(sc.data(), s);
      if (offsets)
        (value ? c.in.value_antiquant_offset : c.in.key_antiquant_offset) =
            StridedView<const float>(off.data(), s);
    }
  }
}

// Element offset of (block, row, head h, element e) in a paged cache of head size w:
// [nb, bs, KV_N·w], or (paged4) [nb, KV_N, bs, w].
template <class C>
Index paged_at(const C& c, Index blk, Index row, Index h, Index e, Index w) {
  return c.paged4 ? ((blk * c.KVN + h) * c.bs + row) * w + e
                  : ((blk * c.bs + row) * c.KVN + h) * w + e;
}

template <class C>
std::vector<Index> cache_shape(const C& c, Index w) {
  return c.paged4 ? std::vector<Index>{c.nb, c.KVN, c.bs, w}
                  : std::vector<Index>{c.nb, c.bs, c.KVN * w};
}

// The key / value views over the paged cache (head sizes D and Dv).
template <class C>
void set_paged_views(C& c) {
  using K = typename C::KV;
  c.in.key = {StridedView<const K>(c.k.data(), cache_shape(c, c.D))};
  c.in.value = {StridedView<const K>(c.v.data(), cache_shape(c, c.Dv))};
}

// A paged cache of blocks of bs rows (both branches): each sequence's keys in shuffled blocks,
// one or two spare blocks, poison in every row no sequence owns; the table [B, mb] padded with -1
// (mb: the longest sequence's blocks, sometimes one more).
template <class C>
void build_paged(C& c, fuzz::Rng& r, Index bs, bool four) {
  using K = typename C::KV;
  c.store = kPaged, c.bs = bs, c.paged4 = four, c.mb = 0;
  Index used = 0;
  for (Index l : c.kv_len) used += (l + bs - 1) / bs, c.mb = std::max(c.mb, (l + bs - 1) / bs);
  c.mb = std::max<Index>(1, c.mb + r.range(0, 1));
  c.nb = used + r.range(1, 2);
  std::vector<std::int32_t> ids(z(c.nb));
  for (Index i = 0; i < c.nb; ++i) ids[z(i)] = static_cast<std::int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), r.g);
  c.table.assign(z(c.B * c.mb), -1);
  c.k.assign(z(c.nb * bs * c.KVN * c.D), poison<K>());
  c.v.assign(z(c.nb * bs * c.KVN * c.Dv), poison<K>());
  Index next = 0;
  for (Index b = 0; b < c.B; ++b)
    for (Index t = 0; t < c.kv_len[z(b)]; ++t) {
      if (t % bs == 0) c.table[z(b * c.mb + t / bs)] = ids[z(next++)];
      const Index blk = c.table[z(b * c.mb + t / bs)];
      for (Index h = 0; h < c.KVN; ++h) {
        for (Index e = 0; e < c.D; ++e) c.k[z(paged_at(c, blk, t % bs, h, e, c.D))] = one<K>(r);
        for (Index e = 0; e < c.Dv; ++e) c.v[z(paged_at(c, blk, t % bs, h, e, c.Dv))] = one<K>(r);
      }
    }
  set_paged_views(c);
  c.in.block_table = StridedView<const std::int32_t>(c.table.data(), {c.B, c.mb});
  c.p.block_size = bs;
}

// The incremental branch's keys and values: one tensor, one tensor per batch (each its own S), or
// shuffled paged blocks (poison in every row no sequence owns, the table padded with -1).
template <class C>
void incre_kv(C& c, fuzz::Rng& r, bool lens) {
  using K = typename C::KV;
  const Index W = c.KVN * c.D;
  if (c.store == kTensor) {
    c.S2 = max_of(c.kv_len) + r.range(0, 2);
    if (!lens) c.kv_len.assign(z(c.B), c.S2);
    c.k = draw<K>(r, c.B * c.S2 * W);
    c.v = draw<K>(r, c.B * c.S2 * W);
    c.in.key.emplace_back(c.k.data(), shape(c.layout, c.B, c.S2, c.KVN, c.D));
    c.in.value.emplace_back(c.v.data(), shape(c.layout, c.B, c.S2, c.KVN, c.D));
  } else if (c.store == kList) {
    Index total = 0;
    for (Index b = 0; b < c.B; ++b) {
      c.kv_s.push_back(c.kv_len[z(b)] + r.range(0, 2));
      if (!lens) c.kv_len[z(b)] = c.kv_s.back();
      c.kv_base.push_back(total);
      total += c.kv_s.back() * W;
    }
    c.k = draw<K>(r, total);
    c.v = draw<K>(r, total);
    for (Index b = 0; b < c.B; ++b) {
      c.in.key.emplace_back(c.k.data() + c.kv_base[z(b)],
                            shape(c.layout, 1, c.kv_s[z(b)], c.KVN, c.D));
      c.in.value.emplace_back(c.v.data() + c.kv_base[z(b)],
                              shape(c.layout, 1, c.kv_s[z(b)], c.KVN, c.D));
    }
  } else {  // int8: blocks of a multiple of 32
    build_paged(c, r, (C::kQuant ? 32 : 16) * r.range(1, 2), c.layout == "BNSD" && r.chance(0.5));
  }
}

template <class C>
void build_incre(C& c, fuzz::Rng& r) {
  using T = typename C::Q;
  const char* layouts[] = {"BSH", "BSND", "BNSD"};
  c.layout = layouts[r.range(0, 2)];
  c.Dv = c.D;
  c.S1 = 1;
  c.store = static_cast<int>(r.range(0, 2));
  c.p.inner_precise = r.range(0, 1);
  for (Index b = 0; b < c.B; ++b) c.kv_len.push_back(r.chance(0.2) ? 0 : r.range(1, 40));
  c.q_len.assign(z(c.B), 1);
  c.q = draw<T>(r, c.B * c.N * c.D);
  c.o.assign(c.q.size(), T(kOutSentinel));
  c.in.query = StridedView<const T>(c.q.data(), shape(c.layout, c.B, 1, c.N, c.D));
  c.out = StridedView<T>(c.o.data(), c.in.query.shape());
  const bool lens = c.store == kPaged || r.chance(0.6);
  incre_kv(c, r, lens);
  if (lens) {
    c.in.actual_seq_lengths_kv = as_lengths(c.kv_len);
    const bool same =
        std::all_of(c.kv_len.begin(), c.kv_len.end(), [&](Index l) { return l == c.kv_len[0]; });
    if (same && r.chance(0.3)) c.in.actual_seq_lengths_kv.resize(1);  // one value broadcasts
  }
  if (c.store == kTensor && r.chance(0.35)) build_prefix(c, r);
  const Index cols = incre_cols(c);
  if (r.chance(0.35)) {  // IFA's mask: [B, S'] and its rank-3 / rank-4 forms, S' >= the columns
    c.user_mask = true;
    c.m_b = c.B;
    c.m_s1 = 1;
    c.m_s2 = cols + r.range(0, 3);
    fill_mask(c, r);
    c.in.atten_mask = mask_view(c, r);
  }
  if (r.chance(0.3)) build_pse(c, r, 1, cols);
  if constexpr (C::kQuant) build_antiquant(c, r);
}

// TND's band (sparse 4): pre + q_len >= 0 and next + kv_len >= 0 for every batch with both.
template <class C>
bool tnd_band_ok(const C& c) {
  for (Index b = 0; b < c.B; ++b)
    if (c.q_len[z(b)] > 0 && c.kv_len[z(b)] > 0 &&
        (c.p.pre_tokens + c.q_len[z(b)] < 0 || c.p.next_tokens + c.kv_len[z(b)] < 0))
      return false;
  return true;
}

template <class C>
void build_prompt(C& c, fuzz::Rng& r) {
  using T = typename C::Q;
  using K = typename C::KV;
  // int8 K/V (one tensor, no TND, prefix or sink; Dv = D): a half query takes the combined
  // scales (D 32 or 64), a bf16 one the separate scales and Q_S up to 16.
  constexpr bool aq = C::kQuant, sep = aq && std::is_same_v<T, bfloat16>;
  const char* layouts[] = {"BSH", "BSND", "BNSD", "BNSD_BSND", "TND"};
  c.layout = layouts[r.range(0, aq ? 3 : 4)];
  const bool tnd = c.layout == "TND";
  // A paged cache (blocks of 128, sometimes 256): the value's head size D, except with TND.
  const bool paged = !aq && r.chance(tnd ? 0.4 : 0.25);
  const Index bs = r.chance(0.8) ? 128 : 256;
  // Left padding (a quarter of the cases that may take it; a few spare rows of slack).
  const bool padding = !tnd && !paged && !sep && r.chance(0.25);
  if (aq && !sep) {
    c.D = 32 * (r.chance(0.8) ? 1 : 2);
    c.p.scale_value = 1.0 / std::sqrt(static_cast<double>(c.D));
  }
  c.Dv = aq || c.layout == "BSH" || (paged && !tnd) ? c.D : r.range(1, 24);  // BSH: H = N * D
  c.p.inner_precise = r.range(0, 3);
  if (tnd && r.chance(0.3)) {  // V4's learnable sink: one bf16 logit per query head
    c.D = c.Dv = r.chance(0.5) ? 64 : 128;
    c.p.scale_value = 1.0 / std::sqrt(static_cast<double>(c.D));
    for (Index h = 0; h < c.N; ++h) c.sink.push_back(bfloat16(2 * r.normal()));
    c.in.learnable_sink = StridedView<const bfloat16>(c.sink.data(), {c.N});
  }
  const Index top_q = sep && r.chance(0.25) ? 16 : 6;  // (the separate scales: Q_S <= 16)
  for (Index b = 0; b < c.B; ++b) {  // paged: sometimes past a block (a few hundred at most)
    c.q_len.push_back(r.chance(0.1) ? 0 : r.range(1, top_q));
    const Index top = paged && c.sink.empty() && r.chance(0.3) ? (r.chance(0.2) ? 300 : 180) : 20;
    c.kv_len.push_back(r.chance(0.15) ? 0 : r.range(1, top));
  }
  Index sq = 0, skv = 0;
  for (Index b = 0; b < c.B; ++b) {
    sq = tnd ? sq + c.q_len[z(b)] : std::max(sq, c.q_len[z(b)]);
    skv = tnd ? skv + c.kv_len[z(b)] : std::max(skv, c.kv_len[z(b)]);
  }
  c.S1 = tnd ? sq : std::max<Index>(2, sq + r.range(0, 1));  // Q_S > 1 (TND: any T)
  if (sep) c.S1 = std::min<Index>(c.S1, 16);
  // Paged: the key extent of masks and pse, ceil(longest / bs)·bs.
  c.S2 = paged ? (max_of(c.kv_len) + bs - 1) / bs * bs : tnd ? skv : skv + r.range(0, 1);
  if (padding) c.S1 += r.range(0, 2), c.S2 += r.range(0, 3);
  // (paged: kv lengths per batch, even with TND)
  if (tnd || paged || r.chance(padding ? 0.9 : 0.6)) {
    std::int64_t qa = 0, ka = 0;
    for (Index b = 0; b < c.B; ++b) {
      qa = tnd ? qa + c.q_len[z(b)] : c.q_len[z(b)];
      ka = tnd && !paged ? ka + c.kv_len[z(b)] : c.kv_len[z(b)];
      c.in.actual_seq_lengths.push_back(qa);
      c.in.actual_seq_lengths_kv.push_back(ka);
    }
    const bool same =
        std::all_of(c.kv_len.begin(), c.kv_len.end(), [&](Index l) { return l == c.kv_len[0]; });
    if (paged && !tnd && same && r.chance(0.3)) c.in.actual_seq_lengths_kv.resize(1);
    if (paged && !tnd && r.chance(0.3)) {  // no query lengths: every batch spans S1
      c.in.actual_seq_lengths.clear();
      c.q_len.assign(z(c.B), c.S1);
    }
  } else {  // no lengths: every batch spans the extents
    c.q_len.assign(z(c.B), c.S1);
    c.kv_len.assign(z(c.B), c.S2);
    if (r.chance(0.3)) {  // or one value each, broadcast
      c.in.actual_seq_lengths = {static_cast<std::int64_t>(c.S1)};
      c.in.actual_seq_lengths_kv = {static_cast<std::int64_t>(c.S2)};
    }
  }
  if (padding) {  // each side with its lengths; pads up to the slack, or negative (0)
    const bool qp = !c.in.actual_seq_lengths.empty() && r.chance(0.65);
    const bool kp = !c.in.actual_seq_lengths_kv.empty() && (!qp || r.chance(0.65));
    for (const bool kv : {false, true}) {
      if (!(kv ? kp : qp)) continue;
      const Index slack = kv ? c.S2 - max_of(c.kv_len) : c.S1 - max_of(c.q_len);
      const std::int64_t v = !r.chance(0.15) ? r.range(0, slack)
                             : r.chance(0.2) ? std::numeric_limits<std::int64_t>::min()
                                             : -r.range(1, 3);
      set_pad(c, kv, v, r.chance(0.3) ? std::vector<Index>{} : std::vector<Index>{1}, true);
    }
  }
  const Index bb = tnd ? 1 : c.B;
  c.q = draw<T>(r, bb * c.S1 * c.N * c.D);
  c.o.assign(z(bb * c.S1 * c.N * c.Dv), T(kOutSentinel));
  c.in.query = StridedView<const T>(c.q.data(), shape(c.layout, c.B, c.S1, c.N, c.D));
  if (paged) {  // 4-D caches with BNSD, BNSD_BSND and TND
    build_paged(c, r, bs, c.layout != "BSH" && c.layout != "BSND" && r.chance(0.5));
  } else {
    c.k = draw<K>(r, bb * c.S2 * c.KVN * c.D);
    c.v = draw<K>(r, bb * c.S2 * c.KVN * c.Dv);
    c.in.key.emplace_back(c.k.data(), shape(c.layout, c.B, c.S2, c.KVN, c.D));
    c.in.value.emplace_back(c.v.data(), shape(c.layout, c.B, c.S2, c.KVN, c.Dv));
  }
  const std::string ol = c.layout == "BNSD_BSND" ? "BSND" : c.layout;
  c.out = StridedView<T>(c.o.data(), shape(ol, c.B, c.S1, c.N, c.Dv));
  // (int8 K/V: the combined scales take a prefix, read with the same maps)
  if (!sep && !tnd && !paged && c.qpad < 0 && c.kvpad < 0 && r.chance(0.3)) build_prefix(c, r);
  // The sparse mode: TND takes 0 without a mask, 3, or 4 with a value head size of 64 or 128.
  const bool tnd_band = tnd && (c.Dv == 64 || c.Dv == 128) && r.chance(0.4);
  c.p.sparse_mode = tnd_band ? 4 : tnd ? (r.chance(0.5) ? 3 : 0) : r.range(0, 4);
  const std::int64_t sm = c.p.sparse_mode;
  c.user_mask = sm == 1 || (sm == 0 && !tnd && r.chance(0.5));
  c.compressed = sm >= 2;
  const bool band = (sm == 0 && c.user_mask) || sm == 4;
  if (band && r.chance(0.6)) {  // a band: not both negative, pre + next >= 0
    do {
      c.p.pre_tokens = r.range(-3, 8);
      c.p.next_tokens = r.range(-3, 8);
    } while ((c.p.pre_tokens < 0 && c.p.next_tokens < 0) || c.p.pre_tokens + c.p.next_tokens < 0 ||
             (tnd && !tnd_band_ok(c)));
  } else if (!band && r.chance(0.3)) {  // ignored by the mode: anything
    c.p.pre_tokens = r.range(-5, 5);
    c.p.next_tokens = r.range(-5, 5);
  }
  if (c.compressed) {
    const Index rk = r.range(2, 4);
    c.in.atten_mask = StridedView<const std::uint8_t>(
        compressed_mask(), rk == 2   ? std::vector<Index>{2048, 2048}
                           : rk == 3 ? std::vector<Index>{1, 2048, 2048}
                                     : std::vector<Index>{1, 1, 2048, 2048});
  } else if (c.user_mask) {  // columns [0, P) are the prefix's
    c.m_b = r.chance(0.5) ? 1 : c.B;
    c.m_s1 = c.S1 + r.range(0, 2);
    c.m_s2 = c.P + c.S2 + r.range(0, 2);
    fill_mask(c, r);
    c.in.atten_mask = mask_view(c, r);
  }
  if (!tnd && r.chance(0.3)) build_pse(c, r, c.S1 + r.range(0, 1), c.P + c.S2);
  if constexpr (aq) build_prompt_antiquant(c, r);
}

// Poison in every query row and every key / value row outside its batch's (rows [0, length), or
// with left padding the windows; contiguous tensors and lists; the paged pool has it in the rows
// no sequence owns): reading one shows (NaN; int8 keys and values hold -128, which cannot show).
template <class C>
void poison_padding(C& c) {
  using T = typename C::Q;
  using K = typename C::KV;
  const bool tnd = c.layout == "TND";
  if (tnd) return;
  const bool list = c.incre && c.store == kList;
  for (Index b = 0; b < c.B; ++b) {
    const Index q0 = q_start(c, b), k0 = kv_start(c, b);
    if (!c.incre)
      for (Index s = 0; s < c.S1; ++s)
        for (Index h = 0; h < c.N && (s < q0 || s >= q0 + c.q_len[z(b)]); ++h)
          for (Index e = 0; e < c.D; ++e)
            c.q[z(offset(c.layout, b, s, h, e, c.S1, c.N, c.D))] = poison<T>();
    if (c.store == kPaged) continue;
    const Index S = list ? c.kv_s[z(b)] : c.S2;
    for (Index t = 0; t < S; ++t)
      for (Index h = 0; h < c.KVN && (t < k0 || t >= k0 + c.kv_len[z(b)]); ++h) {
        for (Index e = 0; e < c.D; ++e) {
          const Index at = list ? c.kv_base[z(b)] + offset(c.layout, 0, t, h, e, S, c.KVN, c.D)
                                : offset(c.layout, b, t, h, e, S, c.KVN, c.D);
          c.k[z(at)] = poison<K>();
        }
        for (Index e = 0; e < c.Dv; ++e) {
          const Index at = list ? c.kv_base[z(b)] + offset(c.layout, 0, t, h, e, S, c.KVN, c.Dv)
                                : offset(c.layout, b, t, h, e, S, c.KVN, c.Dv);
          c.v[z(at)] = poison<K>();
        }
      }
  }
}

// int8 K/V take the incremental branch in 70 % of their cases; every other case picks a branch
// at random.
template <class C>
void build(C& c, fuzz::Rng& r) {
  c.incre = r.chance(C::kQuant ? 0.7 : 0.5);
  c.B = r.range(1, 3);
  c.KVN = r.range(1, 2);
  c.N = c.KVN * r.range(1, 3);
  c.D = r.range(1, 24);
  c.p.num_heads = c.N;
  c.p.num_key_value_heads = c.KVN == c.N && r.chance(0.3) ? 0 : c.KVN;
  c.p.scale_value = 1.0 / std::sqrt(static_cast<double>(c.D));
  c.p.softmax_lse_flag = r.chance(0.6);
  if (c.incre)
    build_incre(c, r);
  else
    build_prompt(c, r);
  c.p.input_layout = c.layout;
  poison_padding(c);
  Index n = 1;
  const std::vector<Index> ls = lse_shape(c);
  for (Index e : ls) n *= e;
  c.lse.assign(z(n), kLseSentinel);
  if (c.p.softmax_lse_flag || r.chance(0.5))  // flag off: given (never written) or absent
    c.lse_out = StridedView<float>(c.lse.data(), ls);
}

// ---- The reference ---------------------------------------------------------------------------

// The keys (prefix included) of batch b.
template <class C>
Index kv_eff(const C& c, Index b) {
  return c.P + c.kv_len[z(b)];
}

// The user mask of row i, key j of batch b (left padding: at the padded positions).
template <class C>
bool masked(const C& c, Index b, Index i, Index j) {
  if (!c.user_mask) return false;
  const Index mb = c.m_b == 1 ? 0 : b;
  return c.mask[z((mb * c.m_s1 + q_start(c, b) + i) * c.m_s2 + kv_start(c, b) + j)] != 0;
}

// Left padding in the prompt branch: either tensor given (even with the value 0).
template <class C>
bool left_padded(const C& c) {
  return !c.incre && (!c.in.query_padding_size.absent() || !c.in.kv_padding_size.absent());
}

// The prompt branch's band (sparse modes 0–4 with pre / next tokens) as the reference states
// it (ref::cann::Pfa::excluded), the prefix part of the keys (the causal anchor is the end of
// prefix + keys); not the user mask. The incremental branch has none. Left padding: the
// diagonals in the windows (i, j and the lengths the windows'), pre / next ignored by mode 0.
template <class C>
ref::cann::Pfa band(const C& c) {
  const auto clamp = [](std::int64_t x) {
    return std::clamp<std::int64_t>(x, -2147483648LL, 2147483647LL);
  };
  ref::cann::Pfa bd;
  bd.sparse_mode = static_cast<int>(c.p.sparse_mode);
  bd.pre = clamp(c.p.pre_tokens);
  bd.next = clamp(c.p.next_tokens);
  if (left_padded(c) && bd.sparse_mode == 0) bd.pre = bd.next = 2147483647;
  bd.has_mask = c.user_mask;
  for (Index b = 0; b < c.B; ++b) {
    bd.q_len.push_back(static_cast<int>(c.q_len[z(b)]));
    bd.kv_len.push_back(static_cast<int>(kv_eff(c, b)));
  }
  return bd;
}

template <class C>
bool excluded(const C& c, const ref::cann::Pfa& bd, Index b, Index i, Index j) {
  return !c.incre && bd.excluded(static_cast<int>(b), static_cast<int>(i), static_cast<int>(j));
}

// Element offset of key / value element (b, t, h, e) of the batch's own rows (prompt: t within
// batch b from its first key t0, TND: from its first token t0; paged: wherever the block table
// puts it).
template <class C>
Index kv_offset(const C& c, Index b, Index t, Index h, Index e, Index w, Index t0) {
  if (c.store == kPaged) return paged_at(c, c.table[z(b * c.mb + t / c.bs)], t % c.bs, h, e, w);
  if (!c.incre) return offset(c.layout, b, t0 + t, h, e, c.S2, c.KVN, w);
  if (c.store == kList)
    return c.kv_base[z(b)] + offset(c.layout, 0, t, h, e, c.kv_s[z(b)], c.KVN, c.D);
  return offset(c.layout, b, t, h, e, c.S2, c.KVN, c.D);
}

// Key (or value) element e of head h at position t of batch b as the reference reads it: prefix
// row t < P, else the batch's row t - P; int8 dequantized as (x8 + offset)·scale.
template <class C>
double kv_at(const C& c, bool value, Index b, Index t, Index h, Index e, Index t0) {
  const Index w = value ? c.Dv : c.D;
  const double x =
      t < c.P ? dbl((value ? c.pv : c.pk)[z(offset(prefix_layout(c), 0, t, h, e, c.Ps, c.KVN, w))])
              : dbl((value ? c.v : c.k)[z(kv_offset(c, b, t - c.P, h, e, w, t0))]);
  if constexpr (!C::kQuant) return x;
  const Deq& d = value ? c.dv : c.dk;
  const size_t i = z(d.token ? (b * d.heads + (d.heads == 1 ? 0 : h)) * c.W + t : h * c.D + e);
  return (x + (d.offset.empty() ? 0.0 : d.offset[i])) * d.scale[i];
}

// The reference problem (hidden keys: the band and the user mask; bias: pse_shift) and its q / k
// / v per batch (k and v: prefix rows first).
template <class C>
ref::Problem ref_problem(const C& c, ref::Seqs& q, ref::Seqs& k, ref::Seqs& v,
                         std::vector<Index>& q0) {
  const bool tnd = c.layout == "TND";
  ref::Problem pr;
  pr.num_heads = static_cast<int>(c.N);
  pr.num_kv_heads = static_cast<int>(c.KVN);
  pr.head_size = static_cast<int>(c.D);
  pr.v_head_size = static_cast<int>(c.Dv);
  pr.scale = c.p.scale_value;
  pr.hidden = [&c, bd = band(c)](int b, int, int i, int j) {
    return excluded(c, bd, b, i, j) || masked(c, b, i, j);
  };
  if (c.pse_b > 0)  // (left padding: at the padded positions)
    pr.bias = [&c](int b, int h, int i, int j) {
      const Index pb = c.pse_b == 1 ? 0 : b, row = q_start(c, b) + i, col = kv_start(c, b) + j;
      return dbl(c.pse[z(((pb * c.N + h) * c.pse_s1 + row) * c.pse_s2 + col)]);
    };
  q0.assign(z(c.B) + 1, 0);  // TND: each batch's first token (else q_start / kv_start)
  Index k0 = 0;
  for (Index b = 0; b < c.B; ++b) {
    const Index lq = c.q_len[z(b)], lk = kv_eff(c, b);
    q0[z(b) + 1] = q0[z(b)] + lq;
    pr.q_len.push_back(static_cast<int>(lq));
    pr.kv_len.push_back(static_cast<int>(lk));
    q.emplace_back();
    k.emplace_back();
    v.emplace_back();
    for (Index s = 0; s < lq; ++s)
      for (Index h = 0; h < c.N; ++h)
        for (Index e = 0; e < c.D; ++e)
          q.back().push_back(dbl(c.q[z(offset(c.layout, b, (tnd ? q0[z(b)] : q_start(c, b)) + s, h,
                                              e, c.incre ? 1 : c.S1, c.N, c.D))]));
    const Index t0 = tnd ? k0 : kv_start(c, b);
    for (Index t = 0; t < lk; ++t)
      for (Index h = 0; h < c.KVN; ++h) {
        for (Index e = 0; e < c.D; ++e) k.back().push_back(kv_at(c, false, b, t, h, e, t0));
        for (Index e = 0; e < c.Dv; ++e) v.back().push_back(kv_at(c, true, b, t, h, e, t0));
      }
    k0 += c.kv_len[z(b)];
  }
  return pr;
}

// softmax_lse against want: exact where want is infinite or a fill / invalid value of magnitude
// >= 1e38, else within 1e-4 · (1 + |want|).
std::string compare_lse(float got, double want, const std::string& where) {
  const bool exact = !std::isfinite(want) || std::fabs(want) >= 1e38;
  const bool ok = exact
                      ? static_cast<double>(got) == want
                      : std::fabs(static_cast<double>(got) - want) <= 1e-4 * (1 + std::fabs(want));
  if (ok) return "";
  return "softmax_lse " + where + ": got " + std::to_string(got) + ", want " + std::to_string(want);
}

template <class C>
std::string verify(const C& c) {
  const bool tnd = c.layout == "TND";
  const Index g = c.N / c.KVN;
  ref::Seqs q, k, v;
  std::vector<Index> q0;
  const ref::Problem pr = ref_problem(c, q, k, v, q0);
  const ref::Result want = ref::attention(pr, q, k, v);
  const bool fill = c.incre || (c.p.inner_precise & 2) == 0;  // masked keys scored, not excluded
  const ref::cann::Pfa bd = band(c);
  const std::string ol = c.layout == "BNSD_BSND" ? "BSND" : c.layout;
  const bool flag = c.p.softmax_lse_flag;
  for (Index b = 0; b < c.B; ++b) {
    const Index lq = c.q_len[z(b)], lk = kv_eff(c, b), i0 = tnd ? 0 : q_start(c, b);
    for (Index s = 0; s < (tnd ? lq : c.S1); ++s) {  // row i = s - i0 of the batch's rows
      const Index i = s - i0;
      const bool row = i >= 0 && i < lq;  // else 0 and lse +inf
      // A row whose visible keys are all masked, with the fill semantics: the mean of V.
      Index visible = 0;
      bool all_masked = true;
      if (row)
        for (Index j = 0; j < lk; ++j)
          if (!excluded(c, bd, b, i, j)) ++visible, all_masked = all_masked && masked(c, b, i, j);
      const bool mean = fill && visible > 0 && all_masked;
      for (Index h = 0; h < c.N; ++h) {
        std::vector<double> got, w;
        for (Index e = 0; e < c.Dv; ++e) {
          const Index at = c.incre ? (b * c.N + h) * c.D + e
                                   : offset(ol, b, (tnd ? q0[z(b)] : 0) + s, h, e, c.S1, c.N, c.Dv);
          got.push_back(dbl(c.o[z(at)]));
          double x = 0;  // padded rows: 0
          if (mean) {
            for (Index j = 0; j < lk; ++j)
              if (!excluded(c, bd, b, i, j)) x += v[z(b)][z((j * c.KVN + h / g) * c.Dv + e)];
            x /= static_cast<double>(visible);
          } else if (row) {
            x = want.o[z(b)][z((i * c.N + h) * c.Dv + e)];
            // the sink joins the denominator: Σ exp(s_j) -> Σ exp(s_j) + exp(sink_h)
            if (!c.sink.empty())
              x /= 1 + std::exp(dbl(c.sink[z(h)]) - want.lse[z(b)][z(h * lq + i)]);
          }
          w.push_back(x);
        }
        const std::string m = fuzz::compare(got, w, 3e-3);
        if (!m.empty())
          return "batch " + std::to_string(b) + " row " + std::to_string(s) + " head " +
                 std::to_string(h) + ": " + m;
        if (!flag) continue;
        double l = row ? want.lse[z(b)][z(h * lq + i)] : -HUGE_VAL;
        if (mean) l = c.incre ? -1e12 + std::log(static_cast<double>(visible)) : -double(FLT_MAX);
        if (l == -HUGE_VAL) l = c.incre ? kIncreEmpty : HUGE_VAL;  // no key, or a padded row
        const Index li = tnd ? (q0[z(b)] + s) * c.N + h : (b * c.N + h) * c.S1 + s;
        const std::string ml = compare_lse(c.lse[z(li * c.lse_step)], l,
                                           "batch " + std::to_string(b) + " row " +
                                               std::to_string(s) + " head " + std::to_string(h));
        if (!ml.empty()) return ml;
      }
    }
  }
  for (size_t i = 0; i < c.lse.size(); ++i)  // with the flag off: all of it; on: the gaps
    if ((!flag || i % z(c.lse_step) != 0) && !(c.lse[i] == kLseSentinel))
      return flag ? "softmax_lse gap " + std::to_string(i) + " written"
                  : "softmax_lse written with softmax_lse_flag off";
  return "";
}
// ---- Perturbations ---------------------------------------------------------------------------

template <class C>
bool is_incre(const C& c) {
  return c.incre;
}
template <class C>
bool is_prompt(const C& c) {
  return !c.incre;
}
template <class C>
bool is_paged(const C& c) {  // either branch
  return c.store == kPaged;
}
template <class C>
bool is_paged_prompt(const C& c) {
  return !c.incre && c.store == kPaged;
}
template <class C>
bool is_paged_tnd(const C& c) {
  return c.store == kPaged && c.layout == "TND";
}
template <class C>
bool has_flag(const C& c) {
  return c.p.softmax_lse_flag;
}
template <class C>
bool has_prefix(const C& c) {
  return !c.in.key_shared_prefix.absent();
}
template <class C>
bool is_separate(const C& c) {
  return c.aq == kSeparate;
}
template <class C>
bool has_pse(const C& c) {
  return c.pse_b > 0;
}
template <class C>
bool is_prompt_aq(const C& c) {  // int8 K/V with Q_S > 1
  return C::kQuant && !c.incre;
}
template <class C>
bool is_prompt_separate(const C& c) {  // (a bf16 query)
  return is_prompt_aq(c) && c.aq == kSeparate;
}
template <class C>
bool is_prompt_combined(const C& c) {  // (a half query)
  return is_prompt_aq(c) && c.aq == kCombined;
}
// A prompt configuration left padding may come with: one K/V tensor in BSH / BSND / BNSD /
// BNSD_BSND, no paged cache, prefix or separate scales.
template <class C>
bool paddable(const C& c) {
  return !c.incre && c.layout != "TND" && c.store != kPaged && !has_prefix(c) && c.aq != kSeparate;
}
template <class C>
bool is_padded(const C& c) {  // (the builder's: a prompt configuration)
  return c.qpad >= 0 || c.kvpad >= 0;
}

// query_padding_size or kv_padding_size 0 (what else the call has rejects it).
template <class C>
void add_pad(C& c, fuzz::Rng& r) {
  set_pad(c, r.chance(0.5), 0, {1}, false);
}

// An output view with another shape, over a buffer large enough for it.
template <class C>
void regrow_out(C& c, const std::vector<Index>& s) {
  using T = typename C::Q;
  Index n = 1;
  for (Index e : s) n *= std::max<Index>(e, 1);
  if (c.o.size() < z(n)) c.o.resize(z(n), T(kOutSentinel));
  c.out = StridedView<T>(c.o.data(), s);
}

// At least n floats (0.01) in c.spare, for views the operator must reject (one call per edit:
// the next one moves the buffer).
template <class C>
const float* spare(C& c, Index n) {
  c.spare.assign(z(std::max<Index>(n, 1)), 0.01f);
  return c.spare.data();
}

// Prefix views of the given shapes over fresh buffers.
template <class C>
void set_prefix(C& c, const std::vector<Index>& ks, const std::vector<Index>& vs) {
  using K = typename C::KV;
  const auto numel = [](const std::vector<Index>& s) {
    Index n = 1;
    for (Index e : s) n *= e;
    return z(std::max<Index>(n, 1));
  };
  c.pk.assign(numel(ks), K(1.0f));
  c.pv.assign(numel(vs), K(1.0f));
  c.in.key_shared_prefix = StridedView<const K>(c.pk.data(), ks);
  c.in.value_shared_prefix = StridedView<const K>(c.pv.data(), vs);
}

// A prefix of two rows in the key's layout.
template <class C>
void add_prefix(C& c, fuzz::Rng&) {
  const std::string pl = prefix_layout(c);
  set_prefix(c, shape(pl, 1, 2, c.KVN, c.D), shape(pl, 1, 2, c.KVN, c.Dv));
}

// Separate K / V scales (1, KV_N·D) each.
template <class C>
void add_separate_scales(C& c, fuzz::Rng&) {
  const Index kw = c.KVN * c.D;
  const float* s = spare(c, 2 * kw);
  c.in.key_antiquant_scale = StridedView<const float>(s, {1, kw});
  c.in.value_antiquant_scale = StridedView<const float>(s + kw, {1, kw});
}

// The same call with Q_S = 2: query, output and softmax_lse regrown.
template <class C>
void query_s2(C& c, fuzz::Rng&) {
  using T = typename C::Q;
  c.q.resize(c.q.size() * 2, T(0.5f));
  c.in.query = StridedView<const T>(c.q.data(), shape(c.layout, c.B, 2, c.N, c.D));
  regrow_out(c, shape(c.layout, c.B, 2, c.N, c.D));
  c.lse.assign(c.lse.size() * 2, kLseSentinel);
  if (!c.lse_out.absent()) c.lse_out = StridedView<float>(c.lse.data(), {c.B, c.N, 2, 1});
}

// The prompt branch's call with Q_S = s: query, output and softmax_lse regrown (the lengths, mask
// and pse as they were).
template <class C>
void prompt_query_s(C& c, Index s) {
  using T = typename C::Q;
  c.q.resize(std::max(c.q.size(), z(c.B * s * c.N * c.D)), T(0.5f));
  c.in.query = StridedView<const T>(c.q.data(), shape(c.layout, c.B, s, c.N, c.D));
  regrow_out(c, shape(c.layout == "BNSD_BSND" ? "BSND" : c.layout, c.B, s, c.N, c.Dv));
  c.lse.assign(z(c.B * c.N * s), kLseSentinel);
  if (!c.lse_out.absent()) c.lse_out = StridedView<float>(c.lse.data(), {c.B, c.N, s, 1});
}

// The int8-query probe: the configuration's shapes, int8 query / key / value (all 1), a prefix of
// two rows (see call_int8).
template <class C>
void int8_probe(C& c, fuzz::Rng&) {
  c.int8_query = true;
  c.q8.assign(c.q.size(), 1);
  c.k8.assign(c.k.size(), 1);
  c.v8.assign(c.v.size(), 1);
  c.p8.assign(z(2 * c.KVN * std::max(c.D, c.Dv)), 1);
}

// The key's, the value's or both separate scales (and offsets, when given) of shape s over s0.
template <class C>
void set_separate_scale(C& c, fuzz::Rng& r, const float* s0, const std::vector<Index>& s) {
  const Index side = r.range(0, 2);  // 0: key, 1: value, 2: both
  const StridedView<const float> v(s0, s);
  if (side != 1) c.in.key_antiquant_scale = v;
  if (side != 0) c.in.value_antiquant_scale = v;
  if (side != 1 && !c.ko.empty()) c.in.key_antiquant_offset = v;
  if (side != 0 && !c.vo.empty()) c.in.value_antiquant_offset = v;
}

// Per-token scale columns too few for the prefix + keys: one less than the positions read.
template <class C>
std::vector<Index> short_token_shape(const C& c, Index sides) {
  return {sides, c.B, incre_cols(c) - 1};
}
// softmax_lse with and without the flag.
template <class C>
std::vector<fuzz::Perturbation<C>> lse_edits() {
  return {
      fuzz::edit<C>("softmax_lse shape mismatch", true, has_flag<C>,
                    [](C& c, fuzz::Rng& r) {
                      std::vector<Index> s = lse_shape(c);
                      const Index how = r.range(0, 3);
                      if (how == 0)
                        s.pop_back();  // no trailing 1
                      else if (how == 1)
                        s[z(r.range(0, static_cast<Index>(s.size()) - 1))] += 1;
                      else if (how == 2)
                        s.push_back(1);
                      else  // the other layout's form ([T, N, 1] against [B, N, S, 1])
                        s = c.layout == "TND" ? std::vector<Index>{1, c.N, c.S1, 1}
                                              : std::vector<Index>{c.B * c.S1, c.N, 1};
                      if (s == lse_shape(c)) s.push_back(2);
                      Index n = 1;
                      for (Index e : s) n *= std::max<Index>(e, 1);
                      c.lse.resize(std::max(c.lse.size(), z(n)), kLseSentinel);
                      c.lse_out = StridedView<float>(c.lse.data(), s);
                    }),
      fuzz::edit<C>("softmax_lse strided", false, has_flag<C>,
                    [](C& c, fuzz::Rng&) {  // every other float, gaps left alone
                      const std::vector<Index> s = lse_shape(c);
                      std::vector<Index> st(s.size(), 2);
                      for (size_t d = s.size() - 1; d > 0; --d) st[d - 1] = st[d] * s[d];
                      c.lse.assign(c.lse.size() * 2, kLseSentinel);
                      c.lse_step = 2;
                      c.lse_out = StridedView<float>(c.lse.data(), s, st);
                    }),
      fuzz::edit<C>("softmax_lse missing with the flag", true, has_flag<C>,
                    [](C& c, fuzz::Rng&) { c.lse_out = {}; }),
      fuzz::edit<C>("softmax_lse of a huge shape", true, has_flag<C>,
                    [](C& c, fuzz::Rng&) {
                      c.lse_out = StridedView<float>(c.lse.data(), {kHuge, kHuge, 1, 1});
                    }),
      fuzz::edit<C>(
          "softmax_lse of any shape with the flag off", false,
          [](const C& c) { return !c.p.softmax_lse_flag; },
          [](C& c, fuzz::Rng& r) {
            c.lse.resize(c.lse.size() + 3, kLseSentinel);
            const Index n = static_cast<Index>(c.lse.size());
            c.lse_out = r.chance(0.5) ? StridedView<float>(c.lse.data(), {n})
                                      : StridedView<float>(c.lse.data(), {1, n, 1});
          }),
  };
}

// Parameters and tensors of both branches.
template <class C>
std::vector<fuzz::Perturbation<C>> common_edits() {
  return {
      fuzz::edit<C>(
          "sparse_mode out of range", true, nullptr,
          [](C& c, fuzz::Rng& r) {
            const std::int64_t bad[] = {
                -1, 5, 8, 9, std::int64_t(1) << 40, std::numeric_limits<std::int64_t>::min()};
            c.p.sparse_mode = bad[r.range(0, 5)];
          }),
      fuzz::edit<C>("unknown layout", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      const char* bad[] = {"SBH", "NTD_BSND", "bsnd",    "BSND ",
                                           "",    "BSH_BNSD", "TND_NTD", "NSD"};
                      c.p.input_layout = bad[r.range(0, 7)];
                    }),
      fuzz::edit<C>("num_heads out of range", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      const std::int64_t bad[] = {0, -1, 257, kHuge,
                                                  std::numeric_limits<std::int64_t>::min()};
                      c.p.num_heads = bad[r.range(0, 4)];
                    }),
      fuzz::edit<C>("num_key_value_heads negative or not dividing", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      c.p.num_key_value_heads =
                          r.chance(0.5) ? -1 : (r.chance(0.5) ? c.N + 1 : kHuge);
                    }),
      fuzz::edit<C>("scale_value not finite", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      c.p.scale_value = r.chance(0.5) ? std::numeric_limits<double>::quiet_NaN()
                                                      : -std::numeric_limits<double>::infinity();
                    }),
      fuzz::edit<C>("query dim negative", true, nullptr,
                    [](C& c, fuzz::Rng& r) {
                      const int d = static_cast<int>(r.range(0, c.in.query.rank() - 1));
                      c.in.query = support::resized(c.in.query, d, -c.in.query.size(d) - 1);
                    }),
      fuzz::edit<C>("query rank mismatch", true, nullptr,
                    [](C& c, fuzz::Rng&) {
                      const attnref::Dims qs = c.in.query.shape();
                      std::vector<Index> s(qs.begin(), qs.end());
                      if (s.size() == 4)
                        s[2] *= s[3], s.pop_back();
                      else
                        s.push_back(1);
                      c.in.query = StridedView<const typename C::Q>(c.q.data(), s);
                    }),
      fuzz::edit<C>("key size overflows", true, nullptr,
                    [](C& c, fuzz::Rng&) {
                      c.in.key[0] = support::resized(c.in.key[0], 0, kHuge);
                      c.in.key[0] = support::resized(c.in.key[0], 1, kHuge);
                    }),
      fuzz::edit<C>("attention_out shape mismatch", true, nullptr,
                    [](C& c, fuzz::Rng&) {
                      const attnref::Dims os = c.out.shape();
                      std::vector<Index> s(os.begin(), os.end());
                      s.back() += 1;
                      regrow_out(c, s);
                    }),
      fuzz::edit<C>(
          "actual_seq_lengths_kv negative", true,
          [](const C& c) { return !c.in.actual_seq_lengths_kv.empty(); },
          [](C& c, fuzz::Rng& r) {
            c.in.actual_seq_lengths_kv[z(
                r.range(0, static_cast<Index>(c.in.actual_seq_lengths_kv.size()) - 1))] = -3;
          }),
      fuzz::edit<C>(
          "actual_seq_lengths_kv huge", true,
          [](const C& c) { return !c.in.actual_seq_lengths_kv.empty(); },
          [](C& c, fuzz::Rng& r) {
            c.in.actual_seq_lengths_kv.back() =
                r.chance(0.5) ? std::numeric_limits<std::int64_t>::max() : kHuge;
          }),
  };
}

// The prompt branch (Q_S > 1, or TND).
template <class C>
std::vector<fuzz::Perturbation<C>> prompt_edits() {
  return {
      fuzz::edit<C>(
          "atten_mask [1, 1, 1, S2] with Q_S > 1", true,
          [](const C& c) { return !c.incre && c.S1 > 1; },
          [](C& c, fuzz::Rng&) {  // the vLLM-Ascend shape: one query row covered
            c.mask.assign(z(std::max<Index>(c.S2, 1)), 0);
            c.in.atten_mask = StridedView<const std::uint8_t>(c.mask.data(), {1, 1, 1, c.S2});
            if (c.p.sparse_mode >= 2 && c.layout != "TND") c.p.sparse_mode = 0;
          }),
      fuzz::edit<C>("key / value tensor lists with Q_S > 1", true, is_prompt<C>,
                    [](C& c, fuzz::Rng&) {
                      c.in.key.push_back(c.in.key[0]);
                      c.in.value.push_back(c.in.value[0]);
                    }),
      fuzz::edit<C>(
          "block_table with Q_S > 1 over a key that is not a paged cache", true,
          [](const C& c) { return !c.incre && c.store != kPaged; },
          [](C& c, fuzz::Rng&) {
            c.table.assign(z(c.B), 0);
            c.in.block_table = StridedView<const std::int32_t>(c.table.data(), {c.B, 1});
            c.p.block_size = 16;
          }),
      fuzz::edit<C>(
          "actual_seq_lengths past S1", true,
          [](const C& c) {
            return !c.incre && c.layout != "TND" && !c.in.actual_seq_lengths.empty();
          },
          [](C& c, fuzz::Rng& r) {
            c.in.actual_seq_lengths[0] = r.chance(0.5) ? c.S1 + 1 : kHuge;
          }),
      fuzz::edit<C>(
          "TND lengths not ending at T", true, [](const C& c) { return c.layout == "TND"; },
          [](C& c, fuzz::Rng& r) {  // (paged: the kv lengths are per batch)
            const bool kv = c.store != kPaged && r.chance(0.5);
            (kv ? c.in.actual_seq_lengths_kv : c.in.actual_seq_lengths).back() += 1;
          }),
      fuzz::edit<C>(
          "TND with a user mask", true, [](const C& c) { return c.layout == "TND"; },
          [](C& c, fuzz::Rng&) {
            c.p.sparse_mode = 0;
            c.mask.assign(z(std::max<Index>(1, c.S1 * c.S2)), 0);
            c.in.atten_mask = StridedView<const std::uint8_t>(c.mask.data(), {c.S1, c.S2});
          }),
      fuzz::edit<C>(
          "sparse_mode 1 without a mask", true,
          [](const C& c) { return !c.incre && c.layout != "TND"; },
          [](C& c, fuzz::Rng&) {
            c.p.sparse_mode = 1;
            c.in.atten_mask = {};
          }),
      fuzz::edit<C>(
          "sparse_mode 4 with an empty band", true, [](const C& c) { return c.p.sparse_mode == 4; },
          [](C& c, fuzz::Rng& r) {
            c.p.pre_tokens = r.chance(0.5) ? -2 : -5;
            c.p.next_tokens = r.chance(0.5) ? 1 : -1;
          }),
      fuzz::edit<C>("inner_precise out of range", true, nullptr,
                    [](C& c, fuzz::Rng& r) { c.p.inner_precise = r.chance(0.5) ? 4 : -1; }),
      fuzz::edit<C>(
          "learnable_sink with a layout other than TND", true,
          [](const C& c) { return c.layout != "TND"; },
          [](C& c, fuzz::Rng&) {
            c.sink.assign(z(c.N), attnref::bfloat16(0.5f));
            c.in.learnable_sink = StridedView<const attnref::bfloat16>(c.sink.data(), {c.N});
          }),
      fuzz::edit<C>(
          "learnable_sink with a head size other than 64 or 128", true,
          [](const C& c) { return c.layout == "TND" && c.sink.empty(); },
          [](C& c, fuzz::Rng&) {
            c.sink.assign(z(c.N), attnref::bfloat16(0.5f));
            c.in.learnable_sink = StridedView<const attnref::bfloat16>(c.sink.data(), {c.N});
          }),
      fuzz::edit<C>(
          "learnable_sink shape mismatch", true, [](const C& c) { return !c.sink.empty(); },
          [](C& c, fuzz::Rng& r) {
            c.sink.resize(z(c.N + 1), attnref::bfloat16(0.5f));
            c.in.learnable_sink =
                r.chance(0.5) ? StridedView<const attnref::bfloat16>(c.sink.data(), {c.N + 1})
                              : StridedView<const attnref::bfloat16>(c.sink.data(), {1, c.N});
          }),
      fuzz::edit<C>(  // (the combined antiquant_scale with Q_S > 1 takes 0 only)
          "antiquant_mode with Q_S > 1 (ignored)", false,
          [](const C& c) { return !c.incre && !is_prompt_combined(c); },
          [](C& c, fuzz::Rng&) { c.p.antiquant_mode = 1; }),
  };
}

// The incremental branch (Q_S == 1).
template <class C>
std::vector<fuzz::Perturbation<C>> incre_edits() {
  return {
      fuzz::edit<C>(
          "BNSD_BSND with Q_S == 1", true, [](const C& c) { return c.incre && c.layout == "BNSD"; },
          [](C& c, fuzz::Rng&) { c.p.input_layout = "BNSD_BSND"; }),
      fuzz::edit<C>("prompt-only parameters with Q_S == 1 (ignored)", false, is_incre<C>,
                    [](C& c, fuzz::Rng& r) {
                      c.p.pre_tokens = r.range(-5, 5);
                      c.p.next_tokens = r.range(-5, 5);
                      c.p.sparse_mode = r.range(0, 4);
                      c.in.actual_seq_lengths = {-7, kHuge};
                    }),
      fuzz::edit<C>("query_padding_size with Q_S == 1 (ignored)", false, is_incre<C>,
                    [](C& c, fuzz::Rng& r) {
                      const std::int64_t v = r.chance(0.5) ? r.range(-2, 3) : kHuge;
                      set_pad(c, false, v,
                              r.chance(0.5) ? std::vector<Index>{} : std::vector<Index>{1}, false);
                    }),
      fuzz::edit<C>("inner_precise 2 or 3 with Q_S == 1", true, is_incre<C>,
                    [](C& c, fuzz::Rng& r) { c.p.inner_precise = r.range(2, 3); }),
      fuzz::edit<C>(
          "antiquant_mode 1 with floating-point key / value", true,
          [](const C& c) { return c.incre && !C::kQuant; },
          [](C& c, fuzz::Rng&) { c.p.antiquant_mode = 1; }),
      fuzz::edit<C>(
          "kv lengths past S", true, [](const C& c) { return c.incre && c.store != kPaged; },
          [](C& c, fuzz::Rng&) {
            const Index s = c.store == kList ? c.kv_s[0] : c.S2;
            c.in.actual_seq_lengths_kv.assign(z(c.B), 0);
            c.in.actual_seq_lengths_kv[0] = s + 1;
          }),
      fuzz::edit<C>("key / value lists of different lengths", true, is_incre<C>,
                    [](C& c, fuzz::Rng&) { c.in.value.push_back(c.in.value.back()); }),
      fuzz::edit<C>(
          "tensor list shorter than the batch", true,
          [](const C& c) { return c.incre && c.store == kList && c.B > 1; },
          [](C& c, fuzz::Rng&) {
            c.in.key.pop_back();
            c.in.value.pop_back();
          }),
      fuzz::edit<C>(
          "atten_mask narrower than the keys (prefix included)", true,
          [](const C& c) { return c.incre && incre_cols(c) > 0; },
          [](C& c, fuzz::Rng&) {
            static const std::uint8_t m[1024] = {};  // >= B · (cols - 1)
            const Index cols = incre_cols(c);
            c.in.atten_mask = StridedView<const std::uint8_t>(m, {c.B, cols - 1});
          }),
      fuzz::edit<C>(
          "block table entry out of range", true,
          [](const C& c) { return is_paged<C>(c) && max_of(c.kv_len) > 0; },
          [](C& c, fuzz::Rng& r) {
            Index b = r.range(0, c.B - 1);
            while (c.kv_len[z(b)] == 0) b = (b + 1) % c.B;
            const Index blk = r.range(0, (c.kv_len[z(b)] - 1) / c.bs);
            const std::int32_t bad[] = {-1, static_cast<std::int32_t>(c.nb),
                                        std::numeric_limits<std::int32_t>::max(),
                                        std::numeric_limits<std::int32_t>::min()};
            c.table[z(b * c.mb + blk)] = bad[r.range(0, 3)];
            c.want_out_of_range = true;
          }),
      fuzz::edit<C>("block_size differs from the cache", true, is_paged<C>,
                    [](C& c, fuzz::Rng& r) {
                      const Index other = c.bs + (c.incre ? 16 : 128);  // (prompt: valid too)
                      c.p.block_size = r.chance(0.5) ? other : (r.chance(0.5) ? 0 : -16);
                    }),
      fuzz::edit<C>("paged without kv lengths", true, is_paged<C>,
                    [](C& c, fuzz::Rng&) { c.in.actual_seq_lengths_kv.clear(); }),
      fuzz::edit<C>("kv lengths past the block table", true, is_paged<C>,
                    [](C& c, fuzz::Rng&) {
                      c.in.actual_seq_lengths_kv = as_lengths(c.kv_len);
                      c.in.actual_seq_lengths_kv[0] = c.mb * c.bs + 1;
                    }),
      fuzz::edit<C>("block table size overflows", true, is_paged<C>,
                    [](C& c, fuzz::Rng&) {
                      c.in.block_table = support::reshaped(c.in.block_table, {c.B, Index(1) << 61});
                    }),
      fuzz::edit<C>(
          "paged cache with a tensor list", true, [](const C& c) { return is_paged<C>(c); },
          [](C& c, fuzz::Rng&) {
            c.in.key.push_back(c.in.key[0]);
            c.in.value.push_back(c.in.value[0]);
          }),
      fuzz::edit<C>("garbage in block_table past each sequence's blocks (paged, never read)", false,
                    is_paged<C>,
                    [](C& c, fuzz::Rng& r) {
                      for (Index b = 0; b < c.B; ++b)
                        for (Index j = (c.kv_len[z(b)] + c.bs - 1) / c.bs; j < c.mb; ++j)
                          c.table[z(b * c.mb + j)] =
                              r.chance(0.3) ? std::numeric_limits<std::int32_t>::min()
                                            : static_cast<std::int32_t>(r.range(-999, 999));
                    }),
  };
}
// pse_shift: the shapes the branches reject.
template <class C>
std::vector<fuzz::Perturbation<C>> pse_edits() {
  using T = typename C::Q;
  return {
      fuzz::edit<C>(
          "pse_shift narrower than prefix + keys", true,
          [](const C& c) { return has_pse(c) && (c.incre ? incre_cols(c) : c.P + c.S2) > 0; },
          [](C& c, fuzz::Rng&) {
            const Index cols = c.incre ? incre_cols(c) : c.P + c.S2;
            c.in.pse_shift = StridedView<const T>(c.pse.data(), {c.pse_b, c.N, c.pse_s1, cols - 1});
          }),
      fuzz::edit<C>("pse_shift of another batch, head count, row count or rank", true, has_pse<C>,
                    [](C& c, fuzz::Rng& r) {
                      std::vector<Index> s{c.pse_b, c.N, c.pse_s1, c.pse_s2};
                      const Index how = r.range(0, 3);
                      if (how == 0) s[0] = c.B + 1;
                      if (how == 1) s[1] = c.N + 1;
                      if (how == 2) s[2] = c.incre ? 2 : c.S1 - 1;  // incre: 1 row; prompt: >= S1
                      if (how == 3) s.erase(s.begin());
                      c.pse.resize(z(s[0] * s[1] * s[2] * (s.size() == 4 ? s[3] : 1)), T(0.5f));
                      c.in.pse_shift = StridedView<const T>(c.pse.data(), s);
                    }),
      fuzz::edit<C>(
          "pse_shift with TND", true, [](const C& c) { return c.layout == "TND"; },
          [](C& c, fuzz::Rng&) {
            c.pse.assign(z(std::max<Index>(1, c.N * c.S1 * c.S2)), T(0.5f));
            c.in.pse_shift = StridedView<const T>(c.pse.data(), {1, c.N, c.S1, c.S2});
          }),
  };
}

// int8 K/V: the combined antiquant's rejections, int8 K/V with Q_S > 1, and the separate
// antiquant given with floating-point K/V in either branch.
template <class C>
std::vector<fuzz::Perturbation<C>> antiquant_edits() {
  using T = typename C::Q;
  return {
      fuzz::edit<C>(
          "int8 key / value without antiquant scales", true, [](const C&) { return C::kQuant; },
          [](C& c, fuzz::Rng&) {
            c.in.antiquant_scale = c.in.antiquant_offset = {};
            c.in.antiquant_scale_per_token = c.in.antiquant_offset_per_token = {};
            c.in.key_antiquant_scale = c.in.key_antiquant_offset = {};
            c.in.value_antiquant_scale = c.in.value_antiquant_offset = {};
            c.p.antiquant_mode = c.p.key_antiquant_mode = c.p.value_antiquant_mode = 0;
          }),
      // (an incremental configuration's call with Q_S = 2: Q_S > 1 takes int8 K/V with separate
      // scales and a bf16 query, or the combined scales with an fp16 one, so some of these calls
      // stay valid: only the forms it never takes)
      fuzz::edit<C>(
          "int8 key / value with Q_S > 1", true,
          [](const C& c) {
            return C::kQuant && c.incre &&
                   (c.aq == kCombinedToken ||
                    (std::is_same_v<T, attnref::bfloat16> && c.aq == kCombined) ||
                    (std::is_same_v<T, half> && c.aq == kSeparate));
          },
          query_s2<C>),
      fuzz::edit<C>(
          "antiquant_scale of an unlisted shape", true,
          [](const C& c) { return c.aq == kCombined; },
          [](C& c, fuzz::Rng& r) {
            const Index kvn = c.KVN, D = c.D, kw = kvn * D;
            const std::vector<std::vector<Index>> bad{
                {3, kw}, {2, kw + 1}, {1, kw}, {2, kvn, 2, D}, {4}};
            c.aqs.resize(std::max(c.aqs.size(), z(4 * kw + 4)), T(0.01f));
            c.in.antiquant_scale = StridedView<const T>(c.aqs.data(), bad[z(r.range(0, 4))]);
          }),
      fuzz::edit<C>(
          "antiquant_offset of another shape than the scale's", true,
          [](const C& c) { return c.aq == kCombined; },
          [](C& c, fuzz::Rng&) {
            const Index kw = c.KVN * c.D;
            std::vector<Index> s{2};
            const attnref::Dims as = c.in.antiquant_scale.shape();
            if (std::vector<Index>(as.begin(), as.end()) == s) s = {2, 1, kw};
            c.aqo.assign(z(2 * kw), T(0.0f));
            c.in.antiquant_offset = StridedView<const T>(c.aqo.data(), s);
          }),
      fuzz::edit<C>(
          "antiquant_mode 1 with antiquant_scale", true,
          [](const C& c) { return c.aq == kCombined; },
          [](C& c, fuzz::Rng&) { c.p.antiquant_mode = 1; }),
      fuzz::edit<C>(
          "antiquant_scale_per_token without antiquant_mode 1", true,
          [](const C& c) { return c.aq == kCombinedToken; },
          [](C& c, fuzz::Rng&) { c.p.antiquant_mode = 0; }),
      fuzz::edit<C>(
          "antiquant_scale_per_token with too few columns", true,
          [](const C& c) { return c.aq == kCombinedToken && incre_cols(c) > 0; },
          [](C& c, fuzz::Rng&) {
            const std::vector<Index> s = short_token_shape(c, 2);
            c.in.antiquant_scale_per_token = StridedView<const float>(c.tok_s.data(), s);
            if (!c.tok_o.empty())
              c.in.antiquant_offset_per_token = StridedView<const float>(c.tok_o.data(), s);
          }),
      fuzz::edit<C>(
          "antiquant_mode out of range", true,
          [](const C& c) { return C::kQuant && c.aq != kSeparate; },
          [](C& c, fuzz::Rng& r) {
            const std::int64_t bad[] = {2, -1, 3, std::int64_t(1) << 40};
            c.p.antiquant_mode = bad[r.range(0, 3)];
          }),
      fuzz::edit<C>(
          "separate K / V scales with floating-point key / value", true,
          [](const C& c) { return c.incre && !C::kQuant; }, add_separate_scales<C>),
      fuzz::edit<C>(
          "separate K / V scales with floating-point key / value and Q_S > 1", true,
          [](const C& c) { return !c.incre && !C::kQuant; }, add_separate_scales<C>),
      fuzz::edit<C>(
          "key / value_antiquant_mode without separate scales", true,
          [](const C& c) { return c.aq != kSeparate; },
          [](C& c, fuzz::Rng& r) {
            (r.chance(0.5) ? c.p.key_antiquant_mode : c.p.value_antiquant_mode) = r.range(1, 5);
          }),
  };
}

// The separate K / V antiquant (int8 K/V, Q_S == 1): its modes, offsets and shapes.
template <class C>
std::vector<fuzz::Perturbation<C>> separate_edits() {
  return {
      fuzz::edit<C>("separate antiquant modes 3–5 on one side only", true, is_separate<C>,
                    [](C& c, fuzz::Rng& r) {  // (another mode than the other side's)
                      std::int64_t m = r.range(3, 5);
                      if (m == c.p.key_antiquant_mode) m = 3 + (m - 2) % 3;
                      (r.chance(0.5) ? c.p.key_antiquant_mode : c.p.value_antiquant_mode) = m;
                    }),
      fuzz::edit<C>("separate antiquant mode outside 0–5", true, is_separate<C>,
                    [](C& c, fuzz::Rng& r) {
                      const std::int64_t bad[] = {6, -1, 7, std::int64_t(1) << 40};
                      (r.chance(0.5) ? c.p.key_antiquant_mode : c.p.value_antiquant_mode) =
                          bad[r.range(0, 3)];
                    }),
      fuzz::edit<C>("separate antiquant modes neither equal nor key 0 / value 1", true,
                    is_separate<C>,
                    [](C& c, fuzz::Rng& r) {
                      const std::int64_t pairs[][2] = {{1, 0}, {0, 2}, {2, 0}, {1, 2}, {2, 1}};
                      const auto* pr = pairs[r.range(0, 4)];
                      c.p.key_antiquant_mode = pr[0];
                      c.p.value_antiquant_mode = pr[1];
                    }),
      fuzz::edit<C>("one separate offset without the other", true, is_separate<C>,
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
      fuzz::edit<C>("a separate scale missing", true, is_separate<C>,
                    [](C& c, fuzz::Rng& r) {
                      (r.chance(0.5) ? c.in.key_antiquant_scale : c.in.value_antiquant_scale) = {};
                    }),
      fuzz::edit<C>(
          "separate scale of a shape its mode does not take", true, is_separate<C>,
          [](C& c, fuzz::Rng& r) {
            const bool value = r.chance(0.5);
            const std::int64_t mode = value ? c.p.value_antiquant_mode : c.p.key_antiquant_mode;
            const Index kvn = c.KVN, kw = kvn * c.D;
            const std::vector<std::vector<Index>> bad =
                mode == 0 ? std::vector<std::vector<Index>>{{2, kw}, {1, kw + 1}, {1, kvn, 2, c.D}}
                : mode == 1 ? std::vector<std::vector<Index>>{{1, c.B + 1, c.W}, {2, c.B, c.W}}
                            : std::vector<std::vector<Index>>{{kvn + 1}, {1, kvn}};
            const float* s = spare(c, 2 * (c.B + 1) * c.W + 4 * kw + 4);
            const std::vector<Index>& b = bad[z(r.range(0, static_cast<Index>(bad.size()) - 1))];
            (value ? c.in.value_antiquant_scale : c.in.key_antiquant_scale) =
                StridedView<const float>(s, b);
            auto& off = value ? c.in.value_antiquant_offset : c.in.key_antiquant_offset;
            if (!off.absent()) off = StridedView<const float>(s, b);  // (the scale's check)
          }),
      fuzz::edit<C>(
          "separate per-token scale with too few columns", true,
          [](const C& c) {
            return c.aq == kSeparate && c.p.value_antiquant_mode == 1 && incre_cols(c) > 0;
          },
          [](C& c, fuzz::Rng& r) {  // the value's, or both (mode 1 / 1)
            const std::vector<Index> s = short_token_shape(c, 1);
            const bool both = c.p.key_antiquant_mode == 1 && r.chance(0.5);
            c.in.value_antiquant_scale = StridedView<const float>(c.vs.data(), s);
            if (!c.vo.empty())
              c.in.value_antiquant_offset = StridedView<const float>(c.vo.data(), s);
            if (!both) return;
            c.in.key_antiquant_scale = StridedView<const float>(c.ks.data(), s);
            if (!c.ko.empty()) c.in.key_antiquant_offset = StridedView<const float>(c.ko.data(), s);
          }),
      fuzz::edit<C>(
          "separate per-token key and value scales of different widths (modes 1, 3)", true,
          [](const C& c) {
            const std::int64_t m = c.p.key_antiquant_mode;
            return c.aq == kSeparate && (m == 1 || m == 3) && c.p.value_antiquant_mode == m;
          },
          [](C& c, fuzz::Rng&) {  // the key's one column wider
            const float* s = spare(c, c.B * c.KVN * (c.W + 1));
            c.in.key_antiquant_scale = c.p.key_antiquant_mode == 1
                                           ? StridedView<const float>(s, {1, c.B, c.W + 1})
                                           : StridedView<const float>(s, {c.B, c.KVN, c.W + 1});
            if (!c.ko.empty()) c.in.key_antiquant_offset = c.in.key_antiquant_scale;
          }),
      fuzz::edit<C>(
          "separate mode 3 scale of a wrong shape", true,
          [](const C& c) { return c.aq == kSeparate && c.p.key_antiquant_mode == 3; },
          [](C& c, fuzz::Rng& r) {
            const Index B = c.B, kvn = c.KVN, W = c.W, cols = incre_cols(c);
            std::vector<std::vector<Index>> bad{
                {B + 1, kvn, W}, {B, kvn + 1, W}, {B * kvn, W}, {B, kvn, W, 1}};
            if (cols > 0) bad.push_back({B, kvn, cols - 1});
            if (B != 1 || kvn != 1) bad.push_back({1, B, W});  // (mode 1's)
            set_separate_scale(c, r, spare(c, (B + 1) * (kvn + 1) * W), pick(r, bad));
          }),
      fuzz::edit<C>(
          "separate modes 4 / 5 without block_table", true,
          [](const C& c) { return c.aq == kSeparate && c.store != kPaged; },
          [](C& c, fuzz::Rng& r) {
            const std::int64_t m = r.range(4, 5);
            c.p.key_antiquant_mode = c.p.value_antiquant_mode = m;
            const float* s = spare(c, 2 * c.KVN * 32);
            const StridedView<const float> v(
                s, m == 4 ? std::vector<Index>{2, 32} : std::vector<Index>{2, c.KVN, 32});
            c.in.key_antiquant_scale = c.in.value_antiquant_scale = v;
            if (!c.ko.empty()) c.in.key_antiquant_offset = c.in.value_antiquant_offset = v;
          }),
      fuzz::edit<C>(
          "separate mode 4 / 5 scale of another block count, block size or head count", true,
          [](const C& c) { return c.aq == kSeparate && c.p.key_antiquant_mode >= 4; },
          [](C& c, fuzz::Rng& r) {
            const bool five = c.p.key_antiquant_mode == 5;
            const Index nb = c.nb, bs = c.bs, kvn = c.KVN;
            std::vector<std::vector<Index>> bad{
                {nb + 1, bs}, {nb - 1, bs}, {nb, bs + 1}, {nb, bs / 2}, {nb, 1, bs}};  // mode 4's
            if (five) {
              for (auto& s : bad) s.insert(s.begin() + 1, kvn);
              bad.back() = {nb, kvn + 1, bs};
              bad.push_back({nb, bs});
            }
            set_separate_scale(c, r, spare(c, (nb + 1) * (kvn + 1) * (bs + 1)), pick(r, bad));
          }),
      fuzz::edit<C>(
          "separate key 0 / value 1 with a bf16 query", true,
          [](const C& c) { return c.aq == kSeparate && std::is_same_v<typename C::Q, bfloat16>; },
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
          "combined scales beside the separate ones (ignored, Q_S == 1)", false,
          [](const C& c) { return c.incre && is_separate(c); },
          [](C& c, fuzz::Rng& r) {
            using T = typename C::Q;
            const Index kw = c.KVN * c.D;
            if (r.chance(0.5)) {
              c.aqs.assign(z(2 * kw), T(1e4f));
              c.in.antiquant_scale = StridedView<const T>(c.aqs.data(), {2, kw});
              return;
            }
            c.p.antiquant_mode = 1;
            c.tok_s.assign(z(2 * c.B * c.W), 1e4f);
            c.in.antiquant_scale_per_token =
                StridedView<const float>(c.tok_s.data(), {2, c.B, c.W});
          }),
  };
}

// Paged K/V with Q_S > 1 (the rules of cann/detail/fia_paged.hpp; the paged edits of both branches
// are in incre_edits).
template <class C>
std::vector<fuzz::Perturbation<C>> paged_prompt_edits() {
  using T = typename C::Q;
  using K = typename C::KV;  // (T: the prompt branch's)
  return {
      fuzz::edit<C>("paged cache (Q_S > 1) with blocks of 64, 100 or 1152", true,
                    is_paged_prompt<C>,
                    [](C& c, fuzz::Rng& r) {  // params.block_size the cache's
                      c.bs = pick(r, std::vector<Index>{64, 100, 1152});
                      c.p.block_size = c.bs;
                      const Index n = c.nb * c.bs * c.KVN;
                      c.k.resize(std::max(c.k.size(), z(n * c.D)), poison<K>());
                      c.v.resize(std::max(c.v.size(), z(n * c.Dv)), poison<K>());
                      set_paged_views(c);
                    }),
      fuzz::edit<C>(
          "4-D paged cache with BSH or BSND (Q_S > 1)", true,
          [](const C& c) {
            return is_paged_prompt(c) && (c.layout == "BSH" || c.layout == "BSND");
          },
          [](C& c, fuzz::Rng&) {
            c.paged4 = true;
            set_paged_views(c);
          }),
      fuzz::edit<C>("paged value with fewer blocks than the key (Q_S > 1)", true,
                    is_paged_prompt<C>,
                    [](C& c, fuzz::Rng&) {
                      std::vector<Index> s = cache_shape(c, c.Dv);
                      s[0] -= 1;
                      c.in.value.assign(1, StridedView<const K>(c.v.data(), s));
                    }),
      fuzz::edit<C>("paged key / value head size differs from the query's (Q_S > 1)", true,
                    is_paged_prompt<C>,
                    [](C& c, fuzz::Rng& r) {  // (TND: the value's is its own)
                      const bool value = c.layout != "TND" && r.chance(0.5);
                      std::vector<K>& x = value ? c.v : c.k;
                      const Index w = (value ? c.Dv : c.D) + (r.chance(0.5) ? 1 : -1);
                      x.resize(std::max(x.size(), z(c.nb * c.bs * c.KVN * w)), poison<K>());
                      (value ? c.in.value : c.in.key)
                          .assign(1, StridedView<const K>(x.data(), cache_shape(c, w)));
                    }),
      fuzz::edit<C>("left padding with a paged cache (Q_S > 1)", true, is_paged_prompt<C>,
                    add_pad<C>),
      fuzz::edit<C>(
          "int8 query / key / value with a paged cache (Q_S > 1)", true,
          [](const C& c) { return std::is_same_v<T, half> && is_paged_prompt(c); }, int8_probe<C>),
      fuzz::edit<C>(
          "atten_mask or pse_shift covering the keys, not the paged S2 (Q_S > 1)", true,
          [](const C& c) { return is_paged_prompt(c) && c.S2 > 0 && (c.user_mask || has_pse(c)); },
          [](C& c, fuzz::Rng& r) {  // the longest sequence's keys (or S2 - 1: a whole block)
            const Index longest = max_of(c.kv_len);
            const Index w = longest % c.bs != 0 ? longest : c.S2 - 1;
            if (c.user_mask && (!has_pse(c) || r.chance(0.5)))
              c.in.atten_mask = StridedView<const std::uint8_t>(c.mask.data(), {c.m_b, c.m_s1, w});
            else
              c.in.pse_shift = StridedView<const T>(c.pse.data(), {c.pse_b, c.N, c.pse_s1, w});
          }),
      fuzz::edit<C>("TND paged kv lengths cumulative-looking, not one per batch", true,
                    is_paged_tnd<C>,
                    [](C& c, fuzz::Rng& r) {  // B + 1 values from 0, or the last B - 1
                      std::vector<std::int64_t> cu{0};
                      for (Index l : c.kv_len) cu.push_back(cu.back() + l);
                      if (c.B > 1 && r.chance(0.5)) cu.erase(cu.begin(), cu.begin() + 2);
                      c.in.actual_seq_lengths_kv = cu;
                    }),
      fuzz::edit<C>(
          "TND paged with sparse_mode 1 or 2", true, is_paged_tnd<C>,
          [](C& c, fuzz::Rng& r) {  // (4 is taken since 14d3bcf, under its own rules)
            c.p.sparse_mode = r.range(1, 2);
            c.in.atten_mask = StridedView<const std::uint8_t>(compressed_mask(), {2048, 2048});
          }),
      fuzz::edit<C>("TND paged with sparse_mode 0 and a mask", true, is_paged_tnd<C>,
                    [](C& c, fuzz::Rng& r) {
                      c.p.sparse_mode = 0;
                      c.mask.assign(z(std::max<Index>(1, c.S1 * c.S2)), 0);
                      c.in.atten_mask =
                          r.chance(0.5)
                              ? StridedView<const std::uint8_t>(compressed_mask(), {2048, 2048})
                              : StridedView<const std::uint8_t>(c.mask.data(), {c.S1, c.S2});
                    }),
  };
}

// The shared prefix: the layouts, caches and types it does not take, its shapes and lengths, and
// masks too narrow for prefix + keys.
template <class C>
std::vector<fuzz::Perturbation<C>> prefix_edits() {
  return {
      fuzz::edit<C>("key_shared_prefix without value_shared_prefix (or the reverse)", true,
                    has_prefix<C>,
                    [](C& c, fuzz::Rng& r) {
                      (r.chance(0.5) ? c.in.key_shared_prefix : c.in.value_shared_prefix) = {};
                    }),
      fuzz::edit<C>(
          "shared prefix with TND", true, [](const C& c) { return c.layout == "TND"; },
          [](C& c, fuzz::Rng&) {
            set_prefix(c, shape("TND", 1, 2, c.KVN, c.D), shape("TND", 1, 2, c.KVN, c.Dv));
          }),
      fuzz::edit<C>("shared prefix with a paged cache", true, is_paged<C>, add_prefix<C>),
      fuzz::edit<C>(
          "shared prefix with kv_padding_size", true,
          [](const C& c) { return c.incre && has_prefix(c); },
          [](C& c, fuzz::Rng&) {
            static const std::int64_t pad[1] = {0};
            c.in.kv_padding_size = StridedView<const std::int64_t>(pad, {1});
          }),
      fuzz::edit<C>(
          "shared prefix with tensor lists", true,
          [](const C& c) { return c.incre && c.store == kList && c.B > 1; }, add_prefix<C>),
      fuzz::edit<C>(
          "shared prefix with int8 query / key / value", true,
          [](const C& c) {
            return std::is_same_v<typename C::Q, half> && !C::kQuant && !c.incre &&
                   c.layout != "TND" && c.store != kPaged;
          },
          int8_probe<C>),
      fuzz::edit<C>("shared prefix of another batch, heads, head size or length", true,
                    has_prefix<C>,
                    [](C& c, fuzz::Rng& r) {
                      const std::string pl = prefix_layout(c);
                      std::vector<Index> ks = shape(pl, 1, c.Ps, c.KVN, c.D);
                      std::vector<Index> vs = shape(pl, 1, c.Ps, c.KVN, c.Dv);
                      const Index how = r.range(0, 4);
                      if (how == 0)
                        ks = shape(pl, 2, c.Ps, c.KVN, c.D), vs = shape(pl, 2, c.Ps, c.KVN, c.Dv);
                      if (how == 1) ks = shape(pl, 1, c.Ps, c.KVN + 1, c.D);
                      if (how == 2) ks = shape(pl, 1, c.Ps, c.KVN, c.D + 1);
                      if (how == 3) vs = shape(pl, 1, c.Ps, c.KVN, c.Dv + 1);
                      if (how == 4) vs = shape(pl, 1, c.Ps + 1, c.KVN, c.Dv);
                      set_prefix(c, ks, vs);
                    }),
      fuzz::edit<C>(
          "actual_shared_prefix_len past the prefix rows, negative or not one value", true,
          has_prefix<C>,
          [](C& c, fuzz::Rng& r) {
            const std::vector<std::int64_t> bad[] = {{c.Ps + 1}, {-1}, {c.P, c.P}, {kHuge}};
            c.in.actual_shared_prefix_len = bad[r.range(0, 3)];
          }),
      fuzz::edit<C>(
          "actual_shared_prefix_len without a prefix", true,
          [](const C& c) { return !has_prefix(c); },
          [](C& c, fuzz::Rng& r) { c.in.actual_shared_prefix_len = {r.range(0, 2)}; }),
      fuzz::edit<C>(
          "atten_mask narrower than prefix + keys (Q_S > 1)", true,
          [](const C& c) { return !c.incre && c.user_mask && c.P + c.S2 > 0; },
          [](C& c, fuzz::Rng&) {
            c.in.atten_mask =
                StridedView<const std::uint8_t>(c.mask.data(), {c.m_b, c.m_s1, c.P + c.S2 - 1});
          }),
  };
}

// int8 K/V with Q_S > 1 (cann/detail/fia_prompt_aq.hpp): the forms, shapes, modes and inputs the
// prompt branch does not take with the separate (bf16 query) or the combined (half query) scales.
template <class C>
std::vector<fuzz::Perturbation<C>> prompt_aq_edits() {
  using T = typename C::Q;
  using K = typename C::KV;
  return {
      fuzz::edit<C>(
          "separate scales with Q_S 17 or more", true, is_prompt_separate<C>,
          [](C& c, fuzz::Rng& r) { prompt_query_s(c, r.chance(0.7) ? 17 : r.range(18, 40)); }),
      fuzz::edit<C>("int8 key / value with TND (Q_S > 1)", true, is_prompt_aq<C>,
                    [](C& c, fuzz::Rng&) {  // the same buffers as [T, N, D], no mask or pse
                      const Index tq = c.B * c.S1, tk = c.B * c.S2;
                      c.p.input_layout = "TND";
                      c.p.sparse_mode = 0;
                      c.in.atten_mask = {};
                      c.in.pse_shift = {};
                      c.in.query = StridedView<const T>(c.q.data(), {tq, c.N, c.D});
                      c.in.key = {StridedView<const K>(c.k.data(), {tk, c.KVN, c.D})};
                      c.in.value = {StridedView<const K>(c.v.data(), {tk, c.KVN, c.Dv})};
                      regrow_out(c, {tq, c.N, c.Dv});
                      if (!c.lse_out.absent())
                        c.lse_out = StridedView<float>(c.lse.data(), {tq, c.N, 1});
                      c.in.actual_seq_lengths.clear();
                      c.in.actual_seq_lengths_kv.clear();
                      for (Index b = 1; b <= c.B; ++b) {
                        c.in.actual_seq_lengths.push_back(b * c.S1);
                        c.in.actual_seq_lengths_kv.push_back(b * c.S2);
                      }
                    }),
      fuzz::edit<C>("int8 paged key / value with Q_S > 1", true, is_prompt_aq<C>,
                    [](C& c, fuzz::Rng& r) {  // blocks of 128 (4-D with BNSD / BNSD_BSND)
                      build_paged(c, r, 128,
                                  c.layout != "BSH" && c.layout != "BSND" && r.chance(0.5));
                      c.in.actual_seq_lengths_kv = as_lengths(c.kv_len);
                    }),
      fuzz::edit<C>("separate antiquant modes other than 0 / 0 and 1 / 1 (Q_S > 1)", true,
                    is_prompt_separate<C>,
                    [](C& c, fuzz::Rng& r) {  // (the scales stay mode 0's or 1's)
                      const std::int64_t pairs[][2] = {{2, 2}, {3, 3}, {4, 4}, {5, 5},
                                                       {0, 1}, {1, 0}, {0, 2}, {1, 3}};
                      const auto* pr = pairs[r.range(0, 7)];
                      c.p.key_antiquant_mode = pr[0];
                      c.p.value_antiquant_mode = pr[1];
                    }),
      fuzz::edit<C>("separate scale of a shape Q_S > 1 does not take (Q_S == 1's, too few columns)",
                    true, is_prompt_separate<C>,
                    [](C& c, fuzz::Rng& r) {  // (none equal to a Q_S > 1 shape of the mode)
                      const Index B = c.B, kvn = c.KVN, D = c.D, kw = kvn * D, W = c.W;
                      std::vector<std::vector<Index>> bad;
                      if (c.p.key_antiquant_mode == 0) {
                        bad = {{1, kvn, 1, D}, {1, kvn, D, 1}};
                        if (D != 1) bad.push_back({kvn, D, 1});
                        if (kvn != 1) bad.push_back({1, kvn, D}), bad.push_back({1, kw});
                        if (kw != 1) bad.push_back({1});
                      } else {
                        bad = {{1, B, W}, {B + 1, W}, {B, W, 1}, {B * W}};
                        if (c.S2 > 0) bad.push_back({B, c.S2 - 1});
                      }
                      set_separate_scale(c, r, spare(c, (B + 1) * W + kw + 4), pick(r, bad));
                    }),
      fuzz::edit<C>(
          "combined antiquant_scale of another layout's shape (Q_S > 1)", true,
          is_prompt_combined<C>,
          [](C& c, fuzz::Rng& r) {  // the offset (when given) alike
            const Index kvn = c.KVN, D = c.D, kw = kvn * D;
            const std::vector<Index> want = combined_prompt_shape(c.layout, kvn, D);
            std::vector<std::vector<Index>> bad;
            for (const std::vector<Index>& s : std::vector<std::vector<Index>>{
                     {2, kvn, 1, D}, {2, 1, kvn, D}, {2, kvn, D}, {2, kw}, {2, 1, kw}, {2, kw, 1}})
              if (s != want) bad.push_back(s);
            const std::vector<Index>& s = pick(r, bad);
            const bool offsets = !c.aqo.empty();
            c.aqs.resize(std::max(c.aqs.size(), z(2 * kw)), T(0.01f));
            c.in.antiquant_scale = StridedView<const T>(c.aqs.data(), s);
            if (!offsets) return;
            c.aqo.resize(std::max(c.aqo.size(), z(2 * kw)), T(0.0f));
            c.in.antiquant_offset = StridedView<const T>(c.aqo.data(), s);
          }),
      fuzz::edit<C>(
          "combined antiquant_scale with a head size not a multiple of 32 (Q_S > 1)", true,
          is_prompt_combined<C>,
          [](C& c, fuzz::Rng& r) {  // every view over the same buffers with head size D' < D
            const Index d = c.D - r.range(1, 16);
            const std::string ol = c.layout == "BNSD_BSND" ? "BSND" : c.layout;
            c.in.query = StridedView<const T>(c.q.data(), shape(c.layout, c.B, c.S1, c.N, d));
            c.in.key = {StridedView<const K>(c.k.data(), shape(c.layout, c.B, c.S2, c.KVN, d))};
            c.in.value = {StridedView<const K>(c.v.data(), shape(c.layout, c.B, c.S2, c.KVN, d))};
            regrow_out(c, shape(ol, c.B, c.S1, c.N, d));
            if (c.in.antiquant_scale.rank() == 1) return;  // (2): any head size
            const std::vector<Index> s = combined_prompt_shape(c.layout, c.KVN, d);
            c.in.antiquant_scale = StridedView<const T>(c.aqs.data(), s);
            if (!c.aqo.empty()) c.in.antiquant_offset = StridedView<const T>(c.aqo.data(), s);
          }),
      fuzz::edit<C>("only the combined antiquant_scale with a bf16 query (Q_S > 1)", true,
                    is_prompt_separate<C>,
                    [](C& c, fuzz::Rng& r) {
                      const std::vector<Index> s =
                          r.chance(0.5) ? std::vector<Index>{2}
                                        : combined_prompt_shape(c.layout, c.KVN, c.D);
                      c.in.key_antiquant_scale = c.in.key_antiquant_offset = {};
                      c.in.value_antiquant_scale = c.in.value_antiquant_offset = {};
                      c.p.key_antiquant_mode = c.p.value_antiquant_mode = 0;
                      c.aqs.assign(z(2 * c.KVN * c.D), T(0.01f));
                      c.in.antiquant_scale = StridedView<const T>(c.aqs.data(), s);
                    }),
      fuzz::edit<C>("separate scales with a half query (Q_S > 1)", true, is_prompt_combined<C>,
                    [](C& c, fuzz::Rng& r) {  // per channel (KV_N, D), or per token (B, W)
                      const bool token = r.chance(0.5);
                      const Index kw = c.KVN * c.D, n = token ? c.B * c.W : kw;
                      const float* sp = spare(c, 2 * n);
                      const std::vector<Index> s =
                          token ? std::vector<Index>{c.B, c.W} : std::vector<Index>{c.KVN, c.D};
                      c.in.antiquant_scale = c.in.antiquant_offset = {};
                      c.p.key_antiquant_mode = c.p.value_antiquant_mode = token ? 1 : 0;
                      c.in.key_antiquant_scale = StridedView<const float>(sp, s);
                      c.in.value_antiquant_scale = StridedView<const float>(sp + n, s);
                    }),
      fuzz::edit<C>(
          "combined scales beside the separate ones (Q_S > 1)", true, is_prompt_separate<C>,
          [](C& c, fuzz::Rng& r) {
            if (r.chance(0.5)) {
              c.aqs.assign(z(2 * c.KVN * c.D), T(0.01f));
              c.in.antiquant_scale =
                  StridedView<const T>(c.aqs.data(), combined_prompt_shape(c.layout, c.KVN, c.D));
              return;
            }
            c.p.antiquant_mode = 1;
            c.tok_s.assign(z(2 * c.B * c.W), 0.01f);
            c.in.antiquant_scale_per_token =
                StridedView<const float>(c.tok_s.data(), {2, c.B, c.W});
          }),
      fuzz::edit<C>("per-token combined scales with Q_S > 1", true, is_prompt_combined<C>,
                    [](C& c, fuzz::Rng&) {
                      c.in.antiquant_scale = c.in.antiquant_offset = {};
                      c.p.antiquant_mode = 1;
                      c.tok_s.assign(z(2 * c.B * c.W), 0.01f);
                      c.in.antiquant_scale_per_token =
                          StridedView<const float>(c.tok_s.data(), {2, c.B, c.W});
                    }),
      // (the combined scales take a shared prefix since 14d3bcf)
      fuzz::edit<C>("shared prefix with the separate K / V scales and Q_S > 1", true,
                    is_prompt_separate<C>, add_prefix<C>),
  };
}

// Left padding with Q_S > 1 (cann/detail/fia_parts.hpp, fia_left_padding): pads past the
// slack, shapes of more than one value, pads without their lengths, and the layouts, caches and
// inputs it does not take (its paged-cache rejection is in paged_prompt_edits).
template <class C>
std::vector<fuzz::Perturbation<C>> padding_edits() {
  return {
      fuzz::edit<C>(
          "left padding past S - length (a window starting before position 0)", true,
          [](const C& c) {
            return paddable(c) &&
                   (!c.in.actual_seq_lengths.empty() || !c.in.actual_seq_lengths_kv.empty());
          },
          [](C& c, fuzz::Rng& r) {  // the longest sequence's window one or more rows too far
            const bool kv = c.in.actual_seq_lengths.empty() ||
                            (!c.in.actual_seq_lengths_kv.empty() && r.chance(0.5));
            const Index slack = kv ? c.S2 - max_of(c.kv_len) : c.S1 - max_of(c.q_len);
            const std::int64_t v =
                r.chance(0.2) ? std::numeric_limits<std::int64_t>::max() : slack + r.range(1, 3);
            set_pad(c, kv, v, r.chance(0.3) ? std::vector<Index>{} : std::vector<Index>{1}, false);
          }),
      fuzz::edit<C>("left padding of shape [2] or [1, 1]", true, paddable<C>,
                    [](C& c, fuzz::Rng& r) {  // (values 0)
                      set_pad(c, r.chance(0.5), 0,
                              r.chance(0.5) ? std::vector<Index>{2} : std::vector<Index>{1, 1},
                              false);
                    }),
      fuzz::edit<C>(
          "left padding without its actual lengths", true,
          [](const C& c) {
            return paddable(c) && (is_padded(c) || c.in.actual_seq_lengths.empty() ||
                                   c.in.actual_seq_lengths_kv.empty());
          },
          [](C& c, fuzz::Rng& r) {  // a padded side's lengths cleared, or a pad without them
            const bool q = c.qpad >= 0 || c.in.actual_seq_lengths.empty();
            const bool kv = c.kvpad >= 0 || c.in.actual_seq_lengths_kv.empty();
            const bool side = !q || (kv && r.chance(0.5));  // true: kv
            if ((side ? c.kvpad : c.qpad) >= 0)
              (side ? c.in.actual_seq_lengths_kv : c.in.actual_seq_lengths).clear();
            else
              set_pad(c, side, 0, {1}, false);
          }),
      fuzz::edit<C>(
          "left padding with TND", true, [](const C& c) { return c.layout == "TND"; }, add_pad<C>),
      fuzz::edit<C>(
          "left padding with a shared prefix (Q_S > 1)", true,
          [](const C& c) {
            return !c.incre && c.layout != "TND" && c.store != kPaged &&
                   (has_prefix(c) || is_padded(c));
          },
          [](C& c, fuzz::Rng& r) {  // (a pad on a side with its lengths when there is one)
            const bool q = !c.in.actual_seq_lengths.empty(),
                       kv = !c.in.actual_seq_lengths_kv.empty();
            if (has_prefix(c))
              set_pad(c, q == kv ? r.chance(0.5) : kv, 0, {1}, false);
            else
              add_prefix(c, r);
          }),
      fuzz::edit<C>("left padding with the separate K / V antiquant scales (Q_S > 1)", true,
                    is_prompt_separate<C>, add_pad<C>),
      fuzz::edit<C>(
          "left padding with a per-channel quant_scale2", true,
          [](const C& c) { return is_padded(c) && c.N * c.Dv > 1; },
          [](C& c, fuzz::Rng&) {
            c.in.quant_scale2 = StridedView<const float>(spare(c, c.N * c.Dv), {c.N, c.Dv});
          }),
  };
}

// Every group, built once per type pair.
template <class C>
const std::vector<fuzz::Perturbation<C>>& perturbations() {
  static const std::vector<fuzz::Perturbation<C>> list = [] {
    std::vector<fuzz::Perturbation<C>> all;
    for (auto&& group :
         {lse_edits<C>(), common_edits<C>(), prompt_edits<C>(), incre_edits<C>(), pse_edits<C>(),
          antiquant_edits<C>(), separate_edits<C>(), prefix_edits<C>(), paged_prompt_edits<C>(),
          prompt_aq_edits<C>(), padding_edits<C>()})
      all.insert(all.end(), group.begin(), group.end());
    return all;
  }();
  return list;
}

template <class C>
void restride_inputs(C& c, support::Restrider& r) {
  c.in.for_each_view([&](const std::string& name, auto& view) {
    if (name == "atten_mask" && c.compressed) return;  // 4 M elements, content not read
    r(name, view);
  });
}

// The int8-query probe's call: int8 query / key / value of the configuration's shapes with their
// per-tensor scales, and a prefix of two rows (paged: the block table instead).
void call_int8(Fia<half, half>& c, bool run, int threads) {
  static const float unit[1] = {1.0f};
  const std::string pl = prefix_layout(c);
  attnref::FusedInferAttentionScoreInputs<i8> in;
  in.query = StridedView<const i8>(c.q8.data(), c.in.query.shape());
  in.key = {StridedView<const i8>(c.k8.data(), c.in.key[0].shape())};
  in.value = {StridedView<const i8>(c.v8.data(), c.in.value[0].shape())};
  if (c.store == kPaged) {
    in.block_table = c.in.block_table;
  } else {
    in.key_shared_prefix = StridedView<const i8>(c.p8.data(), shape(pl, 1, 2, c.KVN, c.D));
    in.value_shared_prefix = StridedView<const i8>(c.p8.data(), shape(pl, 1, 2, c.KVN, c.Dv));
  }
  in.atten_mask = c.in.atten_mask;
  in.actual_seq_lengths = c.in.actual_seq_lengths;
  in.actual_seq_lengths_kv = c.in.actual_seq_lengths_kv;
  in.deq_scale1 = in.quant_scale1 = in.deq_scale2 = StridedView<const float>(unit, {1});
  const attnref::FusedInferAttentionScoreOutputs<half> o{c.out, c.lse_out};
  if (run)
    attnref::fused_infer_attention_score(c.p, in, o, {threads});
  else
    attnref::validate(c.p, in, o);
}

// The call (run) or validate() (!run).
template <class C>
void invoke(C& c, bool run, int threads) {
  if constexpr (std::is_same_v<C, Fia<half, half>>)
    if (c.int8_query) return call_int8(c, run, threads);
  const attnref::FusedInferAttentionScoreOutputs<typename C::Q> o{c.out, c.lse_out};
  if (run)
    attnref::fused_infer_attention_score(c.p, c.in, o, {threads});
  else
    attnref::validate(c.p, c.in, o);
}

template <class C>
void validate_only(C& c) {
  invoke(c, false, 0);
}

template <class T, class K>
void run_t(fuzz::Run& run, std::uint64_t seed) {
  using C = Fia<T, K>;
  fuzz::run_case(
      run, seed, perturbations<C>(), build<C>, fuzz::Named{"fused_infer_attention_score"},
      [seed](C& c) {
        fuzz::call_expecting_range(c.want_out_of_range,
                                   [&] { invoke(c, true, static_cast<int>(seed % 2 + 1)); });
      },
      verify<C>, &C::q, &C::k, &C::v, &C::o, &C::lse, &C::mask, &C::table, &C::sink, &C::pse,
      &C::pk, &C::pv, &C::aqs, &C::aqo, &C::tok_s, &C::tok_o, &C::ks, &C::ko, &C::vs, &C::vo,
      &C::spare, &C::q8, &C::k8, &C::v8, &C::p8, &C::pads);
}

// Cases 2k and 2k + 1 (one and two threads) share a type pair: half and bf16 data (each a third
// of the cases), int8 K/V with a half or bf16 query (a sixth each).
void run(fuzz::Run& run, std::uint64_t seed) {
  switch (seed / 2 % 6) {
    case 0:
    case 1:
      return run_t<half, half>(run, seed);
    case 2:
    case 3:
      return run_t<bfloat16, bfloat16>(run, seed);
    case 4:
      return run_t<half, i8>(run, seed);
    default:
      return run_t<bfloat16, i8>(run, seed);
  }
}

const fuzz::Register reg("fused_infer_attention_score", run);

}  // namespace fuzz_fia
