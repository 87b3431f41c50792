// Fuzz entry "fused_infer_attention_score" (CANN FusedInferAttentionScore, fp16) against the naive
// reference: the incremental branch (Q_S == 1 in BSH / BSND / BNSD over one K/V tensor, one tensor
// per batch or a shuffled paged cache with block_table; IFA's [B, S'] masks) and the prompt branch
// (Q_S > 1 in BSH / BSND / BNSD / BNSD_BSND, and TND with any T; user masks, sparse modes 0–4,
// inner_precise 0–3, padded rows), GQA, actual lengths (batches without keys), softmax_lse on and
// off. With the flag, softmax_lse is the reference's ln Σ exp(scale·q·k) over the row's visible
// keys, +inf for a prompt row without keys or a padded row, -3.40e38 for an incremental batch
// without keys, and the fill value for a row whose visible keys are all masked (-FLT_MAX prompt,
// -1e12 + ln n incremental); without it, softmax_lse is never written. TND cases sometimes carry
// V4's learnable sink (head size 64 or 128): exp(sink_h) joins each row's denominator, not lse.

#include <attnref/attnref.hpp>
#include <cfloat>
#include <limits>

#include "fuzz/fuzz.hpp"
#include "reference/naive_attention.hpp"
#include "support/views.hpp"

