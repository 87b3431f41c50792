// Fuzz entry "fused_infer_attention_score_rope": FusedInferAttentionScore's split rope inputs
// (query_rope / key_rope, V3+), score = scale·(q·k + q_rope·k_rope) with V the value alone, against
// the naive reference on concatenated heads (q = [q | q_rope], k = [k | k_rope]).
// MLA (half or bf16; head size 512 + rope 64, one kv head, N in {1, 2, 4, 8} or 16): BSH / BSND /
// BNSD with Q_S 1 (sparse_mode 0, no mask) or 2–4, rarely 16 (sparse_mode 3, rightDownCausal, the
// 2048 x 2048 mask, content never read), TND with per-batch query lengths 0–4, rarely 16
// (sparse_mode 0 or 3); a paged cache ([blockNum, blockSize, 512], or [blockNum, 1,
// blockSize, 512] with a BNSD / TND query; blocks of 16, rarely 128), a shuffled block table (-1
// past each sequence's blocks), NaN in spare blocks and in rows past each sequence's length; kv
// lengths per batch (never cumulative), 0 and shorter than Q_S included (a row without keys is
// exactly 0); a quarter of the cases write the head-major output of BSH_NBSD / BSND_NBSD /
// BNSD_NBSD ([N, B, S, D]) or TND_NTD ([N, T, D]), the query read in the base layout. 5 % of
// the MLA cases use the sliding window (sparse_mode 4: BSND, 128 heads, pre_tokens 1–2048,
// next_tokens 0, Q_S 1–4, rarely up to 16): row i of batch b sees keys [i + kv_b - q_b - pre,
// i + kv_b - q_b], with per-batch query rows q_b <= Q_S in half of them (actual_seq_lengths; rows
// i >= q_b exactly 0) and kv_b >= q_b; over a paged cache with blocks of 64 or 128 or a
// contiguous BSND cache (key / value [B, S2, 1, 512], key_rope [B, S2, 1, 64], no block table,
// NaN past each sequence, actual_seq_lengths_kv given or not). Tolerance
// 1e-4 + rel·|want|, rel 1/128 (bf16) or 1/1024 (half). Head size 128 + rope 64 (bf16, the
// prompt branch): TND, GQA, cumulative lengths, sparse_mode 0 or 3 (any of PFA's compressed-mask
// forms), softmax_lse on or off (+inf for a row without keys). Random exec tiling; one or two
// threads. Perturbations: the rules of cann/detail/fia_rope.hpp (MLA's heads, Q_S, sparse modes,
// masks, layouts and head-major outputs, features, cache shapes and block sizes, block table,
// lengths; the sliding window's layout, heads, pre / next tokens, block sizes, query lengths past
// Q_S, kv lengths below the query rows, contiguous caches of other shapes, with a block table or
// without the window; head 128's layout, type and head sizes), each rejection leaving every
// buffer untouched; a used block-table entry out of range must raise std::out_of_range.

#include <attnref/attnref.hpp>
#include <limits>
#include <type_traits>

#include "fuzz/fuzz.hpp"
#include "reference/naive_attention.hpp"
#include "support/views.hpp"

