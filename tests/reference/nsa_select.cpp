// The definitions of reference/nsa_select.hpp (documented there), compiled once into the
// attnref_test_reference library, with -O2 in every preset (see the top-level CMakeLists.txt).

#include "reference/nsa_select.hpp"

namespace ref::nsa_select {

void attend(const Problem& pr, const Batch& b, int i, int h, const std::vector<char>& visible,
            double* out) {
  const int G = pr.N / pr.KVN, g = h / G;
  const double* qv = b.q.data() + (static_cast<size_t>(i) * pr.N + h) * pr.Dqk;
  std::vector<long> pos;
  std::vector<double> s;
  for (long t = 0; t < b.sel; ++t) {
    if (!visible[static_cast<size_t>(t)]) continue;
    const double* kv = b.k.data() + (static_cast<size_t>(t) * pr.KVN + g) * pr.Dqk;
    double dot = 0.0;
    for (int x = 0; x < pr.Dqk; ++x) dot += qv[x] * kv[x];
    pos.push_back(t);
    s.push_back(dot * pr.scale);
  }
  for (int x = 0; x < pr.Dv; ++x) out[x] = 0.0;
  if (pos.empty()) return;
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0.0;
  for (double& e : s) sum += (e = std::exp(e - mx));
  for (size_t j = 0; j < pos.size(); ++j) {
    const double p = s[j] / sum;
    const double* vv = b.v.data() + (static_cast<size_t>(pos[j]) * pr.KVN + g) * pr.Dv;
    for (int x = 0; x < pr.Dv; ++x) out[x] += p * vv[x];
  }
}

std::vector<char> selected_keys(const Problem& pr, const Batch& b, int i, int g) {
  std::vector<char> vis(static_cast<size_t>(std::max(0L, b.sel)), 0);
  const long L = visible_length(b, i);
  for (long e = 0; e < pr.k; ++e) {
    const std::int32_t j = b.topk[(static_cast<size_t>(i) * pr.KVN + g) * pr.k + e];
    if (j == -1) continue;
    const long begin = j * pr.ls, end = std::min((j + 1) * pr.ls, L);
    for (long t = begin; t < end; ++t) vis[static_cast<size_t>(t)] = 1;
  }
  return vis;
}

std::vector<double> selected(const Problem& pr, const Batch& b) {
  const int G = pr.N / pr.KVN;
  std::vector<double> out(static_cast<size_t>(b.q_len) * pr.N * pr.Dv, 0.0);
  for (int i = 0; i < b.q_len; ++i)
    for (int h = 0; h < pr.N; ++h)
      attend(pr, b, i, h, selected_keys(pr, b, i, h / G),
             out.data() + (static_cast<size_t>(i) * pr.N + h) * pr.Dv);
  return out;
}

std::vector<char> window_keys(const Batch& b, int i, long w) {
  std::vector<char> vis(static_cast<size_t>(std::max(0L, b.sel)), 0);
  const long t = b.sel - b.q_len + i;
  for (long x = std::max(0L, t - w + 1); x <= t && x < b.sel; ++x) vis[static_cast<size_t>(x)] = 1;
  return vis;
}

std::vector<double> window(const Problem& pr, const Batch& b, long w) {
  std::vector<double> out(static_cast<size_t>(b.q_len) * pr.N * pr.Dv, 0.0);
  for (int i = 0; i < b.q_len; ++i) {
    const std::vector<char> vis = window_keys(b, i, w);
    for (int h = 0; h < pr.N; ++h)
      attend(pr, b, i, h, vis, out.data() + (static_cast<size_t>(i) * pr.N + h) * pr.Dv);
  }
  return out;
}

std::vector<double> gated_sum(const std::vector<double>& gates, const std::vector<double>& a,
                              const std::vector<double>& b, const std::vector<double>& c, long Dv) {
  std::vector<double> out(a.size(), 0.0);
  for (size_t e = 0; e < a.size(); ++e) {
    const double* g = gates.data() + (e / static_cast<size_t>(Dv)) * 3;
    out[e] = g[0] * a[e] + g[1] * b[e] + g[2] * c[e];
  }
  return out;
}

}  // namespace ref::nsa_select
