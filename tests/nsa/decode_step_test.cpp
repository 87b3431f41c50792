// NSA decode step (nsa/decode_step.hpp): the window branch (nsa_sliding_window_attention), the
// gated sum (nsa_gated_sum) and the whole step (nsa_decode_step) against the independent
// references tests/reference/nsa_select.hpp (selected / window / gated sum) and
// tests/reference/nsa.hpp (compressed branch, top-k). Window: w = 1, 5 and >= sel over TND and
// BSND (padded rows 0), multi-token, NaN in every raw row below the windows; w >= sel == the
// selected branch over every block. Gated sum: hand-worked exact values, one-hot gates pick a
// branch bit for bit, random values within one rounding. Decode step: every intermediate against
// the operator called directly (bit for bit) and against the references, the compressed cache
// random or made by nsa_compress from the raw one, batches shorter than one compress block,
// the vendor shape in strict mode; optional outputs absent == present, threads, TND == BSND;
// every rejection names its argument and writes nothing.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/nsa/compress.hpp>
#include <attnref/nsa/compress_attention.hpp>
#include <attnref/nsa/decode_step.hpp>
#include <attnref/nsa/select_attention.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "reference/nsa.hpp"
#include "reference/nsa_select.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/views.hpp"

namespace decode_step_test {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::NsaDecodeInputs;
using attnref::NsaDecodeOutputs;
using attnref::NsaDecodeParams;
using attnref::StridedView;
using support::dbl;
using support::z;
using i32 = std::int32_t;
using i64 = std::int64_t;
using Shape = std::vector<Index>;

template <class T>
support::Kind kind_of() {
  if constexpr (std::is_same_v<T, half>)
    return support::Kind::F16;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return support::Kind::BF16;
  else
    return support::Kind::F32;
}
template <class T>
ref::nsa::Dt dt_of() {
  if constexpr (std::is_same_v<T, half>)
    return ref::nsa::Dt::F16;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return ref::nsa::Dt::BF16;
  else
    return ref::nsa::Dt::F32;
}
template <class T>
double rnd(double x) {
  return dbl(T(static_cast<float>(x)));
}
template <class T>
std::vector<float> fl(const std::vector<T>& x) {
  std::vector<float> r;
  for (const T& e : x) r.push_back(static_cast<float>(e));
  return r;
}

// ---------------------------------------------------------------------------------------------
// The harness: raw paged K / V, compressed paged K / V, gates, all outputs.
// ---------------------------------------------------------------------------------------------

struct DCase {
  std::string layout = "TND";  // TND or BSND
  int N = 4, KVN = 2, Dqk = 32, Dv = 32;
  long l = 32, d = 16, ls = 64, k = 2, w = 8;
  int pbs = 64, cpbs = 16;
  double scale = 0.2;
  bool strict = false;
  int S = 0;  // BSND q_S (0: the longest q_len)
  std::vector<int> qlen;
  std::vector<long> sel;
  unsigned seed = 3, perm_seed = 13;
  bool from_compress = false;  // compressed K / V = nsa_compress of the raw K / V
  bool poison_window = false;  // NaN in the raw rows below every token's window
};

template <class T>
struct Step {
  DCase c;
  int B = 0, S = 0, rows = 0, total = 0, mb = 1, nb = 0, cmb = 1, cnb = 0;
  std::vector<int> cu;
  std::vector<long> cmp;
  std::vector<std::vector<double>> rq, rk, rv, ck, cv;  // per batch, rounded to T
  std::vector<T> q, k, v, kc, vc;
  std::vector<i32> bt, cbt;
  std::vector<float> gates;
  std::vector<T> out, cmp_out, sel_out, win_out;
  std::vector<i32> topk;

  explicit Step(const DCase& cs) : c(cs) {
    B = static_cast<int>(c.sel.size());
    std::mt19937 rng(c.seed);
    std::normal_distribution<double> nd;
    std::uniform_real_distribution<double> u;
    cu = {0};
    for (int b = 0; b < B; ++b) {
      const int ql = c.qlen[z(b)];
      const long s = c.sel[z(b)];
      cu.push_back(cu.back() + ql);
      cmp.push_back(attnref::nsa_compressed_count(s, c.l, c.d));
      std::vector<double> x;
      for (long e = 0; e < ql * c.N * c.Dqk; ++e) x.push_back(rnd<T>(nd(rng)));
      rq.push_back(x), x.clear();
      for (long e = 0; e < s * c.KVN * c.Dqk; ++e) x.push_back(rnd<T>(nd(rng)));
      rk.push_back(x), x.clear();
      for (long e = 0; e < s * c.KVN * c.Dv; ++e) x.push_back(rnd<T>(nd(rng)));
      rv.push_back(x), x.clear();
      for (long e = 0; e < cmp.back() * c.KVN * c.Dqk; ++e) x.push_back(rnd<T>(nd(rng)));
      ck.push_back(x), x.clear();
      for (long e = 0; e < cmp.back() * c.KVN * c.Dv; ++e) x.push_back(rnd<T>(nd(rng)));
      cv.push_back(x);
    }
    total = cu.back();
    S = c.S;
    if (S == 0)
      for (int ql : c.qlen) S = std::max(S, ql);
    rows = c.layout == "TND" ? total : B * S;
    if (c.from_compress) compress_raw(rng);
    q.assign(z(rows * c.N * c.Dqk), T(NAN));
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < c.qlen[z(b)]; ++i)
        for (int e = 0; e < c.N * c.Dqk; ++e)
          q[z(row(b, i) * c.N * c.Dqk + e)] =
              T(static_cast<float>(rq[z(b)][z(i * c.N * c.Dqk + e)]));
    // Raw cache (NaN past each length, in spare blocks and, if asked, below the windows).
    std::vector<long> lo(z(B), 0);
    if (c.poison_window)
      for (int b = 0; b < B; ++b) lo[z(b)] = std::max(0L, c.sel[z(b)] - c.qlen[z(b)] - c.w + 1);
    page(c.sel, c.pbs, rk, rv, lo, 3, c.perm_seed, k, v, bt, mb, nb);
    page(cmp, c.cpbs, ck, cv, std::vector<long>(z(B), 0), 2, c.perm_seed + 1, kc, vc, cbt, cmb,
         cnb);
    gates.resize(z(rows * c.N * 3));
    for (float& g : gates) g = static_cast<float>(u(rng));
    out.assign(z(rows * c.N * c.Dv), T(-777.0f));
    cmp_out = sel_out = win_out = std::vector<T>(out.size(), T(-555.0f));
    topk.assign(z(rows * c.KVN * c.k), 12345);
  }

  // Compressed K / V made from the raw ones by nsa_compress (TND over all batches).
  void compress_raw(std::mt19937& rng) {
    std::normal_distribution<double> nd;
    std::vector<i64> cum;
    long t = 0;
    for (long s : c.sel) cum.push_back(t += s);
    long tc = 0;
    for (long x : cmp) tc += x;
    attnref::NsaCompressParams p;
    p.compress_block_size = c.l, p.compress_stride = c.d, p.strict = false;
    for (int pass = 0; pass < 2; ++pass) {
      const int D = pass == 0 ? c.Dqk : c.Dv;
      const auto& raw = pass == 0 ? rk : rv;
      auto& dst = pass == 0 ? ck : cv;
      std::vector<T> x, w(z(c.l * c.KVN)), o(z(std::max(1L, tc) * c.KVN * D));
      for (const auto& r : raw)
        for (double e : r) x.push_back(T(static_cast<float>(e)));
      for (T& e : w) e = T(static_cast<float>(0.2 * nd(rng)));
      if (x.empty()) x.push_back(T(0.0f));
      attnref::nsa_compress<T>(p, StridedView<const T>(x.data(), {t, c.KVN, D}),
                               StridedView<const T>(w.data(), {c.l, c.KVN}), cum,
                               StridedView<T>(o.data(), {tc, c.KVN, D}));
      long at = 0;
      for (int b = 0; b < B; ++b) {
        dst[z(b)].clear();
        for (long e = 0; e < cmp[z(b)] * c.KVN * D; ++e) dst[z(b)].push_back(dbl(o[z(at + e)]));
        at += cmp[z(b)] * c.KVN * D;
      }
    }
  }