namespace fuzz_fia_rope {

using attnref::bfloat16;
using attnref::half;
using attnref::StridedView;
using fuzz::Index;
using Rng = fuzz::Rng;
using Shape = std::vector<Index>;
using i32 = std::int32_t;
using i64 = std::int64_t;

constexpr Index kR = 64;  // the rope head size
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kOutSentinel = 777.0f;
constexpr float kLseSentinel = 4321.0f;

size_t z(Index i) { return static_cast<size_t>(i); }

// n normal draws into p, cheaply: 2^16 draws made once, each picked by 16 random bits.
template <class T>
void draw_normals(Rng& r, T* p, Index n) {
  static const std::vector<float> pool = fuzz::Rng(20240611).normals<float>(1 << 16);
  std::uint64_t bits = 0;
  for (Index i = 0; i < n; ++i, bits >>= 16) {
    if (i % 4 == 0) bits = r.g();
    p[i] = T(pool[bits & 0xffff]);
  }
}

// The compressed mask (zeros, never read), twice 2048 x 2048 so that a [2, 2048, 2048] view stays
// in bounds.
StridedView<const std::uint8_t> mask_of(const Shape& s) {
  static const std::vector<std::uint8_t> m(2 * 2048 * 2048, 0);
  return StridedView<const std::uint8_t>(m.data(), s);
}

template <class T>
struct Rope {
  using Q = T;
  bool mla = true;  // head size 512 (else the head-128 prompt-branch configuration)
  std::string layout;
  Index B = 1, N = 1, KVN = 1, D = 512, S = 0, T1 = 0, T2 = 0;  // S: non-TND Q_S
  Index bs = 16, nb = 0, mb = 0;             // MLA: block size, blocks, table columns
  bool rank4 = false;                        // MLA cache [blockNum, 1, blockSize, W]
  bool window = false;                       // MLA's sliding window (sparse_mode 4)
  bool contiguous = false;                   // (window) the cache as [B, S2, 1, W] tensors
  Index S2 = 0;                              // the contiguous cache's S
  bool nmajor = false;                       // MLA's head-major output: *_NBSD, TND_NTD
  std::vector<Index> q_len, kv_len, q0, k0;  // per batch; q0 / k0: TND offsets (B + 1)
  std::vector<T> q, qr, k, v, kr, o, junk;   // junk: views the operator must reject or ignore
  std::vector<float> lse;
  std::vector<i32> table;
  attnref::FusedInferAttentionScoreParams p;
  attnref::FusedInferAttentionScoreInputs<T> in;
  StridedView<T> out;
  StridedView<float> lse_out;
  attnref::ExecConfig ex;
  bool want_out_of_range = false;  // the perturbation must raise std::out_of_range
};

// A query-shaped tensor with head size w in the layout (TND: T rows).
template <class C>
Shape qshape(const C& c, Index w) {
  if (c.layout == "TND") return {c.T1, c.N, w};
  if (c.layout == "BSH") return {c.B, c.S, c.N * w};
  if (c.layout == "BNSD") return {c.B, c.N, c.S, w};
  return {c.B, c.S, c.N, w};
}

// Offset of query-shaped element (b, i, h, 0) with head size w.
template <class C>
Index qat(const C& c, Index b, Index i, Index h, Index w) {
  if (c.layout == "TND") return ((c.q0[z(b)] + i) * c.N + h) * w;
  if (c.layout == "BNSD") return ((b * c.N + h) * c.S + i) * w;
  return ((b * c.S + i) * c.N + h) * w;
}

// The output's shape and the offset of its row (b, i, h): the query's, or head-major (*_NBSD
// [N, B, S, D], TND_NTD [N, T, D]).
template <class C>
Shape oshape(const C& c, bool nmajor) {
  if (!nmajor) return qshape(c, c.D);
  return c.layout == "TND" ? Shape{c.N, c.T1, c.D} : Shape{c.N, c.B, c.S, c.D};
}
template <class C>
Index oat(const C& c, Index b, Index i, Index h) {
  if (!c.nmajor) return qat(c, b, i, h, c.D);
  if (c.layout == "TND") return (h * c.T1 + c.q0[z(b)] + i) * c.D;
  return ((h * c.B + b) * c.S + i) * c.D;
}

// The head-major layout of the query's (*_NBSD, TND_NTD), the output of its shape (base_out, a
// perturbation: of the base layout's).
template <class C>
void head_major(C& c, bool base_out = false) {
  c.nmajor = true;
  c.p.input_layout = c.layout == "TND" ? "TND_NTD" : c.layout + "_NBSD";
  c.out = StridedView<typename C::Q>(c.o.data(), oshape(c, !base_out));
}

// Offset of key-side row (b, t, h) of width w: MLA's cache row (paged or contiguous), or head
// 128's TND token.
template <class C>
Index kat(const C& c, Index b, Index t, Index h, Index w) {
  if (c.mla && c.contiguous) return (b * c.S2 + t) * w;
  if (c.mla) return (c.table[z(b * c.mb + t / c.bs)] * c.bs + t % c.bs) * w;
  return ((c.k0[z(b)] + t) * c.KVN + h) * w;
}

template <class C>
Shape lse_shape(const C& c) {
  return c.layout == "TND" ? Shape{c.T1, c.N, 1} : Shape{c.B, c.N, c.S, 1};
}

// A buffer of n (at least 1) elements: x, or normal draws.
template <class T>
void fresh(std::vector<T>& v, Index n, T x, Rng* r = nullptr) {
  v.assign(z(std::max<Index>(1, n)), x);
  if (r != nullptr) draw_normals(*r, v.data(), n);
}

std::vector<i64> cumulative(std::vector<Index>& at, const std::vector<Index>& len) {
  std::vector<i64> out;
  at.assign(1, 0);
  for (Index l : len) at.push_back(at.back() + l), out.push_back(at.back());
  return out;
}

// Every view of q / qr / k / v / kr: MLA's caches of rank 3 or 4 (contiguous: [B, S2, 1, W]),
// head 128's TND tensors.
template <class C>
void set_views(C& c) {
  using CT = StridedView<const typename C::Q>;
  const auto kv = [&](Index w) {
    return !c.mla         ? Shape{c.T2, c.KVN, w}
           : c.contiguous ? Shape{c.B, c.S2, 1, w}
           : c.rank4      ? Shape{c.nb, 1, c.bs, w}
                          : Shape{c.nb, c.bs, w};
  };
  c.in.query = CT(c.q.data(), qshape(c, c.D)), c.in.query_rope = CT(c.qr.data(), qshape(c, kR));
  c.in.key = {CT(c.k.data(), kv(c.D))}, c.in.value = {CT(c.v.data(), kv(c.D))};
  c.in.key_rope = CT(c.kr.data(), kv(kR));
}

// The query (normal draws), the views, output and softmax_lse (sentinels) and the exec config
// (tiling changes rounding, not semantics).
template <class C>
void finish(C& c, Rng& r) {
  using T = typename C::Q;
  const Index rows = (c.layout == "TND" ? c.T1 : c.B * c.S) * c.N;
  fresh(c.q, rows * c.D, T(0.0f), &r), fresh(c.qr, rows * kR, T(0.0f), &r);
  set_views(c);
  fresh(c.o, rows * c.D, T(kOutSentinel));
  c.out = StridedView<T>(c.o.data(), qshape(c, c.D));
  fresh(c.lse, rows, kLseSentinel);
  if (c.p.softmax_lse_flag || r.chance(0.4))  // flag off: given (never written) or absent
    c.lse_out = StridedView<float>(c.lse.data(), lse_shape(c));
  c.p.num_heads = c.N, c.p.input_layout = c.layout;
  if (r.chance(0.3)) c.ex.kv_split = r.range(8, 64);
  if (r.chance(0.8)) c.ex.kv_tile = r.range(8, 64);  // (the default 256: 2 MB of scratch)
  if (r.chance(0.2)) c.ex.q_tile = r.range(1, 4);
}

// What a rebuilt MLA case must have (0: drawn as usual): N, non-TND Q_S, block size, a TND batch
// of that many query rows; win: the sliding window (sparse_mode 4), in `layout` (null: BSND),
// over a contiguous cache (flat 1), a paged one (-1) or either (0), small (one batch, one or two
// query rows, a few keys: the perturbations' window cases, whose 128 heads cost).
struct Force {
  Index n = 0, qs = 0, bs = 0, tnd_len = 0;
  bool win = false;
  const char* layout = nullptr;
  int flat = 0;
  bool small = false;
};

// The latent cache of kv_len[b] rows per batch: a pool of shuffled blocks of c.bs rows with a
// block table (NaN wherever no sequence owns a row) or, contiguous, [B, S2, 1, W] tensors (NaN
// past each sequence).
template <class C>
void make_cache(C& c, Rng& r) {
  using T = typename C::Q;
  Index rows = 0;
  std::vector<i32> ids;
  if (c.contiguous) {
    rows = c.B * c.S2;
  } else {
    Index used = 0, most = 0;
    for (Index l : c.kv_len)
      used += (l + c.bs - 1) / c.bs, most = std::max(most, (l + c.bs - 1) / c.bs);
    c.mb = std::max<Index>(1, most + r.range(0, 1));
    c.nb = used + (r.chance(0.7) ? 1 : 2);  // spare blocks: never referenced, NaN
    for (Index i = 0; i < c.nb; ++i) ids.push_back(static_cast<i32>(i));
    std::shuffle(ids.begin(), ids.end(), r.g);
    c.table.assign(z(c.B * c.mb), -1);
    rows = c.nb * c.bs;
  }
  fresh(c.k, rows * 512, T(kNaN)), fresh(c.v, rows * 512, T(kNaN)), fresh(c.kr, rows * kR, T(kNaN));
  Index next = 0;
  for (Index b = 0; b < c.B; ++b)
    for (Index t = 0; t < c.kv_len[z(b)]; ++t) {
      if (!c.contiguous && t % c.bs == 0) c.table[z(b * c.mb + t / c.bs)] = ids[z(next++)];
      draw_normals(r, c.k.data() + kat(c, b, t, 0, 512), 512);
      draw_normals(r, c.v.data() + kat(c, b, t, 0, 512), 512);
      draw_normals(r, c.kr.data() + kat(c, b, t, 0, kR), kR);
    }
  if (!c.contiguous) c.in.block_table = StridedView<const i32>(c.table.data(), {c.B, c.mb});
}

// A list of per-batch lengths, sometimes one value for all when they agree (it broadcasts).
std::vector<i64> lengths(Rng& r, const std::vector<Index>& len) {
  std::vector<i64> out(len.begin(), len.end());
  if (std::all_of(len.begin(), len.end(), [&](Index l) { return l == len[0]; }) && r.chance(0.3))
    out.resize(1);
  return out;
}

// MLA's sliding window (sparse_mode 4; BSND, 128 heads, pre_tokens in [1, 2048], next_tokens 0):
// per-batch query rows q_b <= Q_S sometimes (actual_seq_lengths; rows past them 0), kv_b >= q_b,
// a paged cache with blocks of 64 or 128 or contiguous BSND tensors (kv lengths optional).
template <class C>
void build_window(C& c, Rng& r, const Force& f) {
  c.window = true;
  c.layout = f.layout ? f.layout : "BSND";
  c.N = f.n ? f.n : 128;
  c.S = f.small          ? r.range(1, 2)
        : r.chance(0.4)  ? 1
        : r.chance(0.6)  ? 2
        : r.chance(0.85) ? r.range(3, 4)
                         : r.range(5, 16);
  c.B = f.small || c.S > 4 ? 1 : c.S == 1 && r.chance(0.15) ? 3 : r.chance(0.2) ? 2 : 1;
  c.contiguous = f.flat ? f.flat > 0 : !f.bs && r.chance(0.4);
  c.bs = f.bs ? f.bs : r.chance(0.7) ? 64 : 128;
  c.rank4 = c.layout == "BNSD" && !c.contiguous && r.chance(0.5);
  const Index pre = r.chance(0.5)   ? r.range(1, 8)
                    : r.chance(0.6) ? r.range(9, 80)
                                    : r.range(81, 2048);
  const bool qlens = r.chance(0.5);  // actual_seq_lengths: each batch's query rows
  for (Index b = 0; b < c.B; ++b) {  // (128 heads: caches past 70 keys with 1 or 2 rows only)
    const Index q = !qlens || r.chance(0.3) ? c.S : r.range(0, c.S);
    const Index top = f.small ? 8 : r.chance(0.65) ? 24 : c.B * c.S > 2 ? 70 : 140;
    c.q_len.push_back(q);
    c.kv_len.push_back(q + (r.chance(0.15) ? 0 : r.range(1, top)));
  }
  if (qlens) c.in.actual_seq_lengths = lengths(r, c.q_len);
  bool kv_given = true;
  if (c.contiguous) {
    c.S2 = *std::max_element(c.kv_len.begin(), c.kv_len.end()) + r.range(0, 2);
    kv_given = r.chance(0.6);
    if (!kv_given) c.kv_len.assign(z(c.B), c.S2);  // absent: every batch S2 keys
  }
  make_cache(c, r);
  if (kv_given) c.in.actual_seq_lengths_kv = lengths(r, c.kv_len);
  c.p.sparse_mode = 4;
  c.in.atten_mask = mask_of({2048, 2048});
  c.p.pre_tokens = pre;
  c.p.next_tokens = 0;
  c.p.num_key_value_heads = 1;
  c.p.scale_value = std::uniform_real_distribution<double>(0.5, 2.0)(r.g) / 24;
  c.p.block_size = c.contiguous ? 0 : c.bs, c.p.inner_precise = r.range(0, 1);
  finish(c, r);
}

template <class C>
void build_mla(C& c, Rng& r, const Force& f) {
  if (f.win) return build_window(c, r, f);
  static const char* layouts[] = {"BSH", "BSND", "BNSD", "TND"};
  static const Index heads[] = {1, 2, 4, 8};
  c.layout = f.tnd_len ? "TND" : layouts[r.range(0, f.qs ? 2 : 3)];
  const bool tnd = c.layout == "TND";
  c.N = f.n ? f.n : r.chance(0.03) ? 16 : heads[r.range(0, 3)];
  c.B = r.range(1, 3);
  c.bs = f.bs ? f.bs : r.chance(0.04) ? 128 : 16;
  c.rank4 = (c.layout == "BNSD" || tnd) && r.chance(0.5);
  c.S = tnd ? 0 : f.qs ? f.qs : r.chance(0.4) ? 1 : r.chance(0.03) ? 16 : r.range(2, 4);
  const Index top = c.bs == 128 && r.chance(0.3) ? 160 : 60;
  for (Index b = 0; b < c.B; ++b) {
    c.q_len.push_back(!tnd ? c.S : r.chance(0.02) ? 16 : r.range(0, 4));
    c.kv_len.push_back(r.chance(0.12)   ? 0
                       : r.chance(0.15) ? r.range(1, 4)
                                        : r.range(1, r.chance(0.5) ? 24 : top));
  }
  if (f.tnd_len) c.q_len[z(r.range(0, c.B - 1))] = f.tnd_len;
  if (tnd) c.in.actual_seq_lengths = cumulative(c.q0, c.q_len);
  c.T1 = tnd ? c.q0.back() : 0;
  make_cache(c, r);
  c.in.actual_seq_lengths_kv.assign(c.kv_len.begin(), c.kv_len.end());  // (never cumulative)
  c.p.sparse_mode = tnd ? (r.chance(0.5) ? 3 : 0) : (c.S > 1 ? 3 : 0);
  if (c.p.sparse_mode == 3) c.in.atten_mask = mask_of({2048, 2048});
  c.p.num_key_value_heads = c.N == 1 && r.chance(0.2) ? 0 : 1;
  c.p.scale_value = std::uniform_real_distribution<double>(0.5, 2.0)(r.g) / 24;
  c.p.block_size = c.bs, c.p.inner_precise = r.range(0, 1);
  finish(c, r);
  if (r.chance(0.25)) head_major(c);
}

// The head-128 configuration (D: 128; others only for the perturbations): TND, GQA, cumulative
// lengths, sparse_mode 0 or 3, softmax_lse on or off.
template <class C>
void build_128(C& c, Rng& r, Index D) {
  using T = typename C::Q;
  static const Index heads[] = {1, 2, 4};
  static const Shape forms[] = {{2048, 2048}, {1, 2048, 2048}, {1, 1, 2048, 2048}};
  c.mla = false, c.layout = "TND", c.D = D;
  c.N = heads[r.range(0, 2)];
  c.KVN = c.N >> r.range(0, c.N == 4 ? 2 : c.N / 2);
  c.B = r.range(1, 3);
  for (Index b = 0; b < c.B; ++b) {
    c.q_len.push_back(r.chance(0.1) ? 0 : r.range(1, 6));
    c.kv_len.push_back(r.chance(0.12) ? 0 : r.range(1, 20));
  }
  c.in.actual_seq_lengths = cumulative(c.q0, c.q_len);
  c.in.actual_seq_lengths_kv = cumulative(c.k0, c.kv_len);
  c.T1 = c.q0.back(), c.T2 = c.k0.back();
  fresh(c.k, c.T2 * c.KVN * D, T(0.0f), &r), fresh(c.kr, c.T2 * c.KVN * kR, T(0.0f), &r);
  fresh(c.v, c.T2 * c.KVN * D, T(0.0f), &r);
  c.p.sparse_mode = r.chance(0.5) ? 3 : 0;
  if (c.p.sparse_mode == 3) c.in.atten_mask = mask_of(forms[r.range(0, 2)]);
  c.p.num_key_value_heads = c.KVN == c.N && r.chance(0.3) ? 0 : c.KVN;
  c.p.scale_value = std::uniform_real_distribution<double>(0.5, 2.0)(r.g) / std::sqrt(192.0);
  c.p.inner_precise = r.range(0, 3), c.p.softmax_lse_flag = r.chance(0.6);
  finish(c, r);
}

// bf16: MLA or head 128; half: MLA (head 128 in half is a perturbation); 5 % of the MLA cases
// the sliding window (its 128 heads make its cases the costliest).
template <class C>
void build(C& c, Rng& r) {
  if (std::is_same_v<typename C::Q, bfloat16> && r.chance(0.3)) return build_128(c, r, 128);
  Force f;
  f.win = r.chance(0.05);
  build_mla(c, r, f);
}

// A perturbation's fresh case: MLA with f, or (d128 > 0) the head-128 one with head size d128.
template <class C>
void rebuild(C& c, Rng& r, const Force& f, Index d128 = 0) {
  c = C{};
  d128 > 0 ? build_128(c, r, d128) : build_mla(c, r, f);
}

// A sliding-window case (over a contiguous cache when flat > 0): c itself when it is one, else a
// fresh small one (the window's perturbations apply to every MLA case that way).
template <class C>
void to_window(C& c, Rng& r, int flat = 0) {
  if (c.window && (flat == 0 || c.contiguous == (flat > 0))) return;
  Force f;
  f.win = true, f.flat = flat, f.small = true;
  rebuild(c, r, f);
}

// ---- The reference ---------------------------------------------------------------------------

// Appends d elements of a from ia, then r of b from ib (a row [x | x_rope]), as doubles.
template <class X>
void cat(std::vector<double>& to, const std::vector<X>& a, Index ia, const std::vector<X>& b,
         Index ib, Index d, Index r = kR) {
  for (Index e = 0; e < d + r; ++e)
    to.push_back(static_cast<float>(e < d ? a[z(ia + e)] : b[z(ib + e - d)]));
}

template <class C>
std::string verify(const C& c) {
  const Index D = c.D;
  ref::Problem pr;
  pr.num_heads = static_cast<int>(c.N);
  pr.num_kv_heads = static_cast<int>(c.KVN);
  pr.head_size = static_cast<int>(D + kR);
  pr.v_head_size = static_cast<int>(D);
  pr.scale = c.p.scale_value;
  pr.causal = c.p.sparse_mode >= 3 ? ref::Causal::kBottomRight : ref::Causal::kNone;
  // sparse_mode 4: keys [i' - pre, i'], i' = i + kv_b - q_b
  pr.window = c.window ? static_cast<int>(c.p.pre_tokens) + 1 : 0;
  ref::Seqs qs(z(c.B)), ks(z(c.B)), vs(z(c.B));
  for (Index b = 0; b < c.B; ++b) {
    pr.q_len.push_back(static_cast<int>(c.q_len[z(b)]));
    pr.kv_len.push_back(static_cast<int>(c.kv_len[z(b)]));
    for (Index i = 0; i < c.q_len[z(b)]; ++i)
      for (Index h = 0; h < c.N; ++h)
        cat(qs[z(b)], c.q, qat(c, b, i, h, D), c.qr, qat(c, b, i, h, kR), D);
    for (Index t = 0; t < c.kv_len[z(b)]; ++t)
      for (Index h = 0; h < c.KVN; ++h) {
        cat(ks[z(b)], c.k, kat(c, b, t, h, D), c.kr, kat(c, b, t, h, kR), D);
        cat(vs[z(b)], c.v, kat(c, b, t, h, D), c.v, 0, D, 0);
      }
  }
  const ref::Result want = ref::attention(pr, qs, ks, vs);
  const double rel = std::is_same_v<typename C::Q, bfloat16> ? 1.0 / 128 : 1.0 / 1024;
  const double inf = std::numeric_limits<double>::infinity();
  for (Index b = 0; b < c.B; ++b) {
    const Index ql = c.q_len[z(b)];
    for (Index i = 0; i < ql; ++i)
      for (Index h = 0; h < c.N; ++h) {
        const std::string where = "(b, i, h) (" + std::to_string(b) + ", " + std::to_string(i) +
                                  ", " + std::to_string(h) + ")";
        const double l = want.lse[z(b)][z(h * ql + i)];
        const Index at = oat(c, b, i, h);
        for (Index e = 0; e < D; ++e) {
          const double g = static_cast<float>(c.o[z(at + e)]);
          const double w = want.o[z(b)][z((i * c.N + h) * D + e)];
          const bool ok = l == -inf ? g == 0.0 : std::fabs(g - w) <= 1e-4 + rel * std::fabs(w);
          if (!ok)
            return where + " element " + std::to_string(e) + ": got " + std::to_string(g) +
                   ", want " + std::to_string(w) + (l == -inf ? " (no visible key)" : "");
        }
        if (!c.p.softmax_lse_flag) continue;  // (the flag: TND only)
        const double got = c.lse[z((c.q0[z(b)] + i) * c.N + h)];
        const bool ok = l == -inf ? got == inf : std::fabs(got - l) <= 1e-4 * (1 + std::fabs(l));
        if (!ok)
          return "softmax_lse " + where + ": got " + std::to_string(got) + ", want " +
                 std::to_string(l == -inf ? inf : l);
      }
    // The sliding window's rows past the batch's query length: exactly 0.
    for (Index i = ql; c.layout != "TND" && i < c.S; ++i)
      for (Index h = 0; h < c.N; ++h)
        for (Index e = 0; e < D; ++e)
          if (!(static_cast<float>(c.o[z(oat(c, b, i, h) + e)]) == 0.0f))
            return "(b, i, h) (" + std::to_string(b) + ", " + std::to_string(i) + ", " +
                   std::to_string(h) + ") past the query length " + std::to_string(ql) + ": not 0";
  }
  if (!c.p.softmax_lse_flag)
    for (float x : c.lse)
      if (!(x == kLseSentinel)) return "softmax_lse written with softmax_lse_flag off";
  return "";
}

// ---- Perturbations ---------------------------------------------------------------------------

// One of `list`, at random.
template <class X>
X pick(Rng& r, const std::vector<X>& list) {
  return list[z(r.range(0, static_cast<Index>(list.size()) - 1))];
}

template <class C>
using Ok = bool (*)(const C&);
template <class C>
using Change = void (*)(C&, Rng&);

// Dimension d of v, a view of buf, set to e; buf grows to match (in bounds if wrongly accepted).
template <class U, class V>
void bump(std::vector<U>& buf, StridedView<V>& v, int d, Index e) {
  v = support::resized(v, d, e);
  buf.resize(std::max(buf.size(), z(std::max<Index>(1, v.numel()))), U(kOutSentinel));
  v = support::with_data(v, buf.data());
}

template <class C>
const std::vector<fuzz::Perturbation<C>>& perturbations() {
  using T = typename C::Q;
  using CT = StridedView<const T>;
  // must: attnref must reject; fine: defined (applicable when ok holds, null: always).
  const auto must = [](auto n, Ok<C> o, Change<C> f) { return fuzz::edit<C>(n, true, o, f); };
  const auto fine = [](auto n, Ok<C> o, Change<C> f) { return fuzz::edit<C>(n, false, o, f); };
  const Ok<C> mla = [](const C& c) { return c.mla; };
  const Ok<C> h128 = [](const C& c) { return !c.mla; };
  const Ok<C> paged = [](const C& c) { return c.mla && !c.contiguous; };  // MLA's paged cache
  static const std::vector<fuzz::Perturbation<C>> list{
      must("query_rope or key_rope missing", nullptr,
           [](C& c, Rng& r) { (r.chance(0.5) ? c.in.query_rope : c.in.key_rope) = {}; }),
      // MLA's heads, Q_S and features.
      must("num_key_value_heads not 1 (MLA)", mla,
           [](C& c, Rng& r) {
             static const std::int64_t bad[] = {0, -1, 2, 3, 4};  // (0: N, allowed with N = 1)
             c.p.num_key_value_heads = bad[r.range(c.N > 1 ? 0 : 1, 4)];
           }),
      must("num_heads not a power of two or past 128 (MLA)", mla,
           [](C& c, Rng& r) {  // (the query of that N: BSH divides its hidden size by N)
             static const Index odd[] = {3, 5, 6, 12};
             static const std::int64_t bad[] = {0, -2, 256};
             if (c.layout == "BSH" || r.chance(0.6)) return rebuild(c, r, {odd[r.range(0, 3)]});
             c.p.num_heads = bad[r.range(0, 2)];
           }),
      must("Q_S, or a TND batch's query rows, 17 or more (MLA)", mla,
           [](C& c, Rng& r) {
             const Index n = r.range(1, 2), q = r.range(17, 20);
             rebuild(c, r, r.chance(0.5) ? Force{n, q} : Force{n, 0, 0, q});
           }),
      must("softmax_lse_flag with MLA", mla,
           [](C& c, Rng&) {
             c.p.softmax_lse_flag = true;
             c.lse_out = StridedView<float>(c.lse.data(), lse_shape(c));
           }),
      must("pse, sink, kv padding, antiquant, quant scales or a shared prefix with MLA", mla,
           [](C& c, Rng& r) {
             const Index rows = c.layout == "TND" ? c.T1 : c.S, cols = c.mb * c.bs,
                         w = r.range(0, 7);
             static const float one[1] = {1.0f};  // (read-only memory: a write would crash)
             static const i64 pad[1] = {0};
             static const bfloat16 sink[16] = {};
             c.junk.assign(z(std::max<Index>(c.N * rows * cols, 1024)), T(0.01f));
             const StridedView<const float> f(one, {1});
             if (w == 0) c.in.pse_shift = CT(c.junk.data(), {1, c.N, rows, cols});
             if (w == 1) c.in.learnable_sink = StridedView<const bfloat16>(sink, {c.N});
             if (w == 2) c.in.kv_padding_size = StridedView<const i64>(pad, {1});
             if (w == 3) c.in.antiquant_scale = CT(c.junk.data(), {2, 512});
             if (w == 4)
               c.in.key_shared_prefix = c.in.value_shared_prefix = CT(c.junk.data(), {1, 1, 512});
             if (w == 5) c.in.actual_shared_prefix_len = {1};
             if (w == 6)
               (r.chance(0.5) ? c.in.key_antiquant_scale : c.in.value_antiquant_scale) = f;
             if (w == 7) (r.chance(0.5) ? c.in.deq_scale1 : c.in.quant_scale2) = f;
           }),
      must("inner_precise 2 or 3 with MLA", mla,
           [](C& c, Rng& r) { c.p.inner_precise = r.range(2, 3); }),
      must(
          "key / value tensor lists (MLA)", mla,
          [](C& c, Rng&) { c.in.key.push_back(c.in.key[0]), c.in.value.push_back(c.in.value[0]); }),
      // MLA's sparse modes, masks and layouts.
      must(
          "sparse_mode 3 with Q_S 1 (MLA)", [](const C& c) { return c.mla && c.S == 1; },
          [](C& c, Rng& r) {
            c.p.sparse_mode = 3;
            if (r.chance(0.7)) c.in.atten_mask = mask_of({2048, 2048});
          }),
      must(
          "sparse_mode 4 outside the sliding window's rules (MLA: heads not 128, not BSND, or "
          "pre_tokens / next_tokens left at their defaults)",
          [](const C& c) { return c.mla && !c.window; }, [](C& c, Rng&) { c.p.sparse_mode = 4; }),
      must("sparse_mode 1, 2 or out of range, or 0 with Q_S > 1 (MLA)", mla,
           [](C& c, Rng& r) {
             const bool zero = c.S > 1 && r.chance(0.4);
             if (zero) c.in.atten_mask = {};
             c.p.sparse_mode = zero ? 0 : r.chance(0.8) ? r.range(1, 2) : r.chance(0.5) ? -1 : 5;
           }),
      must(
          "atten_mask with sparse_mode 0 (MLA)",
          [](const C& c) { return c.mla && c.p.sparse_mode == 0; },
          [](C& c, Rng& r) {
            c.in.atten_mask =
                mask_of(r.chance(0.7) ? Shape{2048, 2048} : Shape{c.B, 1, 1, c.mb * c.bs});
          }),
      must(
          "atten_mask missing or of another shape with sparse_mode 3 or 4",
          [](const C& c) { return c.p.sparse_mode >= 3; },
          [](C& c, Rng& r) {
            static const Shape bad[] = {
                {2048, 2047}, {2047, 2048}, {2, 2048, 2048}, {1, 2048, 2048}, {1, 1, 2048, 2048}};
            const Index w = r.range(0, c.mla ? 5 : 3);  // head 128 takes PFA's rank-3 / 4 forms
            c.in.atten_mask = w == 0 ? StridedView<const std::uint8_t>{} : mask_of(bad[w - 1]);
          }),
      must("a head-major layout (*_NBSD, TND_NTD) without rope or with head size 128", nullptr,
           [](C& c, Rng&) {
             head_major(c);  // (head 128: TND_NTD)
             if (c.mla) c.in.query_rope = c.in.key_rope = {};
           }),
      must(
          "a head-major layout with an output of the base layout's shape",
          [](const C& c) { return c.mla && oshape(c, true) != oshape(c, false); },
          [](C& c, Rng&) { head_major(c, true); }),
      must(
          "BNSD_BSND layout with MLA",
          [](const C& c) { return c.mla && (c.layout == "BSND" || c.layout == "BNSD"); },
          [](C& c, Rng&) { c.p.input_layout = "BNSD_BSND"; }),
      // Rope shapes (both configurations).
      must("query_rope or key_rope of head size 32", nullptr,
           [](C& c, Rng& r) {
             auto& x = r.chance(0.5) ? c.in.query_rope : c.in.key_rope;
             const bool bsh = &x == &c.in.query_rope && c.layout == "BSH";
             x = support::resized(x, x.rank() - 1, bsh ? c.N * 32 : 32);
           }),
      must("query_rope or key_rope of another batch, length, heads or blocks", nullptr,
           [](C& c, Rng& r) {
             const bool q = r.chance(0.5);
             auto& x = q ? c.in.query_rope : c.in.key_rope;
             const int d = static_cast<int>(r.range(0, x.rank() - 2));
             bump(q ? c.qr : c.kr, x, d, x.size(d) + 1);
           }),
      // MLA's cache, block table and lengths.
      must("key_rope or value of other blocks (MLA)", paged,
           [](C& c, Rng& r) {
             auto& x = r.chance(0.5) ? c.in.value[0] : c.in.key_rope;
             const bool fewer = r.chance(0.6);
             x = support::resized(x, fewer ? 0 : x.rank() - 2, fewer ? c.nb - 1 : c.bs / 2);
           }),
      must(
          "rank-4 cache with a BSH or BSND query (MLA)",
          [](const C& c) {
            return c.mla && !c.contiguous && (c.layout == "BSH" || c.layout == "BSND");
          },
          [](C& c, Rng&) { c.rank4 = true, set_views(c); }),
      must("cache block size not 16 or 128 (MLA)", mla,
           [](C& c, Rng& r) {
             static const Index bad[] = {32, 64, 8, 48};
             rebuild(c, r, {0, 0, bad[r.range(0, 3)]});
           }),
      must("params.block_size differs from the cache's (MLA)", paged,
           [](C& c, Rng& r) {
             static const std::int64_t other[] = {0, -16, 32};
             c.p.block_size = r.chance(0.5) ? (c.bs == 16 ? 128 : 16) : other[r.range(0, 2)];
           }),
      must("block_table missing or of another shape (MLA)", paged,
           [](C& c, Rng& r) {
             const Index w = r.range(0, 2);
             if (w == 0) c.in.block_table = {};
             if (w == 1) bump(c.table, c.in.block_table, 0, c.B + 1);
             if (w == 2) c.in.block_table = StridedView<const i32>(c.table.data(), {c.B * c.mb});
           }),
      must(
          "a block_table entry a sequence uses out of [0, blockNum) (MLA)",
          [](const C& c) {
            return c.mla && !c.contiguous &&
                   *std::max_element(c.kv_len.begin(), c.kv_len.end()) > 0;
          },
          [](C& c, Rng& r) {
            Index b = r.range(0, c.B - 1);
            while (c.kv_len[z(b)] == 0) b = (b + 1) % c.B;
            const i32 bad[] = {-1, static_cast<i32>(c.nb), static_cast<i32>(c.nb + 7),
                               std::numeric_limits<i32>::max(), std::numeric_limits<i32>::min()};
            c.table[z(b * c.mb + r.range(0, (c.kv_len[z(b)] - 1) / c.bs))] = bad[r.range(0, 4)];
            c.want_out_of_range = true;
          }),
      must("actual_seq_lengths_kv empty, short, negative or past the block table (MLA)", paged,
           [](C& c, Rng& r) {
             auto& kv = c.in.actual_seq_lengths_kv;
             const Index w = r.range(0, 3), b = r.range(0, c.B - 1);
             if (w == 1) kv[z(b)] = c.mb * c.bs + r.range(1, 3);
             if (w == 2) kv[z(b)] = -r.range(1, 3);
             if (w == 0 || w == 3) kv.resize(w == 3 && c.B == 3 ? 2 : 0);
           }),
      must(
          "actual_seq_lengths missing, decreasing or not ending at T (MLA TND)",
          [](const C& c) { return c.mla && c.layout == "TND"; },
          [](C& c, Rng& r) {
            auto& a = c.in.actual_seq_lengths;
            const Index w = r.range(0, 3);
            if (w == 0) a.clear();
            if (w == 1) a.back() += r.range(1, 2);
            if (w >= 2) a[0] = w == 2 ? a.back() + 1 : -1;
          }),
      // The sliding window's rules (sparse_mode 4), each on a sliding-window case (a fresh small
      // one when the case drawn is not; three entries, so that the window's 128 heads stay a
      // small share of the run).
      must("sliding window: pre_tokens, next_tokens, layout, heads or block size outside its "
           "rules",
           mla,
           [](C& c, Rng& r) {
             Force f;
             f.win = f.small = true;
             switch (r.range(0, 5)) {
               case 0:  // pre_tokens 0, negative or past 2048
                 to_window(c, r);
                 c.p.pre_tokens = pick<i64>(r, {0, -1, -2048, 2049, 2147483647});
                 return;
               case 1:  // next_tokens not 0
                 to_window(c, r);
                 c.p.next_tokens = pick<i64>(r, {1, -1, 7, 2147483647});
                 return;
               case 2:  // BSND_NBSD (the head-major output)
                 rebuild(c, r, f);
                 return head_major(c);
               case 3:  // BSH or BNSD
                 f.layout = r.chance(0.5) ? "BSH" : "BNSD";
                 return rebuild(c, r, f);
               case 4:  // 8, 16, 32 or 64 heads
                 f.n = Index(8) << r.range(0, 3);
                 return rebuild(c, r, f);
               default:  // a paged cache with blocks of 16 or 32
                 f.bs = r.chance(0.5) ? 16 : 32;
                 return rebuild(c, r, f);
             }
           }),
      must("sliding window: query lengths past Q_S, negative or a list of 2 for 3 batches, or a "
           "kv length below the batch's query rows",
           mla,
           [](C& c, Rng& r) {
             to_window(c, r);
             auto& q = c.in.actual_seq_lengths;
             auto& kv = c.in.actual_seq_lengths_kv;
             const Index b = r.range(0, c.B - 1);
             if (r.chance(0.5)) {  // the query lengths
               q.assign(c.q_len.begin(), c.q_len.end());
               if (c.B == 3 && r.chance(0.3)) return q.resize(2);
               q[z(b)] = r.chance(0.7) ? c.S + r.range(1, 3) : -r.range(1, 3);
               return;
             }
             if (c.q_len[z(b)] == 0) {  // that batch's query rows: Q_S
               q.assign(c.q_len.begin(), c.q_len.end());
               q[z(b)] = c.q_len[z(b)] = c.S;
             }
             kv.assign(c.kv_len.begin(), c.kv_len.end());
             kv[z(b)] = r.range(0, c.q_len[z(b)] - 1);
           }),
      must("contiguous cache: another shape, a kv length past S2, negative or a list of 2 for 3 "
           "batches, a block_table, or no sliding window",
           mla,
           [](C& c, Rng& r) {
             to_window(c, r, 1);
             auto& key = c.in.key[0];
             auto& value = c.in.value[0];
             auto& kv = c.in.actual_seq_lengths_kv;
             switch (r.range(0, 9)) {
               case 0:  // another batch (both)
                 bump(c.k, key, 0, c.B + 1), bump(c.v, value, 0, c.B + 1);
                 return;
               case 1:  // two heads (both)
                 bump(c.k, key, 2, 2), bump(c.v, value, 2, 2);
                 return;
               case 2:  // head size 256 (both)
                 key = support::resized(key, 3, 256), value = support::resized(value, 3, 256);
                 return;
               case 3:  // the value of another length or head size
                 value = c.S2 > 1 && r.chance(0.5) ? support::resized(value, 1, c.S2 - 1)
                                                   : support::resized(value, 3, 256);
                 return;
               case 4: {  // key_rope: another batch, length or head size
                 const int d = r.chance(0.3) ? 3 : static_cast<int>(r.range(0, 1));
                 bump(c.kr, c.in.key_rope, d, d == 3 ? 32 : c.in.key_rope.size(d) + 1);
                 return;
               }
               case 5:  // rank 3: [B, S2, 512]
                 key = StridedView<const T>(c.k.data(), {c.B, c.S2, 512});
                 value = StridedView<const T>(c.v.data(), {c.B, c.S2, 512});
                 if (r.chance(0.5)) c.in.key_rope = CT(c.kr.data(), {c.B, c.S2, kR});
                 return;
               case 6:  // kv lengths
                 kv.assign(c.kv_len.begin(), c.kv_len.end());
                 if (c.B == 3 && r.chance(0.3)) return kv.resize(2);
                 kv[z(r.range(0, c.B - 1))] = r.chance(0.7) ? c.S2 + r.range(1, 3) : -r.range(1, 3);
                 return;
               case 7:  // a block_table
                 c.table.assign(z(c.B), 0);
                 c.in.block_table = StridedView<const i32>(c.table.data(), {c.B, 1});
                 if (r.chance(0.5)) c.p.block_size = 64;
                 return;
               default:  // sparse_mode 0 or 3 (no window)
                 c.p.sparse_mode = c.S > 1 ? 3 : 0;
                 if (c.S == 1) c.in.atten_mask = {};
             }
           }),
      // The head-128 configuration's rules.
      must("head-128 rope with layout BSND", h128,
           [](C& c, Rng&) {
             c.p.input_layout = "BSND";
             c.in.query = CT(c.q.data(), {1, c.T1, c.N, c.D});
             c.in.query_rope = CT(c.qr.data(), {1, c.T1, c.N, kR});
             c.in.key = {CT(c.k.data(), {1, c.T2, c.KVN, c.D})};
             c.in.value = {CT(c.v.data(), {1, c.T2, c.KVN, c.D})};
             c.in.key_rope = CT(c.kr.data(), {1, c.T2, c.KVN, kR});
             c.out = StridedView<T>(c.o.data(), {1, c.T1, c.N, c.D});
             if (c.p.softmax_lse_flag)  // BSND's form: the rope rule must be what rejects
               c.lse_out = StridedView<float>(c.lse.data(), {1, c.N, c.T1, 1});
           }),
      must(
          "head-128 rope with half data", [](const C&) { return std::is_same_v<T, half>; },
          [](C& c, Rng& r) { rebuild(c, r, {}, 128); }),
      must("rope with query / key / value head size 64, 96 or 256 (TND)", nullptr,
           [](C& c, Rng& r) {
             static const Index d[] = {64, 96, 256};
             rebuild(c, r, {}, d[r.range(0, 2)]);
           }),
      must("value head size 64 with rope (head 128)", h128,
           [](C& c, Rng&) { c.in.value[0] = support::resized(c.in.value[0], 2, 64); }),
      must("pse_shift with rope (head 128)", h128,
           [](C& c, Rng&) {
             c.junk.assign(z(std::max<Index>(1, c.N * c.T1 * c.T2)), T(0.01f));
             c.in.pse_shift = CT(c.junk.data(), {1, c.N, c.T1, c.T2});
           }),
      // Outputs.
      must("attention_out of another shape", nullptr,
           [](C& c, Rng& r) {
             const int d = static_cast<int>(r.range(0, c.out.rank() - 1));
             bump(c.o, c.out, d, c.out.size(d) + 1);
           }),
      must(
          "attention_out overlapping the query", [](const C& c) { return c.out.numel() > 0; },
          [](C& c, Rng&) { c.out = StridedView<T>(c.q.data(), c.out.shape()); }),
      // Unusual but defined.
      fine("key_rope_antiquant_scale given (reserved, ignored)", nullptr,
           [](C& c, Rng& r) {
             c.junk.assign(z(kR), T(1e4f));
             c.in.key_rope_antiquant_scale = CT(c.junk.data(), {r.chance(0.5) ? kR : 1});
           }),
      fine("garbage in block_table past each sequence's blocks (MLA)", paged,
           [](C& c, Rng& r) {
             for (Index b = 0; b < c.B; ++b)
               for (Index j = (c.kv_len[z(b)] + c.bs - 1) / c.bs; j < c.mb; ++j)
                 c.table[z(b * c.mb + j)] = r.chance(0.3) ? std::numeric_limits<i32>::max()
                                                          : static_cast<i32>(r.range(-999, 999));
           }),
      fine("actual_seq_lengths_kv longer than the batch (MLA; the rest ignored)", mla,
           [](C& c, Rng& r) {
             c.in.actual_seq_lengths_kv.assign(c.kv_len.begin(), c.kv_len.end());
             for (Index i = r.range(1, 2); i > 0; --i)
               c.in.actual_seq_lengths_kv.push_back(r.range(0, 5000));
           }),
  };
  return list;
}

template <class C>
void restride_inputs(C& c, support::Restrider& r) {
  c.in.for_each_view([&](const std::string& name, auto& view) {
    if (name != "atten_mask") r(name, view);  // 4 M elements, content not read
  });
}

template <class C>
void invoke(C& c, bool run, int threads) {
  attnref::ExecConfig ex = c.ex;
  ex.threads = threads;
  const attnref::FusedInferAttentionScoreOutputs<typename C::Q> o{c.out, c.lse_out};
  run ? attnref::fused_infer_attention_score(c.p, c.in, o, ex)
      : attnref::validate(c.p, c.in, o, ex);
}

template <class C>
void validate_only(C& c) {
  invoke(c, false, 0);
}

template <class T>
void run_t(fuzz::Run& run, std::uint64_t seed) {
  using C = Rope<T>;
  fuzz::run_case(
      run, seed, perturbations<C>(), build<C>,
      fuzz::Named{"fused_infer_attention_score_rope", "fused_infer_attention_score"},
      [seed](C& c) {
        fuzz::call_expecting_range(c.want_out_of_range,
                                   [&] { invoke(c, true, static_cast<int>(seed % 2 + 1)); });
      },
      verify<C>, &C::q, &C::qr, &C::k, &C::v, &C::kr, &C::o, &C::lse, &C::table, &C::junk);
}

// Cases 2k and 2k + 1 (one and two threads) share a type: half, then bf16.
void run(fuzz::Run& run, std::uint64_t seed) {
  seed / 2 % 2 == 0 ? run_t<half>(run, seed) : run_t<bfloat16>(run, seed);
}

const fuzz::Register reg("fused_infer_attention_score_rope", run);

}  // namespace fuzz_fia_rope
