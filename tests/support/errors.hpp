#pragma once
// Bad-input expectations: `f` must throw std::out_of_range (index data) or
// std::invalid_argument (shapes, parameters), with `what` in the message.

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace support {

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

}  // namespace support