  // A shuffled paged pool for per-batch token data; tokens below lo[b] stay NaN.
  void page(const std::vector<long>& len, int pb, const std::vector<std::vector<double>>& kd,
            const std::vector<std::vector<double>>& vd, const std::vector<long>& lo, int spare,
            unsigned seed, std::vector<T>& K, std::vector<T>& V, std::vector<i32>& table,
            int& max_blocks, int& blocks) {
    int used = 0, longest = 0;
    for (long x : len) {
      const int n = static_cast<int>((x + pb - 1) / pb);
      used += n, longest = std::max(longest, n);
    }
    max_blocks = longest + 1;
    blocks = used + spare;
    std::vector<i32> pool(z(blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::mt19937 prng(seed);
    std::shuffle(pool.begin(), pool.end(), prng);
    table.assign(z(B * max_blocks), -1);
    K.assign(z(blocks * pb * c.KVN * c.Dqk), T(NAN));
    V.assign(z(blocks * pb * c.KVN * c.Dv), T(NAN));
    size_t next = 0;
    for (int b = 0; b < B; ++b)
      for (long t = 0; t < len[z(b)]; ++t) {
        if (t % pb == 0) table[z(b * max_blocks + t / pb)] = pool[next++];
        if (t < lo[z(b)]) continue;
        const long r = table[z(b * max_blocks + t / pb)] * pb + t % pb;
        for (int e = 0; e < c.KVN * c.Dqk; ++e)
          K[z(r * c.KVN * c.Dqk + e)] = T(static_cast<float>(kd[z(b)][z(t * c.KVN * c.Dqk + e)]));
        for (int e = 0; e < c.KVN * c.Dv; ++e)
          V[z(r * c.KVN * c.Dv + e)] = T(static_cast<float>(vd[z(b)][z(t * c.KVN * c.Dv + e)]));
      }
  }

  int row(int b, int i) const { return c.layout == "TND" ? cu[z(b)] + i : b * S + i; }
  Shape lay(Index heads, Index last) const {
    return c.layout == "TND" ? Shape{total, heads, last} : Shape{B, S, heads, last};
  }
  NsaDecodeParams params() const {
    NsaDecodeParams p;
    p.num_heads = c.N, p.num_key_value_heads = c.KVN;
    p.compress_block_size = c.l, p.compress_block_stride = c.d;
    p.select_block_size = c.ls, p.select_block_count = c.k, p.window_size = c.w;
    p.page_block_size = c.pbs, p.cmp_page_block_size = c.cpbs;
    p.scale_value = c.scale, p.layout = c.layout, p.strict = c.strict;
    return p;
  }
  NsaDecodeInputs<T> inputs() const {
    NsaDecodeInputs<T> in;
    in.query = StridedView<const T>(q.data(), lay(c.N, c.Dqk));
    in.key = StridedView<const T>(k.data(), {nb, c.pbs, c.KVN * c.Dqk});
    in.value = StridedView<const T>(v.data(), {nb, c.pbs, c.KVN * c.Dv});
    in.block_table = StridedView<const i32>(bt.data(), {B, mb});
    in.cmp_key = StridedView<const T>(kc.data(), {cnb, c.cpbs, c.KVN * c.Dqk});
    in.cmp_value = StridedView<const T>(vc.data(), {cnb, c.cpbs, c.KVN * c.Dv});
    in.cmp_block_table = StridedView<const i32>(cbt.data(), {B, cmb});
    in.gates = StridedView<const float>(gates.data(), {rows, c.N, 3});
    for (int b = 0; b < B; ++b) {
      in.actual_q_seq_len.push_back(c.qlen[z(b)]);
      in.actual_sel_kv_seq_len.push_back(c.sel[z(b)]);
    }
    return in;
  }
  NsaDecodeOutputs<T> outputs(bool all = true) {
    NsaDecodeOutputs<T> o;
    o.output = StridedView<T>(out.data(), lay(c.N, c.Dv));
    if (all) {
      o.topk = StridedView<i32>(topk.data(), lay(c.KVN, c.k));
      o.cmp_out = StridedView<T>(cmp_out.data(), lay(c.N, c.Dv));
      o.sel_out = StridedView<T>(sel_out.data(), lay(c.N, c.Dv));
      o.win_out = StridedView<T>(win_out.data(), lay(c.N, c.Dv));
    }
    return o;
  }
  void run(int threads = 0, bool all = true) {
    attnref::nsa_decode_step(params(), inputs(), outputs(all), threads);
  }
  void run_window(int threads = 0) {
    attnref::nsa_sliding_window_attention(params(), inputs(),
                                          StridedView<T>(win_out.data(), lay(c.N, c.Dv)), threads);
  }
  // Live rows of a [rows, N, Dv] buffer, batch / token order.
  std::vector<double> live(const std::vector<T>& x) const {
    std::vector<double> r;
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < c.qlen[z(b)]; ++i)
        for (int e = 0; e < c.N * c.Dv; ++e) r.push_back(dbl(x[z(row(b, i) * c.N * c.Dv + e)]));
    return r;
  }
  // Padded BSND rows of a [rows, N, Dv] buffer are exactly 0.
  ::testing::AssertionResult padded_zero(const std::vector<T>& x) const {
    if (c.layout == "TND") return ::testing::AssertionSuccess();
    for (int b = 0; b < B; ++b)
      for (int i = c.qlen[z(b)]; i < S; ++i)
        for (int e = 0; e < c.N * c.Dv; ++e)
          if (dbl(x[z(row(b, i) * c.N * c.Dv + e)]) != 0.0)
            return ::testing::AssertionFailure() << "padded row b " << b << " i " << i;
    return ::testing::AssertionSuccess();
  }
  ref::nsa_select::Problem sel_problem() const {
    ref::nsa_select::Problem p;
    p.N = c.N, p.KVN = c.KVN, p.Dqk = c.Dqk, p.Dv = c.Dv, p.scale = c.scale;
    p.ls = c.ls, p.k = c.k;
    return p;
  }
  // The reference batch of the raw cache (top-k from `tk`, laid out like topk).
  ref::nsa_select::Batch sel_batch(int b, const std::vector<i32>& tk) const {
    ref::nsa_select::Batch x;
    x.q_len = c.qlen[z(b)], x.sel = c.sel[z(b)], x.q = rq[z(b)], x.k = rk[z(b)], x.v = rv[z(b)];
    for (int i = 0; i < x.q_len; ++i)
      for (long e = 0; e < c.KVN * c.k; ++e) x.topk.push_back(tk[z(row(b, i) * c.KVN * c.k + e)]);
    return x;
  }
  std::vector<double> ref_window() const {
    std::vector<double> r;
    for (int b = 0; b < B; ++b) {
      const auto o = ref::nsa_select::window(sel_problem(), sel_batch(b, topk), c.w);
      r.insert(r.end(), o.begin(), o.end());
    }
    return r;
  }
};

// ---------------------------------------------------------------------------------------------
// Window branch
// ---------------------------------------------------------------------------------------------

template <class T>
void check_window(const DCase& c) {
  Step<T> st(c);
  ASSERT_NO_THROW(st.run_window());
  EXPECT_TRUE(
      support::all_close(st.ref_window(), st.live(st.win_out), support::tolerance(kind_of<T>())));
  EXPECT_TRUE(st.padded_zero(st.win_out));
}

std::vector<DCase> window_grid() {
  std::vector<DCase> v;
  for (long w : {1L, 5L, 1000L}) {
    DCase c;  // TND, G 2, multi-token, lengths from q_len up
    c.N = 4, c.KVN = 2, c.Dqk = 32, c.Dv = 16, c.w = w, c.pbs = 16, c.poison_window = true;
    c.sel = {1, 4, 5, 17, 100}, c.qlen = {1, 4, 2, 3, 4};
    v.push_back(c);
    c.layout = "BSND", c.S = 4, c.N = 8, c.KVN = 1, c.Dqk = 24, c.Dv = 40, c.pbs = 32;
    c.sel = {3, 9, 64, 33}, c.qlen = {2, 4, 1, 3};  // padded rows
    v.push_back(c);
  }
  return v;
}

TEST(NsaSlidingWindow, MatchesReference) {
  int i = 0;
  for (DCase c : window_grid()) {
    SCOPED_TRACE("case " + std::to_string(i++) + " w " + std::to_string(c.w));
    check_window<half>(c);
    c.seed += 10;
    check_window<bfloat16>(c);
    c.seed += 10;
    check_window<float>(c);
  }
}

// w = 1: each token sees only its own position: the output is that value, bit for bit.
TEST(NsaSlidingWindow, WindowOfOneIsTheOwnValue) {
  DCase c;
  c.layout = "BSND", c.S = 3, c.N = 4, c.KVN = 2, c.Dqk = 16, c.Dv = 16, c.w = 1, c.pbs = 16;
  c.sel = {3, 40, 17}, c.qlen = {3, 2, 1}, c.poison_window = true;
  Step<bfloat16> st(c);
  st.run_window();
  for (int b = 0; b < st.B; ++b)
    for (int i = 0; i < c.qlen[z(b)]; ++i) {
      const long t = c.sel[z(b)] - c.qlen[z(b)] + i;
      const long r = st.bt[z(b * st.mb + t / 16)] * 16 + t % 16;
      for (int h = 0; h < 4; ++h)
        for (int e = 0; e < 16; ++e)
          EXPECT_EQ(dbl(st.win_out[z((st.row(b, i) * 4 + h) * 16 + e)]),
                    dbl(st.v[z((r * 2 + h / 2) * 16 + e)]))
              << "b " << b << " i " << i << " h " << h;
    }
}

// w >= sel is plain causal attention: the selected branch with every block selected.
TEST(NsaSlidingWindow, FullWindowEqualsSelectedOverEveryBlock) {
  DCase c;
  c.N = 8, c.KVN = 2, c.Dqk = 32, c.Dv = 32, c.w = 500, c.pbs = 64, c.ls = 32;
  c.sel = {4, 31, 64, 130, 257}, c.qlen = {4, 1, 3, 2, 4};
  Step<half> st(c);
  st.run_window();
  const long ns = (257 + 31) / 32;  // 9: k = the longest batch's select blocks
  std::vector<i32> tk;              // every block of the batch, descending, then -1
  for (int b = 0; b < st.B; ++b) {
    const long nb_sel = (c.sel[z(b)] + 31) / 32;
    for (int i = 0; i < c.qlen[z(b)]; ++i)
      for (int g = 0; g < c.KVN; ++g)
        for (long j = 0; j < ns; ++j)
          tk.push_back(j < nb_sel ? static_cast<i32>(nb_sel - 1 - j) : -1);
  }
  attnref::NsaSelectedAttentionInferParams sp;
  sp.num_heads = 8, sp.num_key_value_heads = 2, sp.select_block_size = 32;
  sp.select_block_count = ns, sp.page_block_size = 64, sp.scale_value = c.scale;
  sp.layout = "TND", sp.strict = false;
  attnref::NsaSelectedAttentionInferInputs<half> si;
  const auto in = st.inputs();
  si.query = in.query, si.key = in.key, si.value = in.value, si.block_table = in.block_table;
  si.topk_indices = StridedView<const i32>(tk.data(), {st.total, 2, ns});
  si.actual_q_seq_len = in.actual_q_seq_len, si.actual_sel_kv_seq_len = in.actual_sel_kv_seq_len;
  std::vector<half> o(st.out.size(), half(-1.0f));
  attnref::nsa_selected_attention_infer<half>(sp, si, {StridedView<half>(o.data(), st.lay(8, 32))});
  EXPECT_TRUE(
      support::all_close(st.live(o), st.live(st.win_out), support::tolerance(support::Kind::F16)));
}

TEST(NsaSlidingWindow, ThreadsOneEqualsTwoBitForBit) {
  DCase c = window_grid()[1];
  Step<half> a(c), b(c);
  a.run_window(1), b.run_window(2);
  EXPECT_TRUE(support::bitwise_equal(fl(a.win_out), fl(b.win_out)));
}

using WP = NsaDecodeParams;
using WIn = NsaDecodeInputs<half>;
using WEdit = std::function<void(Step<half>&, WP&, WIn&, StridedView<half>&)>;

void reject_window(const DCase& c, const WEdit& edit, const std::string& what, bool oor = false) {
  SCOPED_TRACE(what);
  Step<half> st(c);
  WP p = st.params();
  WIn in = st.inputs();
  StridedView<half> o(st.win_out.data(), st.lay(c.N, c.Dv));
  edit(st, p, in, o);
  const auto w0 = st.win_out;
  support::expect_throw([&] { attnref::nsa_sliding_window_attention(p, in, o); }, what, oor);
  EXPECT_EQ(0, std::memcmp(w0.data(), st.win_out.data(), w0.size() * sizeof(half)));
}

TEST(NsaSlidingWindow, Rejections) {
  DCase c;
  c.N = 4, c.KVN = 2, c.Dqk = 16, c.Dv = 16, c.w = 4, c.pbs = 16;
  c.sel = {10, 40}, c.qlen = {2, 1};
  reject_window(
      c, [](Step<half>&, WP& p, WIn&, StridedView<half>&) { p.window_size = 0; },
      "params.window_size");
  reject_window(
      c, [](Step<half>&, WP& p, WIn&, StridedView<half>&) { p.layout = "BSH"; }, "params.layout");
  reject_window(
      c, [](Step<half>&, WP& p, WIn&, StridedView<half>&) { p.num_key_value_heads = 3; },
      "params.num_heads");
  reject_window(
      c, [](Step<half>&, WP& p, WIn&, StridedView<half>&) { p.page_block_size = 32; }, "key.shape");
  reject_window(
      c,
      [](Step<half>&, WP&, WIn& in, StridedView<half>&) {
        in.key = support::reshaped(in.key, {in.key.size(0), 16, 2, 16});
      },
      "key.shape");
  reject_window(
      c,
      [](Step<half>&, WP&, WIn& in, StridedView<half>&) {
        in.value = support::resized(in.value, 0, in.value.size(0) - (1));
      },
      "value.shape");
  reject_window(
      c,
      [](Step<half>&, WP&, WIn& in, StridedView<half>&) {
        in.value = support::reshaped(in.value, {in.value.size(0), 16, 2, 16});
      },
      "value.shape");
  reject_window(
      c,
      [](Step<half>&, WP&, WIn&, StridedView<half>& o) {
        o = support::reshaped(o, {3, 4, 8});
      },
      "out.shape");
  reject_window(
      c, [](Step<half>&, WP&, WIn& in, StridedView<half>&) { in.actual_sel_kv_seq_len[0] = 1; },
      "actual_sel_kv_seq_len[0]");
  reject_window(
      c, [](Step<half>&, WP&, WIn& in, StridedView<half>&) { in.actual_sel_kv_seq_len.pop_back(); },
      "actual_sel_kv_seq_len");
  reject_window(
      c,
      [](Step<half>&, WP&, WIn& in, StridedView<half>&) {
        in.actual_q_seq_len = {2, 5};
      },
      "actual_q_seq_len[1]");
  reject_window(
      c,
      [](Step<half>&, WP&, WIn& in, StridedView<half>&) {
        in.query = support::reshaped(in.query, {4, 4, 16});
      },
      "query.shape[0]");
  reject_window(
      c, [](Step<half>& s, WP&, WIn&, StridedView<half>&) { s.bt[z(s.mb + 2)] = s.nb; },
      "block_table[1][2]", true);
}

// ---------------------------------------------------------------------------------------------
// Gated sum
// ---------------------------------------------------------------------------------------------

template <class T>
void gated(const std::vector<float>& g, const std::vector<T>& a, const std::vector<T>& b,
           const std::vector<T>& c, std::vector<T>& o, const Shape& s, const Shape& gs) {
  attnref::nsa_gated_sum<T>(StridedView<const float>(g.data(), gs),
                            StridedView<const T>(a.data(), s), StridedView<const T>(b.data(), s),
                            StridedView<const T>(c.data(), s), StridedView<T>(o.data(), s));
}

// Values and gates with few significant bits: every fp32 step is exact, so is the result.
TEST(NsaGatedSum, HandWorkedExact) {
  // rows 2, N 2, Dv 2. Gates per (row, head): (0.5, 0.25, 0.125), (1, 0, 2), (0, 0, 0),
  // (0.75, -0.5, 0.25).
  const std::vector<float> g = {0.5f, 0.25f, 0.125f, 1, 0, 2, 0, 0, 0, 0.75f, -0.5f, 0.25f};
  const std::vector<half> a = {half(8.0f), half(-4.0f), half(1.0f), half(3.0f),
                               half(5.0f), half(6.0f),  half(4.0f), half(-8.0f)};
  const std::vector<half> b = {half(16.0f), half(2.0f), half(7.0f), half(7.0f),
                               half(9.0f),  half(9.0f), half(2.0f), half(6.0f)};
  const std::vector<half> c = {half(64.0f), half(-8.0f), half(0.5f), half(-1.0f),
                               half(1.0f),  half(2.0f),  half(8.0f), half(4.0f)};
  // 0.5·8 + 0.25·16 + 0.125·64 = 16; 0.5·-4 + 0.25·2 + 0.125·-8 = -2.5;
  // 1 + 0 + 1 = 2; 3 + 0 - 2 = 1; 0; 0; 3 - 1 + 2 = 4; -6 - 3 + 1 = -8.
  const std::vector<float> want = {16, -2.5f, 2, 1, 0, 0, 4, -8};
  std::vector<half> o(8, half(-1.0f));
  gated(g, a, b, c, o, {2, 2, 2}, {2, 2, 3});
  EXPECT_EQ(fl(o), want);
  // The same in BSND [B 1, S 2, N 2, Dv 2] with gates [rows 2, N 2, 3], and in bf16.
  std::fill(o.begin(), o.end(), half(-1.0f));
  gated(g, a, b, c, o, {1, 2, 2, 2}, {2, 2, 3});
  EXPECT_EQ(fl(o), want);
  std::vector<bfloat16> ab, bb, cb, ob(8, bfloat16(-1.0f));
  for (int i = 0; i < 8; ++i)
    ab.push_back(bfloat16(static_cast<float>(a[z(i)]))),
        bb.push_back(bfloat16(static_cast<float>(b[z(i)]))),
        cb.push_back(bfloat16(static_cast<float>(c[z(i)])));
  gated(g, ab, bb, cb, ob, {2, 2, 2}, {2, 2, 3});
  EXPECT_EQ(fl(ob), want);
}

TEST(NsaGatedSum, OneHotGatesPickABranchExactly) {
  const int rows = 5, N = 3, Dv = 7;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<half> a, b, c, o(z(rows * N * Dv), half(-1.0f));
  for (int e = 0; e < rows * N * Dv; ++e)
    a.push_back(half(nd(rng))), b.push_back(half(nd(rng))), c.push_back(half(nd(rng)));
  std::vector<float> g(z(rows * N * 3), 0.0f);
  for (int r = 0; r < rows * N; ++r) g[z(r * 3 + r % 3)] = 1.0f;
  gated(g, a, b, c, o, {rows, N, Dv}, {rows, N, 3});
  for (int e = 0; e < rows * N * Dv; ++e) {
    const int pick = e / Dv % 3;
    const half want = pick == 0 ? a[z(e)] : pick == 1 ? b[z(e)] : c[z(e)];
    ASSERT_EQ(0, std::memcmp(&o[z(e)], &want, sizeof(half))) << e;
  }
}

// Random: fp32 sum of three products (a few fp32 ulps) then one rounding to T.
template <class T>
void gated_random(unsigned seed) {
  const int B = 2, S = 3, N = 4, Dv = 9;
  const int n = B * S * N * Dv;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> u;
  std::vector<T> a, b, c, o(z(n), T(-1.0f));
  for (int e = 0; e < n; ++e)
    a.push_back(T(nd(rng))), b.push_back(T(nd(rng))), c.push_back(T(nd(rng)));
  std::vector<float> g(z(B * S * N * 3));
  for (float& x : g) x = u(rng);
  gated(g, a, b, c, o, {B, S, N, Dv}, {B * S, N, 3});
  std::vector<double> want, gg(g.begin(), g.end()), ad, bd, cd;
  for (int e = 0; e < n; ++e)
    ad.push_back(dbl(a[z(e)])), bd.push_back(dbl(b[z(e)])), cd.push_back(dbl(c[z(e)]));
  want = ref::nsa_select::gated_sum(gg, ad, bd, cd, Dv);
  std::vector<double> got;
  for (const T& x : o) got.push_back(dbl(x));
  EXPECT_TRUE(support::all_close(want, got, support::tolerance(kind_of<T>())));
}

TEST(NsaGatedSum, MatchesDoubleWithinOneRounding) {
  gated_random<half>(1);
  gated_random<bfloat16>(2);
  gated_random<float>(3);
}

TEST(NsaGatedSum, Rejections) {
  const int rows = 3, N = 2, Dv = 4;
  std::vector<half> a(z(rows * N * Dv), half(1.0f)), o(a.size(), half(-9.0f));
  std::vector<float> g(z(rows * N * 3), 0.5f);
  const Shape s{rows, N, Dv}, gs{rows, N, 3};
  auto call = [&](Shape os, Shape as, Shape gsh, bool null_gates = false, bool null_b = false) {
    return [&, os, as, gsh, null_gates, null_b] {
      attnref::nsa_gated_sum<half>(StridedView<const float>(null_gates ? nullptr : g.data(), gsh),
                                   StridedView<const half>(a.data(), s),
                                   StridedView<const half>(null_b ? nullptr : a.data(), as),
                                   StridedView<const half>(a.data(), s),
                                   StridedView<half>(o.data(), os));
    };
  };
  auto check = [&](const std::function<void()>& f, const std::string& what) {
    SCOPED_TRACE(what);
    support::expect_throw(f, what, false);
    for (const half& x : o) ASSERT_EQ(dbl(x), -9.0);
  };
  check(call({rows * N * Dv}, s, gs), "out.shape");
  check(call({rows * N, Dv}, s, gs), "out.shape");
  check(call(s, {rows, N, Dv + 1}, gs), "branch output shape");
  check(call(s, {rows, Dv, N}, gs), "branch output shape");
  check(call(s, s, s, false, true), "o_sel data is null");
  check(call(s, s, {rows, N, 2}), "gates.shape");
  check(call(s, s, {rows - 1, N, 3}), "gates.shape");
  check(call(s, s, {rows, 3, N}), "gates.shape");
  check(call(s, s, gs, true), "gates data is null");
}

// ---------------------------------------------------------------------------------------------
// Decode step
// ---------------------------------------------------------------------------------------------

// Top-k of one (row, kv head) against the reference group scores g (double, forced = +inf):
// exactly the reference's order, except that two finite scores within a relative 1e-5 of each
// other may come in either order (fp32 vs double).
::testing::AssertionResult topk_ok(const std::vector<double>& g, const i32* got, long k) {
  const long n = static_cast<long>(g.size()), m = std::min(k, n);
  auto near = [&](long x, long y) {
    const double a = g[z(x)], b = g[z(y)];
    if (std::isinf(a) || std::isinf(b)) return false;
    return std::fabs(a - b) <= 1e-5 * std::max(std::fabs(a), std::fabs(b));
  };
  auto must_precede = [&](long x, long y) {
    const double a = g[z(x)], b = g[z(y)];
    if (a == b) return std::isinf(a) ? x < y : false;
    return a > b && !near(x, y);
  };
  std::ostringstream dump;
  for (long i = 0; i < k; ++i) dump << (i ? " " : " got [") << got[i];
  dump << "]";
  std::vector<char> chosen(z(n), 0);
  for (long i = 0; i < k; ++i) {
    if (i >= m) {
      if (got[i] != -1) return ::testing::AssertionFailure() << "position " << i << dump.str();
      continue;
    }
    if (got[i] < 0 || got[i] >= n || chosen[z(got[i])])
      return ::testing::AssertionFailure() << "invalid/duplicate at " << i << dump.str();
    chosen[z(got[i])] = 1;
  }
  for (long i = 0; i < m; ++i)
    for (long j = i + 1; j < m; ++j)
      if (must_precede(got[j], got[i]))
        return ::testing::AssertionFailure() << "order at " << i << ", " << j << dump.str();
  for (long y = 0; y < n; ++y)
    if (!chosen[z(y)])
      for (long i = 0; i < m; ++i)
        if (must_precede(y, got[i]))
          return ::testing::AssertionFailure() << "block " << y << " left out" << dump.str();
  return ::testing::AssertionSuccess();
}

// out vs the gated sum of the reference branches: each branch output carries one rounding to T
// (plus fp32 noise), weighted by its gate, and the sum is rounded once more, so the bound is the
// branch tolerances weighted by |gate| plus one more output tolerance.
::testing::AssertionResult gated_close(const std::vector<double>& gates,
                                       const std::vector<double> (&br)[3],
                                       const std::vector<double>& got, long Dv,
                                       support::Tolerance t) {
  std::size_t bad = 0, worst = 0;
  double worst_excess = -1;
  std::vector<double> want(got.size());
  for (std::size_t e = 0; e < got.size(); ++e) {
    const double* g = gates.data() + e / static_cast<std::size_t>(Dv) * 3;
    double allowed = 0.0, w = 0.0;
    for (int j = 0; j < 3; ++j) {
      w += g[j] * br[j][e];
      allowed += std::fabs(g[j]) * (t.atol + t.rtol * std::fabs(br[j][e]));
    }
    allowed += t.atol + t.rtol * std::fabs(w);
    want[e] = w;
    const double excess = std::fabs(got[e] - w) - allowed;
    if (!(excess <= 0)) ++bad;
    if (!(excess <= worst_excess)) worst_excess = excess, worst = e;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " outside; worst [" << worst << "] expected "
         << want[worst] << ", got " << got[worst];
}

template <class T>
std::vector<i32> topk_direct(Step<T>& st, std::vector<T>& o) {
  const auto& c = st.c;
  attnref::NsaCompressAttentionInferParams cp;
  cp.num_heads = c.N, cp.num_key_value_heads = c.KVN;
  cp.select_block_size = c.ls, cp.select_block_count = c.k;
  cp.compress_block_size = c.l, cp.compress_block_stride = c.d;
  cp.scale_value = c.scale, cp.layout = c.layout, cp.page_block_size = c.cpbs;
  cp.strict = c.strict;
  const auto in = st.inputs();
  attnref::NsaCompressAttentionInferInputs<T> ci;
  const std::uint8_t flag = 1;
  ci.query = in.query, ci.key = in.cmp_key, ci.value = in.cmp_value;
  ci.atten_mask = StridedView<const std::uint8_t>(&flag, {1});
  ci.block_table = in.cmp_block_table, ci.actual_q_seq_len = in.actual_q_seq_len;
  ci.actual_sel_kv_seq_len = in.actual_sel_kv_seq_len;
  for (long x : st.cmp) ci.actual_cmp_kv_seq_len.push_back(x);
  std::vector<i32> tk(st.topk.size(), -9);
  o.assign(st.out.size(), T(-3.0f));
  attnref::NsaCompressAttentionInferOutputs<T> co{StridedView<T>(o.data(), st.lay(c.N, c.Dv)),
                                                  StridedView<i32>(tk.data(), st.lay(c.KVN, c.k))};
  attnref::nsa_compress_attention_infer(cp, ci, co);
  return tk;
}

template <class T>
void check_step(const DCase& c) {
  Step<T> st(c);
  ASSERT_NO_THROW(st.run());
  const auto tol = support::tolerance(kind_of<T>());
  // 1. Each intermediate is the operator called directly on the same inputs, bit for bit.
  std::vector<T> o_direct;
  EXPECT_EQ(topk_direct(st, o_direct), st.topk) << "topk vs nsa_compress_attention_infer";
  EXPECT_TRUE(support::bitwise_equal(fl(o_direct), fl(st.cmp_out))) << "cmp_out";
  {
    attnref::NsaSelectedAttentionInferParams sp;
    sp.num_heads = c.N, sp.num_key_value_heads = c.KVN, sp.select_block_size = c.ls;
    sp.select_block_count = c.k, sp.page_block_size = c.pbs, sp.scale_value = c.scale;
    sp.layout = c.layout, sp.strict = c.strict;
    const auto in = st.inputs();
    attnref::NsaSelectedAttentionInferInputs<T> si;
    si.query = in.query, si.key = in.key, si.value = in.value, si.block_table = in.block_table;
    if (c.layout == "BSND") {  // the selected operator takes 4-d caches with BSND (strict)
      si.key = support::reshaped(si.key, {in.key.size(0), in.key.size(1), c.KVN, c.Dqk});
      si.value = support::reshaped(si.value, {in.value.size(0), in.value.size(1), c.KVN, c.Dv});
    }
    si.topk_indices = StridedView<const i32>(st.topk.data(), st.lay(c.KVN, c.k));
    si.actual_q_seq_len = in.actual_q_seq_len;
    si.actual_sel_kv_seq_len = in.actual_sel_kv_seq_len;
    std::vector<T> o(st.out.size(), T(-3.0f));
    attnref::nsa_selected_attention_infer<T>(sp, si, {StridedView<T>(o.data(), st.lay(c.N, c.Dv))});
    EXPECT_TRUE(support::bitwise_equal(fl(o), fl(st.sel_out))) << "sel_out";
    std::vector<T> w(st.out.size(), T(-3.0f));
    attnref::nsa_sliding_window_attention<T>(st.params(), in,
                                             StridedView<T>(w.data(), st.lay(c.N, c.Dv)));
    EXPECT_TRUE(support::bitwise_equal(fl(w), fl(st.win_out))) << "win_out";
    std::vector<T> g(st.out.size(), T(-3.0f));
    gated(st.gates, st.cmp_out, st.sel_out, st.win_out, g, st.lay(c.N, c.Dv), {st.rows, c.N, 3});
    EXPECT_TRUE(support::bitwise_equal(fl(g), fl(st.out))) << "output";
  }
  // 2. Against the references.
  ref::nsa::Problem cpr;
  cpr.N = c.N, cpr.KVN = c.KVN, cpr.Dqk = c.Dqk, cpr.Dv = c.Dv, cpr.scale = c.scale;
  cpr.g = {c.l, c.d, c.ls}, cpr.k = c.k, cpr.mask = true, cpr.dt = dt_of<T>();
  std::vector<double> rc, rs, rw, gl;
  for (int b = 0; b < st.B; ++b) {
    ref::nsa::Batch x;
    x.q_len = c.qlen[z(b)], x.cmp = st.cmp[z(b)], x.sel = c.sel[z(b)];
    x.q = st.rq[z(b)], x.k = st.ck[z(b)], x.v = st.cv[z(b)];
    const auto r = ref::nsa::run(cpr, x);
    rc.insert(rc.end(), r.out.begin(), r.out.end());
    for (int i = 0; i < x.q_len; ++i)
      for (int kh = 0; kh < c.KVN; ++kh) {
        const auto at = r.group_scores.begin() + (i * c.KVN + kh) * r.n_sel;
        EXPECT_TRUE(topk_ok(std::vector<double>(at, at + r.n_sel),
                            st.topk.data() + (st.row(b, i) * c.KVN + kh) * c.k, c.k))
            << "batch " << b << " token " << i << " kv head " << kh;
      }
    // The selected reference takes the step's own top-k (an input of that branch).
    const auto so = ref::nsa_select::selected(st.sel_problem(), st.sel_batch(b, st.topk));
    rs.insert(rs.end(), so.begin(), so.end());
    const auto wo = ref::nsa_select::window(st.sel_problem(), st.sel_batch(b, st.topk), c.w);
    rw.insert(rw.end(), wo.begin(), wo.end());
    for (int i = 0; i < x.q_len; ++i)
      for (int e = 0; e < c.N * 3; ++e) gl.push_back(st.gates[z(st.row(b, i) * c.N * 3 + e)]);
  }
  EXPECT_TRUE(support::all_close(rc, st.live(st.cmp_out), tol)) << "cmp_out vs reference";
  EXPECT_TRUE(support::all_close(rs, st.live(st.sel_out), tol)) << "sel_out vs reference";
  EXPECT_TRUE(support::all_close(rw, st.live(st.win_out), tol)) << "win_out vs reference";
  const std::vector<double> br[3] = {rc, rs, rw};
  EXPECT_TRUE(gated_close(gl, br, st.live(st.out), c.Dv, tol)) << "output vs reference";
  // 3. Padded BSND rows: 0 everywhere, top-k -1.
  for (const auto* x : {&st.out, &st.cmp_out, &st.sel_out, &st.win_out})
    EXPECT_TRUE(st.padded_zero(*x));
  if (c.layout != "BSND") return;
  for (int b = 0; b < st.B; ++b)
    for (int i = c.qlen[z(b)]; i < st.S; ++i)
      for (long e = 0; e < c.KVN * c.k; ++e) {
        EXPECT_EQ(st.topk[z(st.row(b, i) * c.KVN * c.k + e)], -1);
      }
}

std::vector<DCase> step_grid() {
  std::vector<DCase> v;
  {  // TND, G 2, l 32 / d 16 / l' 64, k 2, w 8: sel below l (no compressed token) up to 300.
    DCase c;
    c.N = 4, c.KVN = 2, c.Dqk = 32, c.Dv = 32, c.k = 2, c.w = 8, c.pbs = 64, c.cpbs = 16;
    c.sel = {20, 32, 47, 100, 300}, c.qlen = {1, 2, 4, 3, 4};
    v.push_back(c);
  }
  {  // BSND padded, G 4, l = d = 16, l' 32, k 3, w 5, pbs 32 / cpbs 32.
    DCase c;
    c.layout = "BSND", c.S = 4;
    c.N = 8, c.KVN = 2, c.Dqk = 48, c.Dv = 32, c.l = 16, c.d = 16, c.ls = 32, c.k = 3, c.w = 5;
    c.pbs = 32, c.cpbs = 32, c.scale = 0.15;
    c.sel = {16, 33, 70, 129}, c.qlen = {4, 1, 3, 2};
    v.push_back(c);
  }
  {  // TND, G 1, l 48 / d 16 / l' 96, k 4, w 40, pbs 48 (relaxed), cpbs 16, single tokens.
    DCase c;
    c.N = 2, c.KVN = 2, c.Dqk = 24, c.Dv = 40, c.l = 48, c.d = 16, c.ls = 96, c.k = 4, c.w = 40;
    c.pbs = 48, c.cpbs = 16;
    c.sel = {48, 95, 200, 401}, c.qlen = {1, 1, 1, 1};
    v.push_back(c);
  }
  return v;
}

TEST(NsaDecodeStep, IntermediatesMatchFp16) {
  int i = 0;
  for (const DCase& c : step_grid()) {
    SCOPED_TRACE("case " + std::to_string(i++));
    check_step<half>(c);
  }
}

TEST(NsaDecodeStep, IntermediatesMatchBf16) {
  int i = 0;
  for (DCase c : step_grid()) {
    SCOPED_TRACE("case " + std::to_string(i++));
    c.seed += 50;
    check_step<bfloat16>(c);
  }
}

TEST(NsaDecodeStep, IntermediatesMatchFloat) {
  DCase c = step_grid()[1];
  c.seed += 70;
  check_step<float>(c);
}

TEST(NsaDecodeStep, CompressedCacheFromNsaCompress) {
  DCase c = step_grid()[0];
  c.from_compress = true;
  check_step<half>(c);
  c = step_grid()[1];
  c.from_compress = true, c.seed = 17;
  check_step<bfloat16>(c);
}

// The vendor operators' constraints (strict): Dqk 192, Dv 128, G 16, pbs 64, l 32 / d 16 /
// l' 64, k 2 (<= the select blocks of every batch with compressed tokens).
TEST(NsaDecodeStep, VendorShapeStrict) {
  DCase c;
  c.strict = true, c.layout = "BSND", c.S = 2;
  c.N = 16, c.KVN = 1, c.Dqk = 192, c.Dv = 128, c.k = 2, c.w = 64, c.pbs = 64, c.cpbs = 64;
  c.scale = 1.0 / std::sqrt(192.0);
  c.sel = {200, 129}, c.qlen = {2, 1};
  check_step<half>(c);
  c.layout = "TND", c.pbs = 128, c.N = 4, c.KVN = 2, c.qlen = {1, 2}, c.seed = 8;
  check_step<bfloat16>(c);
}

TEST(NsaDecodeStep, OptionalOutputsAbsentEqualsPresentBitForBit) {
  for (const DCase& c : step_grid()) {
    Step<half> a(c), b(c);
    a.run(0, true), b.run(0, false);
    EXPECT_TRUE(support::bitwise_equal(fl(a.out), fl(b.out)));
    // Absent views are not written.
    EXPECT_TRUE(std::all_of(b.topk.begin(), b.topk.end(), [](i32 t) { return t == 12345; }));
    EXPECT_TRUE(
        std::all_of(b.sel_out.begin(), b.sel_out.end(), [](half h) { return dbl(h) == -555.0; }));
  }
}

TEST(NsaDecodeStep, ThreadsOneEqualsTwoBitForBit) {
  DCase c = step_grid()[1];
  Step<bfloat16> a(c), b(c);
  a.run(1), b.run(2);
  EXPECT_TRUE(support::bitwise_equal(fl(a.out), fl(b.out)));
  EXPECT_EQ(a.topk, b.topk);
}

TEST(NsaDecodeStep, TndEqualsBsndBitForBit) {
  DCase c = step_grid()[0];
  Step<half> a(c);
  c.layout = "BSND", c.S = 4;
  Step<half> b(c);
  for (int bb = 0; bb < a.B; ++bb)  // the same gates per live row
    for (int i = 0; i < c.qlen[z(bb)]; ++i)
      std::copy_n(a.gates.begin() + a.row(bb, i) * c.N * 3, c.N * 3,
                  b.gates.begin() + b.row(bb, i) * c.N * 3);
  a.run(), b.run();
  for (int bb = 0; bb < a.B; ++bb)
    for (int i = 0; i < c.qlen[z(bb)]; ++i) {
      const int ra = a.row(bb, i), rb = b.row(bb, i);
      EXPECT_EQ(0, std::memcmp(&a.out[z(ra * c.N * c.Dv)], &b.out[z(rb * c.N * c.Dv)],
                               z(c.N * c.Dv) * sizeof(half)));
      EXPECT_EQ(0, std::memcmp(&a.topk[z(ra * c.KVN * c.k)], &b.topk[z(rb * c.KVN * c.k)],
                               z(c.KVN * c.k) * sizeof(i32)));
    }
}

using DP = NsaDecodeParams;
using DIn = NsaDecodeInputs<half>;
using DOut = NsaDecodeOutputs<half>;
using DEdit = std::function<void(Step<half>&, DP&, DIn&, DOut&)>;

// TND rows 3 (q_len 2, 1), N 4, KV_N 2, D 32, sel {40, 100} (cmp 1, 5), k 2, pbs 32, cpbs 16.
DCase reject_case() {
  DCase c;
  c.N = 4, c.KVN = 2, c.Dqk = 32, c.Dv = 32, c.k = 2, c.w = 8, c.pbs = 32, c.cpbs = 16;
  c.sel = {40, 100}, c.qlen = {2, 1};
  return c;
}

void reject_step(const DCase& c, const DEdit& edit, const std::string& what, bool oor = false) {
  SCOPED_TRACE(what);
  Step<half> st(c);
  DP p = st.params();
  DIn in = st.inputs();
  DOut o = st.outputs();
  edit(st, p, in, o);
  const auto out0 = st.out, cmp0 = st.cmp_out, sel0 = st.sel_out, win0 = st.win_out;
  const auto tk0 = st.topk;
  support::expect_throw([&] { attnref::nsa_decode_step(p, in, o); }, what, oor);
  const size_t n = out0.size() * sizeof(half);
  EXPECT_EQ(0, std::memcmp(out0.data(), st.out.data(), n)) << "output written";
  EXPECT_EQ(0, std::memcmp(cmp0.data(), st.cmp_out.data(), n)) << "cmp_out written";
  EXPECT_EQ(0, std::memcmp(sel0.data(), st.sel_out.data(), n)) << "sel_out written";
  EXPECT_EQ(0, std::memcmp(win0.data(), st.win_out.data(), n)) << "win_out written";
  EXPECT_EQ(tk0, st.topk) << "topk written";
}

TEST(NsaDecodeStep, RejectionsWriteNothing) {
  const DCase c = reject_case();
  {
    Step<half> ok(c);
    ASSERT_NO_THROW(ok.run());
  }
  // The step's own arguments.
  reject_step(
      c,
      [](Step<half>&, DP&, DIn& in, DOut&) {
        in.gates = support::reshaped(in.gates, {3, 4, 2});
      },
      "gates.shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn& in, DOut&) {
        in.gates = support::reshaped(in.gates, {12, 3});
      },
      "gates.shape");
  reject_step(
      c, [](Step<half>&, DP&, DIn& in, DOut&) { in.gates = {}; }, "gates.shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn&, DOut& o) {
        o.output = support::reshaped(o.output, {3, 4, 16});
      },
      "output.shape");
  reject_step(
      c, [](Step<half>&, DP&, DIn&, DOut& o) { o.output = {}; }, "output.shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn&, DOut& o) {
        o.topk = support::reshaped(o.topk, {3, 4, 2});
      },
      "topk.shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn&, DOut& o) {
        o.cmp_out = support::reshaped(o.cmp_out, {3, 4, 31});
      },
      "cmp_out / sel_out / win_out shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn&, DOut& o) {
        o.win_out = support::reshaped(o.win_out, {1, 3, 4, 32});
      },
      "cmp_out / sel_out / win_out shape");
  reject_step(
      c, [](Step<half>&, DP& p, DIn&, DOut&) { p.window_size = 0; }, "params.window_size");
  reject_step(
      c, [](Step<half>&, DP& p, DIn&, DOut&) { p.layout = "BSH"; }, "params.layout");
  reject_step(
      c, [](Step<half>&, DP& p, DIn&, DOut&) { p.num_heads = 5; }, "params.num_heads");
  reject_step(
      c, [](Step<half>&, DP&, DIn& in, DOut&) { in.actual_sel_kv_seq_len[0] = 1; },
      "actual_sel_kv_seq_len[0]");
  reject_step(
      c, [](Step<half>&, DP&, DIn& in, DOut&) { in.actual_q_seq_len[1] = 5; },
      "actual_q_seq_len[1]");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn& in, DOut&) {
        in.query = support::reshaped(in.query, {3, 4, 16});
      },
      "key.shape");
  // The selected / window branches' rules, checked before the compressed branch writes.
  reject_step(
      c, [](Step<half>& s, DP&, DIn&, DOut&) { s.bt[z(s.mb + 3)] = s.nb; },
      "nsa_decode_step: block_table[1][3] out of range (in nsa_selected_attention_infer)", true);
  reject_step(
      c, [](Step<half>&, DP&, DIn& in, DOut&) { in.key = support::resized(in.key, 1, 16); },
      "key.shape");
  reject_step(
      c, [](Step<half>&, DP& p, DIn&, DOut&) { p.select_block_size = 0; }, "select_block_size");
  {
    DCase x = c;  // strict: Dqk 32 is not the selected operator's 192
    x.strict = true;
    reject_step(
        x, [](Step<half>&, DP&, DIn&, DOut&) {}, "query / value head sizes");
  }
  // The compressed branch's inputs, named as the step's arguments.
  reject_step(
      c, [](Step<half>& s, DP&, DIn&, DOut&) { s.cbt[z(s.cmb + 0)] = s.cnb; },
      "nsa_decode_step: cmp_block_table[1][0]", true);
  reject_step(
      c, [](Step<half>&, DP&, DIn& in, DOut&) { in.cmp_key = support::resized(in.cmp_key, 2, 32); },
      "nsa_decode_step: cmp_key.shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn& in, DOut&) {
        in.cmp_value = support::resized(in.cmp_value, 0, in.cmp_value.size(0) + (1));
      },
      "nsa_decode_step: cmp_value.shape");
  reject_step(
      c,
      [](Step<half>&, DP&, DIn& in, DOut&) {
        in.cmp_block_table =
            support::resized(in.cmp_block_table, 0, in.cmp_block_table.size(0) + (1));
      },
      "nsa_decode_step: cmp_block_table.shape");
  reject_step(
      c, [](Step<half>&, DP& p, DIn&, DOut&) { p.compress_block_size = 24; },
      "nsa_decode_step: params.compress_block_stride");
}

