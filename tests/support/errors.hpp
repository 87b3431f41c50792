#pragma once
// Bad-input expectations: `f` must throw std::out_of_range (index data) or
// std::invalid_argument (shapes, parameters), with `what` in the message.

#include <gtest/gtest.h>

#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/outcome.hpp"

namespace support {

/// An operator's validate() ends as its call does: the same exception type and message, or
/// none. validate() runs first, so the caller's "nothing written" checks made after the call
/// cover both.
template <class V, class F>
void expect_validate_agrees(V&& validate, F&& call) {
  const std::string validated = outcome(validate);
  EXPECT_EQ(validated, outcome(call)) << "validate() and the call disagree";
}

template <class F>
void expect_throw(F&& f, const std::string& what, bool out_of_range) {
  try {
    f();
    ADD_FAILURE() << "no exception: " << what;
  } catch (const std::out_of_range& e) {
    EXPECT_TRUE(out_of_range) << "std::out_of_range where std::invalid_argument was expected: "
                              << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  } catch (const std::invalid_argument& e) {
    EXPECT_FALSE(out_of_range) << "std::invalid_argument where std::out_of_range was expected: "
                               << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

/// `call` must throw E (any other exception is a failure) with `fragment` in its message.
/// Returns the message for further checks ("" when nothing or something else was thrown).
template <class E = std::invalid_argument, class F>
std::string expect_rejected(F&& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "no exception; expected \"" << fragment << "\"";
  } catch (const E& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
  return "";
}

/// The same for a message that must start with "attnref::<op>: " and contain every fragment.
template <class E = std::invalid_argument, class F>
void expect_rejected_by(F&& call, const std::string& op,
                        const std::vector<std::string>& fragments) {
  const std::string prefix = "attnref::" + op + ": ";
  const std::string msg = expect_rejected<E>(call, prefix);
  if (msg.empty()) return;
  EXPECT_EQ(msg.rfind(prefix, 0), 0u) << msg;
  for (const std::string& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << msg;
}

}  // namespace support
