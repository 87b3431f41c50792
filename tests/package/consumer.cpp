// A downstream program: includes attnref, runs one small attention, prints a marker ctest checks.
#include <attnref/attnref.hpp>
#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  std::vector<float> q(2 * 4, 0.5f), k(3 * 4, 0.25f), v(3 * 4, 1.0f), o(2 * 4);
  attnref::AttentionInputs<float> in{attnref::bsnd_view<const float>(q.data(), 1, 2, 1, 4),
                                     attnref::bsnd_view<const float>(k.data(), 1, 3, 1, 4),
                                     attnref::bsnd_view<const float>(v.data(), 1, 3, 1, 4)};
  attnref::AttentionOutputs<float> out{attnref::bsnd_view(o.data(), 1, 2, 1, 4)};
  attnref::attention(in, attnref::AttentionParams{}, out);
  // Equal keys: every probability is 1/3 and every output element is the value 1.
  for (float x : o)
    if (std::fabs(x - 1.0f) > 1e-6f) return 1;
  std::printf("attnref consumer OK (attnref %d.%d.%d)\n", attnref::kVersionMajor,
              attnref::kVersionMinor, attnref::kVersionPatch);
  return 0;
}