// A tiny step for the overlap and padding rules: one batch, TND, N = KV_N = 1, D 16, sel 64.
struct Tiny {
  static constexpr Index D = 16;
  std::vector<half> q = std::vector<half>(2 * D, half(0.5f)),
                    k = std::vector<half>(64 * D, half(0.1f)),
                    v = std::vector<half>(64 * D, half(1.0f)),
                    kc = std::vector<half>(16 * D, half(0.1f)),
                    vc = std::vector<half>(16 * D, half(2.0f));
  std::vector<i32> bt{0}, cbt{0};
  std::vector<float> gates{0.25f, 0.25f, 0.5f, NAN, NAN, NAN};
  DP p;
  DIn in;
  Tiny() {
    p.compress_block_size = 32, p.compress_block_stride = 16, p.select_block_size = 64;
    p.select_block_count = 1, p.window_size = 4, p.page_block_size = 64;
    p.cmp_page_block_size = 16, p.strict = false;
    in.query = StridedView<const half>(q.data(), {1, 1, D});
    in.key = StridedView<const half>(k.data(), {1, 64, D});
    in.value = StridedView<const half>(v.data(), {1, 64, D});
    in.block_table = StridedView<const i32>(bt.data(), {1, 1});
    in.cmp_key = StridedView<const half>(kc.data(), {1, 16, D});
    in.cmp_value = StridedView<const half>(vc.data(), {1, 16, D});
    in.cmp_block_table = StridedView<const i32>(cbt.data(), {1, 1});
    in.gates = StridedView<const float>(gates.data(), {1, 1, 3});
    in.actual_sel_kv_seq_len = {64};
  }
};

