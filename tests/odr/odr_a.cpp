// Translation unit A of the ODR test: the umbrella header plus one instantiation of the engine.
#include <attnref/attnref.hpp>
#include <vector>

float odr_a() {
  std::vector<float> q(4, 1.0f), k(4, 1.0f), v(4, 2.0f), o(4);
  attnref::AttentionInputs<float> in{attnref::bsnd_view<const float>(q.data(), 1, 1, 1, 4),
                                     attnref::bsnd_view<const float>(k.data(), 1, 1, 1, 4),
                                     attnref::bsnd_view<const float>(v.data(), 1, 1, 1, 4)};
  attnref::attention(in, attnref::AttentionParams{},
                     attnref::AttentionOutputs<float>{attnref::bsnd_view(o.data(), 1, 1, 1, 4)});
  return o[0];
}
