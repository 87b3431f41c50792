// The shared query / output hooks (detail/hooks/io.hpp) on their own, against values worked out by
// hand: qScale rounded to the query type, the per-channel key fold and its row constant, V's
// affine map, empty rows, and the int8 output quantization (saturation, NaN, per tensor / channel).
#include <gtest/gtest.h>

#include <attnref/attnref.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace io_hooks_test {

using attnref::Index;
using attnref::SeqInfo;
using attnref::detail::IoHooks;

TEST(IoHooks, OffByDefault) {
  const IoHooks io;
  EXPECT_FALSE(io.has_q_transform());
  EXPECT_FALSE(io.has_o_transform());
}

TEST(IoHooks, QScaleRoundsTheProductToTheQueryType) {
  IoHooks io;
  io.scale_query<attnref::half>(1.0f / 3.0f);
  ASSERT_TRUE(io.has_q_transform());
  float row[2] = {1.0f, -3.0f};
  EXPECT_EQ(io.q_transform<float>(SeqInfo{0, 1, 1}, 0, 0, row, 2), 0.0f);  // no key offsets
  EXPECT_EQ(row[0], 0.333251953125f);  // fp16 nearest to 1/3 (0x3555)
  EXPECT_EQ(row[1], -1.0f);
}

TEST(IoHooks, KeyFoldScalesQPerChannelOfItsKvHeadAndReturnsTheOffsetTerm) {
  IoHooks io;
  io.group = 2;  // q heads 2 and 3 read kv head 1: channels 2 and 3 (d = 2)
  io.k_scale = {10.0f, 10.0f, 0.5f, 4.0f};
  io.k_offset = {7.0, 7.0, -2.0, 1.0};
  io.bias_scale = 0.25f;
  float row[2] = {2.0f, 3.0f};
  const float bias = io.q_transform<float>(SeqInfo{0, 1, 5}, 0, 3, row, 2);
  EXPECT_EQ(row[0], 1.0f);                                 // 2 · 0.5
  EXPECT_EQ(row[1], 12.0f);                                // 3 · 4
  EXPECT_EQ(bias, 0.25f * (1.0f * -2.0f + 12.0f * 1.0f));  // scale · q'·k_offset = 2.5
}

TEST(IoHooks, ValueMapAndEmptyRows) {
  IoHooks io;
  io.group = 1;
  io.v_scale = {2.0f, 3.0f, 0.5f, 0.25f};
  io.v_offset = {1.0f, -1.0f, 4.0f, 0.0f};
  io.zero_empty = true;
  ASSERT_TRUE(io.has_o_transform());
  double row[2] = {1.5, 2.0};
  io.o_transform<double>(SeqInfo{0, 1, 3}, 0, 1, row, 2);  // head 1: channels 2, 3
  EXPECT_EQ(row[0], (1.5 + 4.0) * 0.5);
  EXPECT_EQ(row[1], 2.0 * 0.25);
  double empty[2] = {1.5, 2.0};
  io.o_transform<double>(SeqInfo{0, 1, 0}, 0, 1, empty, 2);
  EXPECT_EQ(empty[0], 0.0);
  EXPECT_EQ(empty[1], 0.0);
}

TEST(IoHooks, Int8OutputSaturatesRoundsHalfToEvenAndMapsNanToZero) {
  IoHooks io;
  io.post_scale = {2.0f};  // per tensor
  io.post_offset = {0.5f};
  const SeqInfo s{0, 1, 4};
  EXPECT_EQ(io.quantize_o<float>(s, 3, 1, 1.0f), 2);      // rint(2.5) = 2
  EXPECT_EQ(io.quantize_o<float>(s, 0, 0, 1.5f), 4);      // rint(3.5) = 4
  EXPECT_EQ(io.quantize_o<float>(s, 0, 0, 300.0f), 127);  // saturates
  EXPECT_EQ(io.quantize_o<float>(s, 0, 0, -300.0f), -128);
  EXPECT_EQ(io.quantize_o<float>(s, 0, 0, std::numeric_limits<float>::quiet_NaN()), 0);
  EXPECT_EQ(io.quantize_o<float>(s, 0, 0, std::numeric_limits<float>::infinity()), 127);
  EXPECT_EQ(io.quantize_o<float>(SeqInfo{0, 1, 0}, 0, 0, 1.0f), 2);  // empty rows quantize too
  io.post_zero_empty = true;
  EXPECT_EQ(io.quantize_o<float>(SeqInfo{0, 1, 0}, 0, 0, 1.0f), 0);  // ... unless asked not to
}

TEST(IoHooks, Int8OutputPerChannelIndexesHeadTimesWidthPlusElement) {
  IoHooks io;
  io.post_scale = {1.0f, 1.0f, 1.0f, 10.0f, 1.0f, 1.0f};  // 2 heads x width 3
  io.post_width = 3;
  EXPECT_EQ(io.quantize_o<float>(SeqInfo{0, 1, 2}, 1, 0, 1.2f), 12);  // channel 1·3 + 0
  EXPECT_EQ(io.quantize_o<float>(SeqInfo{0, 1, 2}, 0, 0, 1.2f), 1);
}

}  // namespace io_hooks_test