TEST(NsaDecodeStep, OverlappingOutputsAreRejectedBeforeAnyWrite) {
  Tiny t;
  constexpr Index D = Tiny::D;
  std::vector<half> out(D, half(-7.0f)), cmp(D, half(-7.0f)), other(D, half(-7.0f));
  std::vector<i32> topk(1, 12345);
  DOut o;
  o.output = StridedView<half>(out.data(), {1, 1, D});
  o.topk = StridedView<i32>(topk.data(), {1, 1, 1});
  o.cmp_out = StridedView<half>(cmp.data(), {1, 1, D});
  auto untouched = [&] {
    EXPECT_EQ(topk[0], 12345);
    for (Index i = 0; i < D; ++i) {
      EXPECT_EQ(dbl(out[z(i)]), -7.0);
      EXPECT_EQ(dbl(cmp[z(i)]), -7.0);
    }
  };
  {  // the selected output on the value cache
    DOut x = o;
    x.sel_out = StridedView<half>(t.v.data(), {1, 1, D});
    support::expect_throw([&] { attnref::nsa_decode_step(t.p, t.in, x); },
                          "nsa_decode_step: sel_out overlaps an input", false);
    untouched();
  }
  {  // two branch outputs sharing one buffer
    DOut x = o;
    x.sel_out = StridedView<half>(cmp.data(), {1, 1, D});
    support::expect_throw([&] { attnref::nsa_decode_step(t.p, t.in, x); },
                          "nsa_decode_step: cmp_out overlaps sel_out", false);
    untouched();
  }
  {  // the output on the gates, a branch output on topk
    DOut x = o;
    std::vector<float> g(D, 0.0f);  // gates in a buffer as large as the output
    DIn in = t.in;
    in.gates = StridedView<const float>(g.data(), {1, 1, 3});
    x.output = StridedView<half>(reinterpret_cast<half*>(g.data()), {1, 1, D});
    support::expect_throw([&] { attnref::nsa_decode_step(t.p, in, x); },
                          "nsa_decode_step: output overlaps an input", false);
    DOut y = o;
    y.win_out = StridedView<half>(reinterpret_cast<half*>(topk.data()), {1, 1, D});
    support::expect_throw([&] { attnref::nsa_decode_step(t.p, t.in, y); },
                          "nsa_decode_step: win_out overlaps topk", false);
    untouched();
  }
}

