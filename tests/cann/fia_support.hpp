#pragma once
// Shared by the FusedInferAttentionScore tests: a call that must be rejected.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/cann/fused_infer_attention_score.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/cast.hpp"
#include "support/errors.hpp"

namespace fia_support {

/// The call `x` (params x.p, inputs x.in) with an output of `oshape` must throw E whose message
/// starts with "attnref::fused_infer_attention_score: " and contains `frag`, and leave the
/// output (all 7 before the call) untouched.
template <class TO, class E = std::invalid_argument, class Call>
void expect_rejected(const Call& x, const std::vector<attnref::Index>& oshape,
                     const std::string& frag) {
  attnref::Index n = 1;
  for (attnref::Index e : oshape) n *= e;
  std::vector<TO> out(static_cast<size_t>(n), TO(7.0f));
  SCOPED_TRACE(frag);
  support::expect_rejected_by<E>(
      [&] {
        attnref::fused_infer_attention_score(
            x.p, x.in, attnref::FusedInferAttentionScoreOutputs<TO>{{out.data(), oshape}});
      },
      "fused_infer_attention_score", {frag});
  EXPECT_TRUE(
      std::all_of(out.begin(), out.end(), [](const TO& v) { return support::dbl(v) == 7.0; }));
}

}  // namespace fia_support