namespace fuzz_fia {

using attnref::half;
using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;

constexpr float kLseSentinel = 4321.0f;
const half kOutSentinel = half(777.0f);
constexpr double kIncreEmpty = static_cast<double>(-3.40e38f);  // an incremental batch, no keys

enum Store { kTensor, kList, kPaged };  // the incremental branch's K/V

size_t z(Index i) { return static_cast<size_t>(i); }

std::vector<half> halves(fuzz::Rng& r, Index n) {
  std::vector<half> x(z(n));
  for (half& e : x) e = half(r.normal());
  return x;
}

struct Fia {
  bool incre = false;  // Q_S == 1 in BSH / BSND / BNSD
  std::string layout;
  int store = kTensor;
  bool paged4 = false;  // BNSD paged cache [nb, KV_N, bs, D]
  Index B = 1, S1 = 1, S2 = 0, N = 1, KVN = 1, D = 1, Dv = 1;
  Index bs = 16, nb = 0, mb = 0;     // paged: block size, blocks, table columns
  std::vector<Index> q_len, kv_len;  // per batch
  std::vector<Index> kv_s, kv_base;  // tensor list: each tensor's S and element offset
  bool user_mask = false, compressed = false;
  Index m_b = 1, m_s1 = 1, m_s2 = 0;  // the user mask as [m_b][m_s1][m_s2] (incre: m_s1 = 1)
  std::vector<half> q, k, v, o;
  std::vector<float> lse;
  std::vector<std::uint8_t> mask;
  std::vector<std::int32_t> table;
  std::vector<attnref::bfloat16> sink;  // learnable_sink (TND, D = Dv = 64 or 128)
  attnref::FusedInferAttentionScoreParams p;
  attnref::FusedInferAttentionScoreInputs<half> in;
  StridedView<half> out;
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

std::vector<Index> lse_shape(const Fia& c) {
  if (c.layout == "TND") return {c.S1, c.N, 1};
  return {c.B, c.N, c.S1, 1};
}

Index max_of(const std::vector<Index>& x) {
  Index m = 0;
  for (Index e : x) m = std::max(m, e);
  return m;
}

// Fills the user mask [m_b][m_s1][m_s2]: random holes, sometimes whole rows masked.
void fill_mask(Fia& c, fuzz::Rng& r) {
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
StridedView<const std::uint8_t> mask_view(const Fia& c, fuzz::Rng& r) {
  const Index rank = r.range(c.incre || c.m_b == 1 ? 2 : 3, 4);
  const std::uint8_t* d = c.mask.data();
  if (rank == 2) return StridedView<const std::uint8_t>(d, {c.m_b * c.m_s1, c.m_s2});
  if (rank == 3) return StridedView<const std::uint8_t>(d, {c.m_b, c.m_s1, c.m_s2});
  return StridedView<const std::uint8_t>(d, {c.m_b, 1, c.m_s1, c.m_s2});
}

std::vector<std::int64_t> as_lengths(const std::vector<Index>& x) {
  return std::vector<std::int64_t>(x.begin(), x.end());
}

void build_incre(Fia& c, fuzz::Rng& r) {
  const char* layouts[] = {"BSH", "BSND", "BNSD"};
  c.layout = layouts[r.range(0, 2)];
  c.Dv = c.D;
  c.S1 = 1;
  c.store = static_cast<int>(r.range(0, 2));
  c.p.inner_precise = r.range(0, 1);
  for (Index b = 0; b < c.B; ++b) c.kv_len.push_back(r.chance(0.2) ? 0 : r.range(1, 40));
  c.q_len.assign(z(c.B), 1);
  c.q = halves(r, c.B * c.N * c.D);
  c.o.assign(c.q.size(), kOutSentinel);
  c.in.query = StridedView<const half>(c.q.data(), shape(c.layout, c.B, 1, c.N, c.D));
  c.out = StridedView<half>(c.o.data(), c.in.query.shape());
  const bool lens = c.store == kPaged || r.chance(0.6);
  const Index W = c.KVN * c.D;
  if (c.store == kTensor) {
    c.S2 = max_of(c.kv_len) + r.range(0, 2);
    if (!lens) c.kv_len.assign(z(c.B), c.S2);
    c.k = halves(r, c.B * c.S2 * W);
    c.v = halves(r, c.B * c.S2 * W);
    c.in.key.emplace_back(c.k.data(), shape(c.layout, c.B, c.S2, c.KVN, c.D));
    c.in.value.emplace_back(c.v.data(), shape(c.layout, c.B, c.S2, c.KVN, c.D));
  } else if (c.store == kList) {  // one tensor per batch, each its own S
    Index total = 0;
    for (Index b = 0; b < c.B; ++b) {
      c.kv_s.push_back(c.kv_len[z(b)] + r.range(0, 2));
      if (!lens) c.kv_len[z(b)] = c.kv_s.back();
      c.kv_base.push_back(total);
      total += c.kv_s.back() * W;
    }
    c.k = halves(r, total);
    c.v = halves(r, total);
    for (Index b = 0; b < c.B; ++b) {
      c.in.key.emplace_back(c.k.data() + c.kv_base[z(b)],
                            shape(c.layout, 1, c.kv_s[z(b)], c.KVN, c.D));
      c.in.value.emplace_back(c.v.data() + c.kv_base[z(b)],
                              shape(c.layout, 1, c.kv_s[z(b)], c.KVN, c.D));
    }
  } else {  // shuffled blocks, NaN in every row no sequence owns, table padded with -1
    c.bs = 16 * r.range(1, 2);
    c.paged4 = c.layout == "BNSD" && r.chance(0.5);
    Index used = 0;
    for (Index l : c.kv_len) {
      used += (l + c.bs - 1) / c.bs;
      c.mb = std::max(c.mb, (l + c.bs - 1) / c.bs);
    }
    c.mb = std::max<Index>(1, c.mb + r.range(0, 1));
    c.nb = used + r.range(1, 2);
    std::vector<std::int32_t> ids(z(c.nb));
    for (Index i = 0; i < c.nb; ++i) ids[z(i)] = static_cast<std::int32_t>(i);
    std::shuffle(ids.begin(), ids.end(), r.g);
    c.table.assign(z(c.B * c.mb), -1);
    const half nan = half(std::numeric_limits<float>::quiet_NaN());
    c.k.assign(z(c.nb * c.bs * W), nan);
    c.v.assign(c.k.size(), nan);
    Index next = 0;
    for (Index b = 0; b < c.B; ++b)
      for (Index t = 0; t < c.kv_len[z(b)]; ++t) {
        if (t % c.bs == 0) c.table[z(b * c.mb + t / c.bs)] = ids[z(next++)];
        const Index blk = c.table[z(b * c.mb + t / c.bs)];
        for (Index h = 0; h < c.KVN; ++h)
          for (Index e = 0; e < c.D; ++e) {
            const Index at = c.paged4 ? ((blk * c.KVN + h) * c.bs + t % c.bs) * c.D + e
                                      : ((blk * c.bs + t % c.bs) * c.KVN + h) * c.D + e;
            c.k[z(at)] = half(r.normal());
            c.v[z(at)] = half(r.normal());
          }
      }
    const std::vector<Index> cs =
        c.paged4 ? std::vector<Index>{c.nb, c.KVN, c.bs, c.D} : std::vector<Index>{c.nb, c.bs, W};
    c.in.key.emplace_back(c.k.data(), cs);
    c.in.value.emplace_back(c.v.data(), cs);
    c.in.block_table = StridedView<const std::int32_t>(c.table.data(), {c.B, c.mb});
    c.p.block_size = c.bs;
  }
  if (lens) {
    c.in.actual_seq_lengths_kv = as_lengths(c.kv_len);
    const bool same =
        std::all_of(c.kv_len.begin(), c.kv_len.end(), [&](Index l) { return l == c.kv_len[0]; });
    if (same && r.chance(0.3)) c.in.actual_seq_lengths_kv.resize(1);  // one value broadcasts
  }
  if (r.chance(0.35)) {  // IFA's mask: [B, S'] and its rank-3 / rank-4 forms, S' >= the columns
    c.user_mask = true;
    c.m_b = c.B;
    c.m_s1 = 1;
    c.m_s2 = (c.store == kPaged ? c.mb * c.bs : max_of(c.kv_len)) + r.range(0, 3);
    fill_mask(c, r);
    c.in.atten_mask = mask_view(c, r);
  }
}

void build_prompt(Fia& c, fuzz::Rng& r) {
  const char* layouts[] = {"BSH", "BSND", "BNSD", "BNSD_BSND", "TND"};
  c.layout = layouts[r.range(0, 4)];
  const bool tnd = c.layout == "TND";
  c.Dv = c.layout == "BSH" ? c.D : r.range(1, 24);  // BSH: H = N * D for q, k and v alike
  c.p.inner_precise = r.range(0, 3);
  if (tnd && r.chance(0.3)) {  // V4's learnable sink: one bf16 logit per query head
    c.D = c.Dv = r.chance(0.5) ? 64 : 128;
    c.p.scale_value = 1.0 / std::sqrt(static_cast<double>(c.D));
    for (Index h = 0; h < c.N; ++h) c.sink.push_back(attnref::bfloat16(2 * r.normal()));
    c.in.learnable_sink = StridedView<const attnref::bfloat16>(c.sink.data(), {c.N});
  }
  for (Index b = 0; b < c.B; ++b) {
    c.q_len.push_back(r.chance(0.1) ? 0 : r.range(1, 6));
    c.kv_len.push_back(r.chance(0.15) ? 0 : r.range(1, 20));
  }
  Index sq = 0, skv = 0;
  for (Index b = 0; b < c.B; ++b) {
    sq = tnd ? sq + c.q_len[z(b)] : std::max(sq, c.q_len[z(b)]);
    skv = tnd ? skv + c.kv_len[z(b)] : std::max(skv, c.kv_len[z(b)]);
  }
  c.S1 = tnd ? sq : std::max<Index>(2, sq + r.range(0, 1));  // Q_S > 1 (TND: any T)
  c.S2 = tnd ? skv : skv + r.range(0, 1);
  if (tnd || r.chance(0.6)) {
    std::int64_t qa = 0, ka = 0;
    for (Index b = 0; b < c.B; ++b) {
      qa = tnd ? qa + c.q_len[z(b)] : c.q_len[z(b)];
      ka = tnd ? ka + c.kv_len[z(b)] : c.kv_len[z(b)];
      c.in.actual_seq_lengths.push_back(qa);
      c.in.actual_seq_lengths_kv.push_back(ka);
    }
  } else {  // no lengths: every batch spans the extents
    c.q_len.assign(z(c.B), c.S1);
    c.kv_len.assign(z(c.B), c.S2);
    if (r.chance(0.3)) {  // or one value each, broadcast
      c.in.actual_seq_lengths = {static_cast<std::int64_t>(c.S1)};
      c.in.actual_seq_lengths_kv = {static_cast<std::int64_t>(c.S2)};
    }
  }
  const Index bb = tnd ? 1 : c.B;
  c.q = halves(r, bb * c.S1 * c.N * c.D);
  c.k = halves(r, bb * c.S2 * c.KVN * c.D);
  c.v = halves(r, bb * c.S2 * c.KVN * c.Dv);
  c.o.assign(z(bb * c.S1 * c.N * c.Dv), kOutSentinel);
  c.in.query = StridedView<const half>(c.q.data(), shape(c.layout, c.B, c.S1, c.N, c.D));
  c.in.key.emplace_back(c.k.data(), shape(c.layout, c.B, c.S2, c.KVN, c.D));
  c.in.value.emplace_back(c.v.data(), shape(c.layout, c.B, c.S2, c.KVN, c.Dv));
  const std::string ol = c.layout == "BNSD_BSND" ? "BSND" : c.layout;
  c.out = StridedView<half>(c.o.data(), shape(ol, c.B, c.S1, c.N, c.Dv));
  // The sparse mode: TND takes 0 without a mask or 3.
  c.p.sparse_mode = tnd ? (r.chance(0.5) ? 3 : 0) : r.range(0, 4);
  const std::int64_t sm = c.p.sparse_mode;
  c.user_mask = sm == 1 || (sm == 0 && !tnd && r.chance(0.5));
  c.compressed = sm >= 2;
  const bool band = (sm == 0 && c.user_mask) || sm == 4;
  if (band && r.chance(0.6)) {  // a band: not both negative, pre + next >= 0
    do {
      c.p.pre_tokens = r.range(-3, 8);
      c.p.next_tokens = r.range(-3, 8);
    } while ((c.p.pre_tokens < 0 && c.p.next_tokens < 0) || c.p.pre_tokens + c.p.next_tokens < 0);
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
  } else if (c.user_mask) {
    c.m_b = r.chance(0.5) ? 1 : c.B;
    c.m_s1 = c.S1 + r.range(0, 2);
    c.m_s2 = c.S2 + r.range(0, 2);
    fill_mask(c, r);
    c.in.atten_mask = mask_view(c, r);
  }
}

// NaN in every query row past its batch's length and every key / value row past its batch's kv
// length (contiguous tensors and lists; the paged pool has NaN in the rows no sequence owns):
// reading one shows.
void poison_padding(Fia& c) {
  const half nan = half(std::numeric_limits<float>::quiet_NaN());
  const bool tnd = c.layout == "TND";
  if (tnd || (c.incre && c.store == kPaged)) return;
  for (Index b = 0; b < c.B; ++b) {
    if (!c.incre)
      for (Index s = c.q_len[z(b)]; s < c.S1; ++s)
        for (Index h = 0; h < c.N; ++h)
          for (Index e = 0; e < c.D; ++e)
            c.q[z(offset(c.layout, b, s, h, e, c.S1, c.N, c.D))] = nan;
    const Index S = c.incre && c.store == kList ? c.kv_s[z(b)] : c.S2;
    for (Index t = c.kv_len[z(b)]; t < S; ++t)
      for (Index h = 0; h < c.KVN; ++h) {
        for (Index e = 0; e < c.D; ++e) {
          const Index at = c.incre && c.store == kList
                               ? c.kv_base[z(b)] + offset(c.layout, 0, t, h, e, S, c.KVN, c.D)
                               : offset(c.layout, b, t, h, e, S, c.KVN, c.D);
          c.k[z(at)] = nan;
        }
        for (Index e = 0; e < c.Dv; ++e) {
          const Index at = c.incre && c.store == kList
                               ? c.kv_base[z(b)] + offset(c.layout, 0, t, h, e, S, c.KVN, c.Dv)
                               : offset(c.layout, b, t, h, e, S, c.KVN, c.Dv);
          c.v[z(at)] = nan;
        }
      }
  }
}

void build(Fia& c, fuzz::Rng& r) {
  c.incre = r.chance(0.5);
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

bool masked(const Fia& c, Index b, Index i, Index j) {
  if (!c.user_mask) return false;
  const Index mb = c.m_b == 1 ? 0 : b;
  return c.mask[z((mb * c.m_s1 + i) * c.m_s2 + j)] != 0;
}

// Key j of row i excluded by the prompt branch's sparse mode (the band), not by the user mask.
bool excluded(const Fia& c, Index b, Index i, Index j) {
  if (c.incre) return false;
  const auto clamp = [](std::int64_t x) {
    return std::clamp<std::int64_t>(x, -2147483648LL, 2147483647LL);
  };
  const std::int64_t d = j - i, off = c.kv_len[z(b)] - c.q_len[z(b)];
  const std::int64_t pre = clamp(c.p.pre_tokens), next = clamp(c.p.next_tokens);
  switch (c.p.sparse_mode) {
    case 0:
      return c.user_mask && (d < -pre || d > next);
    case 2:
      return d > 0;
    case 3:
      return d > off;
    case 4:
      return d - off < -pre || d - off > next;
    default:
      return false;
  }
}

// Element offset of key / value element (b, t, h, e) (prompt: t within batch b).
Index kv_offset(const Fia& c, Index b, Index t, Index h, Index e, Index w, Index t0) {
  if (!c.incre) return offset(c.layout, b, t0 + t, h, e, c.S2, c.KVN, w);
  if (c.store == kPaged) {
    const Index blk = c.table[z(b * c.mb + t / c.bs)], row = t % c.bs;
    return c.paged4 ? ((blk * c.KVN + h) * c.bs + row) * c.D + e
                    : ((blk * c.bs + row) * c.KVN + h) * c.D + e;
  }
  if (c.store == kList)
    return c.kv_base[z(b)] + offset(c.layout, 0, t, h, e, c.kv_s[z(b)], c.KVN, c.D);
  return offset(c.layout, b, t, h, e, c.S2, c.KVN, c.D);
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

std::string verify(const Fia& c) {
  const bool tnd = c.layout == "TND";
  const Index g = c.N / c.KVN;
  ref::Problem pr;
  pr.num_heads = static_cast<int>(c.N);
  pr.num_kv_heads = static_cast<int>(c.KVN);
  pr.head_size = static_cast<int>(c.D);
  pr.v_head_size = static_cast<int>(c.Dv);
  pr.scale = c.p.scale_value;
  pr.hidden = [&c](int b, int, int i, int j) { return excluded(c, b, i, j) || masked(c, b, i, j); };
  ref::Seqs q, k, v;
  std::vector<Index> q0(z(c.B) + 1, 0), k0(z(c.B) + 1, 0);  // TND: each batch's first token
  for (Index b = 0; b < c.B; ++b) {
    const Index lq = c.q_len[z(b)], lk = c.kv_len[z(b)];
    q0[z(b) + 1] = q0[z(b)] + lq;
    k0[z(b) + 1] = k0[z(b)] + lk;
    pr.q_len.push_back(static_cast<int>(lq));
    pr.kv_len.push_back(static_cast<int>(lk));
    q.emplace_back();
    k.emplace_back();
    v.emplace_back();
    for (Index s = 0; s < lq; ++s)
      for (Index h = 0; h < c.N; ++h)
        for (Index e = 0; e < c.D; ++e)
          q.back().push_back(static_cast<float>(c.q[z(
              offset(c.layout, b, (tnd ? q0[z(b)] : 0) + s, h, e, c.incre ? 1 : c.S1, c.N, c.D))]));
    const Index t0 = tnd ? k0[z(b)] : 0;
    for (Index t = 0; t < lk; ++t)
      for (Index h = 0; h < c.KVN; ++h) {
        for (Index e = 0; e < c.D; ++e)
          k.back().push_back(static_cast<float>(c.k[z(kv_offset(c, b, t, h, e, c.D, t0))]));
        for (Index e = 0; e < c.Dv; ++e)
          v.back().push_back(static_cast<float>(c.v[z(kv_offset(c, b, t, h, e, c.Dv, t0))]));
      }
  }
  const ref::Result want = ref::attention(pr, q, k, v);
  const bool fill = c.incre || (c.p.inner_precise & 2) == 0;  // masked keys scored, not excluded
  const std::string ol = c.layout == "BNSD_BSND" ? "BSND" : c.layout;
  const bool flag = c.p.softmax_lse_flag;
  for (Index b = 0; b < c.B; ++b) {
    const Index lq = c.q_len[z(b)], lk = c.kv_len[z(b)];
    for (Index s = 0; s < (tnd ? lq : c.S1); ++s) {
      // A row whose visible keys are all masked, with the fill semantics: the mean of V.
      Index visible = 0;
      bool all_masked = true;
      if (s < lq)
        for (Index j = 0; j < lk; ++j)
          if (!excluded(c, b, s, j)) ++visible, all_masked = all_masked && masked(c, b, s, j);
      const bool mean = fill && visible > 0 && all_masked;
      for (Index h = 0; h < c.N; ++h) {
        std::vector<double> got, w;
        for (Index e = 0; e < c.Dv; ++e) {
          const Index at = c.incre ? (b * c.N + h) * c.D + e
                                   : offset(ol, b, (tnd ? q0[z(b)] : 0) + s, h, e, c.S1, c.N, c.Dv);
          got.push_back(static_cast<float>(c.o[z(at)]));
          double x = 0;  // padded rows: 0
          if (mean) {
            for (Index j = 0; j < lk; ++j)
              if (!excluded(c, b, s, j)) x += v[z(b)][z((j * c.KVN + h / g) * c.Dv + e)];
            x /= static_cast<double>(visible);
          } else if (s < lq) {
            x = want.o[z(b)][z((s * c.N + h) * c.Dv + e)];
            // the sink joins the denominator: Σ exp(s_j) -> Σ exp(s_j) + exp(sink_h)
            if (!c.sink.empty())
              x /= 1 + std::exp(static_cast<double>(static_cast<float>(c.sink[z(h)])) -
                                want.lse[z(b)][z(h * lq + s)]);
          }
          w.push_back(x);
        }
        const std::string m = fuzz::compare(got, w, 3e-3);
        if (!m.empty())
          return "batch " + std::to_string(b) + " row " + std::to_string(s) + " head " +
                 std::to_string(h) + ": " + m;
        if (!flag) continue;
        double l = s < lq ? want.lse[z(b)][z(h * lq + s)] : -HUGE_VAL;
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

using P = fuzz::Perturbation<Fia>;

bool is_incre(const Fia& c) { return c.incre; }
bool is_prompt(const Fia& c) { return !c.incre; }
bool is_paged(const Fia& c) { return c.incre && c.store == kPaged; }
bool has_flag(const Fia& c) { return c.p.softmax_lse_flag; }

// An output view with another shape, over a buffer large enough for it.
void regrow_out(Fia& c, const std::vector<Index>& s) {
  Index n = 1;
  for (Index e : s) n *= std::max<Index>(e, 1);
  if (c.o.size() < z(n)) c.o.resize(z(n), kOutSentinel);
  c.out = StridedView<half>(c.o.data(), s);
}

const std::vector<P>& perturbations() {
  static const std::vector<P> list{
      // softmax_lse
      fuzz::edit<Fia>("softmax_lse shape mismatch", true, has_flag,
                      [](Fia& c, fuzz::Rng& r) {
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
      fuzz::edit<Fia>("softmax_lse strided", false, has_flag,
                      [](Fia& c, fuzz::Rng&) {  // every other float, gaps left alone
                        const std::vector<Index> s = lse_shape(c);
                        std::vector<Index> st(s.size(), 2);
                        for (size_t d = s.size() - 1; d > 0; --d) st[d - 1] = st[d] * s[d];
                        c.lse.assign(c.lse.size() * 2, kLseSentinel);
                        c.lse_step = 2;
                        c.lse_out = StridedView<float>(c.lse.data(), s, st);
                      }),
      fuzz::edit<Fia>("softmax_lse missing with the flag", true, has_flag,
                      [](Fia& c, fuzz::Rng&) { c.lse_out = {}; }),
      fuzz::edit<Fia>("softmax_lse of a huge shape", true, has_flag,
                      [](Fia& c, fuzz::Rng&) {
                        c.lse_out = StridedView<float>(c.lse.data(), {kHuge, kHuge, 1, 1});
                      }),
      fuzz::edit<Fia>(
          "softmax_lse of any shape with the flag off", false,
          [](const Fia& c) { return !c.p.softmax_lse_flag; },
          [](Fia& c, fuzz::Rng& r) {
            c.lse.resize(c.lse.size() + 3, kLseSentinel);
            const Index n = static_cast<Index>(c.lse.size());
            c.lse_out = r.chance(0.5) ? StridedView<float>(c.lse.data(), {n})
                                      : StridedView<float>(c.lse.data(), {1, n, 1});
          }),
      // parameters of both branches
      fuzz::edit<Fia>(
          "sparse_mode out of range", true, nullptr,
          [](Fia& c, fuzz::Rng& r) {
            const std::int64_t bad[] = {
                -1, 5, 8, 9, std::int64_t(1) << 40, std::numeric_limits<std::int64_t>::min()};
            c.p.sparse_mode = bad[r.range(0, 5)];
          }),
      fuzz::edit<Fia>("unknown layout", true, nullptr,
                      [](Fia& c, fuzz::Rng& r) {
                        const char* bad[] = {"SBH", "NTD_TND",  "bsnd",    "BSND ",
                                             "",    "BSH_BNSD", "TND_NTD", "NSD"};
                        c.p.input_layout = bad[r.range(0, 7)];
                      }),
      fuzz::edit<Fia>("num_heads out of range", true, nullptr,
                      [](Fia& c, fuzz::Rng& r) {
                        const std::int64_t bad[] = {0, -1, 257, kHuge,
                                                    std::numeric_limits<std::int64_t>::min()};
                        c.p.num_heads = bad[r.range(0, 4)];
                      }),
      fuzz::edit<Fia>("num_key_value_heads negative or not dividing", true, nullptr,
                      [](Fia& c, fuzz::Rng& r) {
                        c.p.num_key_value_heads =
                            r.chance(0.5) ? -1 : (r.chance(0.5) ? c.N + 1 : kHuge);
                      }),
      fuzz::edit<Fia>("scale_value not finite", true, nullptr,
                      [](Fia& c, fuzz::Rng& r) {
                        c.p.scale_value = r.chance(0.5) ? std::numeric_limits<double>::quiet_NaN()
                                                        : -std::numeric_limits<double>::infinity();
                      }),
      fuzz::edit<Fia>("query dim negative", true, nullptr,
                      [](Fia& c, fuzz::Rng& r) {
                        const int d = static_cast<int>(r.range(0, c.in.query.rank() - 1));
                        c.in.query = support::resized(c.in.query, d, -c.in.query.size(d) - 1);
                      }),
      fuzz::edit<Fia>("query rank mismatch", true, nullptr,
                      [](Fia& c, fuzz::Rng&) {
                        const attnref::Dims qs = c.in.query.shape();
                        std::vector<Index> s(qs.begin(), qs.end());
                        if (s.size() == 4)
                          s[2] *= s[3], s.pop_back();
                        else
                          s.push_back(1);
                        c.in.query = StridedView<const half>(c.q.data(), s);
                      }),
      fuzz::edit<Fia>("key size overflows", true, nullptr,
                      [](Fia& c, fuzz::Rng&) {
                        c.in.key[0] = support::resized(c.in.key[0], 0, kHuge);
                        c.in.key[0] = support::resized(c.in.key[0], 1, kHuge);
                      }),
      fuzz::edit<Fia>("attention_out shape mismatch", true, nullptr,
                      [](Fia& c, fuzz::Rng&) {
                        const attnref::Dims os = c.out.shape();
                        std::vector<Index> s(os.begin(), os.end());
                        s.back() += 1;
                        regrow_out(c, s);
                      }),
      fuzz::edit<Fia>(
          "actual_seq_lengths_kv negative", true,
          [](const Fia& c) { return !c.in.actual_seq_lengths_kv.empty(); },
          [](Fia& c, fuzz::Rng& r) {
            c.in.actual_seq_lengths_kv[z(
                r.range(0, static_cast<Index>(c.in.actual_seq_lengths_kv.size()) - 1))] = -3;
          }),
      fuzz::edit<Fia>(
          "actual_seq_lengths_kv huge", true,
          [](const Fia& c) { return !c.in.actual_seq_lengths_kv.empty(); },
          [](Fia& c, fuzz::Rng& r) {
            c.in.actual_seq_lengths_kv.back() =
                r.chance(0.5) ? std::numeric_limits<std::int64_t>::max() : kHuge;
          }),
      // the prompt branch (Q_S > 1, or TND)
      fuzz::edit<Fia>(
          "atten_mask [1, 1, 1, S2] with Q_S > 1", true,
          [](const Fia& c) { return !c.incre && c.S1 > 1; },
          [](Fia& c, fuzz::Rng&) {  // the vLLM-Ascend shape: one query row covered
            c.mask.assign(z(std::max<Index>(c.S2, 1)), 0);
            c.in.atten_mask = StridedView<const std::uint8_t>(c.mask.data(), {1, 1, 1, c.S2});
            if (c.p.sparse_mode >= 2 && c.layout != "TND") c.p.sparse_mode = 0;
          }),
      fuzz::edit<Fia>("key / value tensor lists with Q_S > 1", true, is_prompt,
                      [](Fia& c, fuzz::Rng&) {
                        c.in.key.push_back(c.in.key[0]);
                        c.in.value.push_back(c.in.value[0]);
                      }),
      fuzz::edit<Fia>(
          "block_table with Q_S > 1", true, is_prompt,
          [](Fia& c, fuzz::Rng&) {
            c.table.assign(z(c.B), 0);
            c.in.block_table = StridedView<const std::int32_t>(c.table.data(), {c.B, 1});
            c.p.block_size = 16;
          }),
      fuzz::edit<Fia>("kv_padding_size with Q_S > 1", true, is_prompt,
                      [](Fia& c, fuzz::Rng&) {
                        static const std::int64_t pad[1] = {0};
                        c.in.kv_padding_size = StridedView<const std::int64_t>(pad, {1});
                      }),
      fuzz::edit<Fia>(
          "actual_seq_lengths past S1", true,
          [](const Fia& c) {
            return !c.incre && c.layout != "TND" && !c.in.actual_seq_lengths.empty();
          },
          [](Fia& c, fuzz::Rng& r) {
            c.in.actual_seq_lengths[0] = r.chance(0.5) ? c.S1 + 1 : kHuge;
          }),
      fuzz::edit<Fia>(
          "TND lengths not ending at T", true, [](const Fia& c) { return c.layout == "TND"; },
          [](Fia& c, fuzz::Rng& r) {
            (r.chance(0.5) ? c.in.actual_seq_lengths : c.in.actual_seq_lengths_kv).back() += 1;
          }),
      fuzz::edit<Fia>(
          "TND with a user mask", true, [](const Fia& c) { return c.layout == "TND"; },
          [](Fia& c, fuzz::Rng&) {
            c.p.sparse_mode = 0;
            c.mask.assign(z(std::max<Index>(1, c.S1 * c.S2)), 0);
            c.in.atten_mask = StridedView<const std::uint8_t>(c.mask.data(), {c.S1, c.S2});
          }),
      fuzz::edit<Fia>(
          "sparse_mode 1 without a mask", true,
          [](const Fia& c) { return !c.incre && c.layout != "TND"; },
          [](Fia& c, fuzz::Rng&) {
            c.p.sparse_mode = 1;
            c.in.atten_mask = {};
          }),
      fuzz::edit<Fia>(
          "sparse_mode 4 with an empty band", true,
          [](const Fia& c) { return c.p.sparse_mode == 4; },
          [](Fia& c, fuzz::Rng& r) {
            c.p.pre_tokens = r.chance(0.5) ? -2 : -5;
            c.p.next_tokens = r.chance(0.5) ? 1 : -1;
          }),
      fuzz::edit<Fia>("inner_precise out of range", true, nullptr,
                      [](Fia& c, fuzz::Rng& r) { c.p.inner_precise = r.chance(0.5) ? 4 : -1; }),
      fuzz::edit<Fia>(
          "learnable_sink with a layout other than TND", true,
          [](const Fia& c) { return c.layout != "TND"; },
          [](Fia& c, fuzz::Rng&) {
            c.sink.assign(z(c.N), attnref::bfloat16(0.5f));
            c.in.learnable_sink = StridedView<const attnref::bfloat16>(c.sink.data(), {c.N});
          }),
      fuzz::edit<Fia>(
          "learnable_sink with a head size other than 64 or 128", true,
          [](const Fia& c) { return c.layout == "TND" && c.sink.empty(); },
          [](Fia& c, fuzz::Rng&) {
            c.sink.assign(z(c.N), attnref::bfloat16(0.5f));
            c.in.learnable_sink = StridedView<const attnref::bfloat16>(c.sink.data(), {c.N});
          }),
      fuzz::edit<Fia>(
          "learnable_sink shape mismatch", true, [](const Fia& c) { return !c.sink.empty(); },
          [](Fia& c, fuzz::Rng& r) {
            c.sink.resize(z(c.N + 1), attnref::bfloat16(0.5f));
            c.in.learnable_sink =
                r.chance(0.5) ? StridedView<const attnref::bfloat16>(c.sink.data(), {c.N + 1})
                              : StridedView<const attnref::bfloat16>(c.sink.data(), {1, c.N});
          }),
      fuzz::edit<Fia>("antiquant_mode with Q_S > 1 (ignored)", false, is_prompt,
                      [](Fia& c, fuzz::Rng&) { c.p.antiquant_mode = 1; }),
      // the incremental branch (Q_S == 1)
      fuzz::edit<Fia>(
          "BNSD_BSND with Q_S == 1", true,
          [](const Fia& c) { return c.incre && c.layout == "BNSD"; },
          [](Fia& c, fuzz::Rng&) { c.p.input_layout = "BNSD_BSND"; }),
      fuzz::edit<Fia>("prompt-only parameters with Q_S == 1 (ignored)", false, is_incre,
                      [](Fia& c, fuzz::Rng& r) {
                        c.p.pre_tokens = r.range(-5, 5);
                        c.p.next_tokens = r.range(-5, 5);
                        c.p.sparse_mode = r.range(0, 4);
                        c.in.actual_seq_lengths = {-7, kHuge};
                      }),
      fuzz::edit<Fia>("inner_precise 2 or 3 with Q_S == 1", true, is_incre,
                      [](Fia& c, fuzz::Rng& r) { c.p.inner_precise = r.range(2, 3); }),
      fuzz::edit<Fia>("antiquant_mode 1 with fp16 key / value", true, is_incre,
                      [](Fia& c, fuzz::Rng&) { c.p.antiquant_mode = 1; }),
      fuzz::edit<Fia>(
          "kv lengths past S", true, [](const Fia& c) { return c.incre && c.store != kPaged; },
          [](Fia& c, fuzz::Rng&) {
            const Index s = c.store == kList ? c.kv_s[0] : c.S2;
            c.in.actual_seq_lengths_kv.assign(z(c.B), 0);
            c.in.actual_seq_lengths_kv[0] = s + 1;
          }),
      fuzz::edit<Fia>("key / value lists of different lengths", true, is_incre,
                      [](Fia& c, fuzz::Rng&) { c.in.value.push_back(c.in.value.back()); }),
      fuzz::edit<Fia>(
          "tensor list shorter than the batch", true,
          [](const Fia& c) { return c.incre && c.store == kList && c.B > 1; },
          [](Fia& c, fuzz::Rng&) {
            c.in.key.pop_back();
            c.in.value.pop_back();
          }),
      fuzz::edit<Fia>(
          "atten_mask narrower than the keys", true,
          [](const Fia& c) { return c.incre && (c.store == kPaged || max_of(c.kv_len) > 0); },
          [](Fia& c, fuzz::Rng&) {
            static const std::uint8_t m[1024] = {};  // >= B · (cols - 1)
            const Index cols = c.store == kPaged ? c.mb * c.bs : max_of(c.kv_len);
            c.in.atten_mask = StridedView<const std::uint8_t>(m, {c.B, cols - 1});
          }),
      fuzz::edit<Fia>(
          "block table entry out of range", true,
          [](const Fia& c) { return is_paged(c) && max_of(c.kv_len) > 0; },
          [](Fia& c, fuzz::Rng& r) {
            Index b = r.range(0, c.B - 1);
            while (c.kv_len[z(b)] == 0) b = (b + 1) % c.B;
            const Index blk = r.range(0, (c.kv_len[z(b)] - 1) / c.bs);
            const std::int32_t bad[] = {-1, static_cast<std::int32_t>(c.nb),
                                        std::numeric_limits<std::int32_t>::max(),
                                        std::numeric_limits<std::int32_t>::min()};
            c.table[z(b * c.mb + blk)] = bad[r.range(0, 3)];
            c.want_out_of_range = true;
          }),
      fuzz::edit<Fia>("block_size differs from the cache", true, is_paged,
                      [](Fia& c, fuzz::Rng& r) {
                        c.p.block_size = r.chance(0.5) ? c.bs + 16 : (r.chance(0.5) ? 0 : -16);
                      }),
      fuzz::edit<Fia>("paged without kv lengths", true, is_paged,
                      [](Fia& c, fuzz::Rng&) { c.in.actual_seq_lengths_kv.clear(); }),
      fuzz::edit<Fia>("kv lengths past the block table", true, is_paged,
                      [](Fia& c, fuzz::Rng&) {
                        c.in.actual_seq_lengths_kv = as_lengths(c.kv_len);
                        c.in.actual_seq_lengths_kv[0] = c.mb * c.bs + 1;
                      }),
      fuzz::edit<
          Fia>("block table size overflows", true, is_paged,
               [](Fia& c, fuzz::Rng&) {
                 c.in.block_table = support::reshaped(c.in.block_table, {c.B, Index(1) << 61});
               }),
      fuzz::edit<Fia>(
          "paged cache with a tensor list", true, [](const Fia& c) { return is_paged(c); },
          [](Fia& c, fuzz::Rng&) {
            c.in.key.push_back(c.in.key[0]);
            c.in.value.push_back(c.in.value[0]);
          }),
  };
  return list;
}

void restride_inputs(Fia& c, support::Restrider& r) {
  c.in.for_each_view([&](const std::string& name, auto& view) {
    if (name == "atten_mask" && c.compressed) return;  // 4 M elements, content not read
    r(name, view);
  });
}

attnref::FusedInferAttentionScoreOutputs<half> outputs(const Fia& c) { return {c.out, c.lse_out}; }

void validate_only(Fia& c) { attnref::validate(c.p, c.in, outputs(c)); }

void run(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, perturbations(), build, fuzz::Named{"fused_infer_attention_score"},
      [seed](Fia& c) {
        try {
          attnref::fused_infer_attention_score(c.p, c.in, outputs(c),
                                               {static_cast<int>(seed % 2 + 1)});
        } catch (const std::invalid_argument& e) {
          if (!c.want_out_of_range) throw;
          throw std::runtime_error(std::string("std::invalid_argument, not std::out_of_range: ") +
                                   e.what());
        }
      },
      verify, &Fia::q, &Fia::k, &Fia::v, &Fia::o, &Fia::lse, &Fia::mask, &Fia::table, &Fia::sink);
}

const fuzz::Register reg("fused_infer_attention_score", run);

}  // namespace fuzz_fia