TEST(NsaDecodeStep, PaddedRowsAreZeroWhateverTheirGates) {
  Tiny t;
  constexpr Index D = Tiny::D;
  DP p = t.p;
  p.layout = "BSND";
  DIn in = t.in;
  in.query = StridedView<const half>(t.q.data(), {1, 2, 1, D});
  in.gates = StridedView<const float>(t.gates.data(), {2, 1, 3});  // row 1 (padding): NaN gates
  in.actual_q_seq_len = {1};
  std::vector<half> out(2 * D, half(-7.0f));
  DOut o;
  o.output = StridedView<half>(out.data(), {1, 2, 1, D});
  attnref::nsa_decode_step(p, in, o);
  for (Index i = 0; i < D; ++i) {
    EXPECT_TRUE(std::isfinite(dbl(out[z(i)])));
    EXPECT_EQ(dbl(out[z(D + i)]), 0.0) << i;
  }
}

TEST(NsaDecodeStep, CompressedTableTooShortForTheRawLength) {
  Tiny t;  // sel 64 -> 3 compressed tokens; pages of 2 with a one-page table hold 2
  constexpr Index D = Tiny::D;
  DP p = t.p;
  p.cmp_page_block_size = 2;
  DIn in = t.in;
  in.cmp_key = StridedView<const half>(t.kc.data(), {8, 2, D});
  in.cmp_value = StridedView<const half>(t.vc.data(), {8, 2, D});
  std::vector<half> out(D, half(-7.0f));
  DOut o;
  o.output = StridedView<half>(out.data(), {1, 1, D});
  support::expect_throw([&] { attnref::nsa_decode_step(p, in, o); },
                        "nsa_decode_step: actual_sel_kv_seq_len[0] needs more compressed tokens",
                        false);
  for (Index i = 0; i < D; ++i) EXPECT_EQ(dbl(out[z(i)]), -7.0);
}

}  // namespace decode_step_test
