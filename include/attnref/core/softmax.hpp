#pragma once
/// The online-softmax state and its merge rule, shared by every attention path.
///
/// A partial result over a subset of keys is (m, l, o): the running row maximum m of the scores,
/// the sum l = sum_j exp(s_j - m) and the unnormalised output o = sum_j exp(s_j - m) v_j.
/// Two partial results over disjoint key sets merge exactly (up to rounding) into the result over
/// their union. The final output is o / l and the log-sum-exp is LSE = m + ln(l), in the natural
/// log (use lse_to_base2 for FlashInfer-style base-2 values).
///
/// Conventions: a state with no visible key has m = -inf, l = 0, o = 0; its LSE is -inf and its
/// normalised output is 0 (never NaN). A state is undefined, its LSE and output NaN, when a
/// visible raw score was not finite (`overflow`: scale·q·k overflowed the compute type, or an
/// unmasked input holds inf / NaN), or when it saw visible keys (`visible`) but every one scored
/// -inf after the hooks (l = 0): the softmax of those scores cannot be computed, and the zero row
/// of a masked query would be a silent wrong answer.

#include <cmath>
#include <limits>

#include "attnref/core/types.hpp"

namespace attnref {

/// exp(a - b) for a <= b, returning exactly 0 when a is -inf (also when both are -inf), and
/// exactly 1 when a == b (exp(0), without the call: a row's running max mostly stays put from
/// one kv tile to the next).
template <class Acc>
inline Acc exp_diff(Acc a, Acc b) {
  if (a == -std::numeric_limits<Acc>::infinity()) return Acc(0);
  if (a == b) return Acc(1);
  return std::exp(a - b);
}

/// Per-row online-softmax state: m (running max) and l (running sum of exp(s - m)).
template <class Acc>
struct SoftmaxState {
  Acc m = -std::numeric_limits<Acc>::infinity();
  Acc l = Acc(0);
  bool visible = false;   ///< a visible key was seen
  bool overflow = false;  ///< a visible raw score was not finite

  /// True when the result is undefined (see the conventions above).
  bool undefined() const { return overflow || (visible && l == Acc(0)); }
  /// Natural-log LSE of the keys seen so far; -inf when none was visible, NaN when undefined.
  Acc lse() const {
    if (undefined()) return std::numeric_limits<Acc>::quiet_NaN();
    return l == Acc(0) ? -std::numeric_limits<Acc>::infinity() : m + std::log(l);
  }
  /// 1 / l, or 0 when no key was visible (so the normalised output is 0), NaN when undefined.
  Acc inv_l() const {
    if (undefined()) return std::numeric_limits<Acc>::quiet_NaN();
    return l == Acc(0) ? Acc(0) : Acc(1) / l;
  }
};

/// Merges the partial (m2, l2, o2) into (state, o): both outputs unnormalised, d elements each.
template <class Acc>
inline void merge_partial(SoftmaxState<Acc>& state, Acc* o, const SoftmaxState<Acc>& other,
                          const Acc* o2, Index d) {
  state.visible = state.visible || other.visible;
  state.overflow = state.overflow || other.overflow;
  if (other.l == Acc(0)) return;
  if (state.l == Acc(0)) {
    state.m = other.m;
    state.l = other.l;
    for (Index i = 0; i < d; ++i) o[i] = o2[i];
    return;
  }
  const Acc m = state.m > other.m ? state.m : other.m;
  const Acc a = exp_diff(state.m, m);
  const Acc b = exp_diff(other.m, m);
  state.m = m;
  state.l = state.l * a + other.l * b;
  for (Index i = 0; i < d; ++i) o[i] = o[i] * a + o2[i] * b;
}

/// Converts a natural-log LSE into base 2 (FlashInfer's historical convention).
template <class Acc>
inline Acc lse_to_base2(Acc lse_natural) {
  return lse_natural * Acc(1.4426950408889634073599246810018921);
}

/// Converts a base-2 LSE into the natural log.
template <class Acc>
inline Acc lse_from_base2(Acc lse_base2) {
  return lse_base2 * Acc(0.6931471805599453094172321214581766);
}

}  // namespace attnref
