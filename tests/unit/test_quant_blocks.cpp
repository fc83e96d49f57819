// quant/: hand-built blocks of every format dequantize to values worked out
// by hand from the format definition, and small hand-checked inputs quantize
// to the expected bytes. These pin the bit layouts (nibble order, high-bit
// planes, 6-bit scale packing) independently of any other implementation.
#include <array>
#include <cstring>

#include "base/fp16.h"
#include "quant/blocks.h"
#include "test_quant_helpers.h"

namespace {

using namespace tern;
using namespace tern::quant;
using namespace tern::quant::qtest;

constexpr uint16_t kHalfOne = 0x3C00, kHalfHalf = 0x3800, kHalfQuarter = 0x3400;
constexpr uint16_t kHalfTwo = 0x4000, kHalfMinusOne = 0xBC00;

template <class Block>
std::vector<float> dequantize_block(TensorType t, const Block& b, int n) {
    std::vector<float> y(static_cast<size_t>(n));
    const Status s = dequantize_row(t, &b, y.data(), n);
    EXPECT_TRUE(s.ok()) << s.message();
    return y;
}

TEST(QuantBlocks, PlainTypes) {
    const uint16_t halves[] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x3555};
    std::vector<float> y(5);
    ASSERT_TRUE(dequantize_row(TensorType::F16, halves, y.data(), 5).ok());
    EXPECT_EQ(y, (std::vector<float>{1.0f, -2.0f, 65504.0f, 5.9604644775390625e-8f, 0.333251953125f}));
    const uint16_t bf[] = {0x3F80, 0xC049, 0x0000};
    ASSERT_TRUE(dequantize_row(TensorType::BF16, bf, y.data(), 3).ok());
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], -3.140625f);
    EXPECT_EQ(y[2], 0.0f);
    // 1/3 rounds down in both formats; 1 + 2^-11 is a tie in f16 and goes to even.
    const float x[] = {1.0f / 3.0f, 1.0f + 1.0f / 2048.0f, 1.0f + 3.0f / 2048.0f};
    uint16_t h[3];
    ASSERT_TRUE(quantize_row(TensorType::F16, x, h, 3).ok());
    EXPECT_EQ(h[0], 0x3555);
    EXPECT_EQ(h[1], 0x3C00);
    EXPECT_EQ(h[2], 0x3C02);
    ASSERT_TRUE(quantize_row(TensorType::BF16, x, h, 1).ok());
    EXPECT_EQ(h[0], 0x3EAB);
}

TEST(QuantBlocks, Q4_0) {
    block_q4_0 b{};
    b.d = kHalfHalf;
    std::memset(b.qs, 0x88, sizeof b.qs);  // level 8 = 0 everywhere
    b.qs[0] = 0xF0;                        // element 0: 0, element 16: 15
    b.qs[5] = 0x8A;                        // element 5: 10
    const auto y = dequantize_block(TensorType::Q4_0, b, 32);
    EXPECT_EQ(y[0], -4.0f);   // (0 - 8) * 0.5
    EXPECT_EQ(y[16], 3.5f);   // (15 - 8) * 0.5
    EXPECT_EQ(y[5], 1.0f);    // (10 - 8) * 0.5
    EXPECT_EQ(y[21], 0.0f);
    EXPECT_EQ(y[31], 0.0f);

    // Largest magnitude -4 gives d = -4 / -8 = 0.5; x * 2 + 8.5 truncated.
    std::vector<float> x(32, 0.0f);
    x[5] = -4.0f;
    x[7] = 1.0f;    // 2 + 8.5 -> 10
    x[20] = 3.9f;   // 7.8 + 8.5 -> 16, clamped to 15
    const auto q = quantize(TensorType::Q4_0, x);
    block_q4_0 out;
    std::memcpy(&out, q.data(), sizeof out);
    EXPECT_EQ(out.d, kHalfHalf);
    EXPECT_EQ(out.qs[5] & 0xF, 0);
    EXPECT_EQ(out.qs[7] & 0xF, 10);
    EXPECT_EQ(out.qs[4] >> 4, 15);  // element 20
    EXPECT_EQ(out.qs[0], 0x88);
}

TEST(QuantBlocks, Q4_1) {
    block_q4_1 b{};
    b.d = kHalfQuarter;
    b.m = kHalfMinusOne;
    b.qs[0] = 0xF0;
    b.qs[3] = 0x21;
    const auto y = dequantize_block(TensorType::Q4_1, b, 32);
    EXPECT_EQ(y[0], -1.0f);    // 0 * 0.25 - 1
    EXPECT_EQ(y[16], 2.75f);   // 15 * 0.25 - 1
    EXPECT_EQ(y[3], -0.75f);
    EXPECT_EQ(y[19], -0.5f);
    EXPECT_EQ(y[1], -1.0f);

    // min -1, max 2: d = 3 / 15 = 0.2, (x + 1) * 5 + 0.5 truncated.
    std::vector<float> x(32, 0.0f);
    x[0] = -1.0f;
    x[1] = 2.0f;
    x[2] = 0.5f;  // 7.5 + 0.5 -> 8
    const auto q = quantize(TensorType::Q4_1, x);
    block_q4_1 out;
    std::memcpy(&out, q.data(), sizeof out);
    EXPECT_EQ(out.m, kHalfMinusOne);
    EXPECT_EQ(out.d, fp32_to_fp16(0.2f));
    EXPECT_EQ(out.qs[0] & 0xF, 0);
    EXPECT_EQ(out.qs[1] & 0xF, 15);
    EXPECT_EQ(out.qs[2] & 0xF, 8);
    EXPECT_EQ(out.qs[3] & 0xF, 5);  // 0 -> 5.5 -> 5
}

TEST(QuantBlocks, Q5_0) {
    block_q5_0 b{};
    b.d = kHalfTwo;
    b.qs[0] = 0x1F;                    // element 0 low nibble 15, element 16 low nibble 1
    b.qs[15] = 0x30;                   // element 15: 0, element 31: 3
    const uint8_t qh[4] = {0x01, 0x00, 0x00, 0x80};  // fifth bits of elements 0 and 31
    std::memcpy(b.qh, qh, 4);
    const auto y = dequantize_block(TensorType::Q5_0, b, 32);
    EXPECT_EQ(y[0], 30.0f);    // (31 - 16) * 2
    EXPECT_EQ(y[16], -30.0f);  // (1 - 16) * 2
    EXPECT_EQ(y[15], -32.0f);  // (0 - 16) * 2
    EXPECT_EQ(y[31], 6.0f);    // (19 - 16) * 2
}

TEST(QuantBlocks, Q5_1) {
    block_q5_1 b{};
    b.d = kHalfHalf;
    b.m = kHalfOne;
    b.qs[2] = 0x45;
    const uint8_t qh[4] = {0x04, 0x00, 0x04, 0x00};  // fifth bits of elements 2 and 18
    std::memcpy(b.qh, qh, 4);
    const auto y = dequantize_block(TensorType::Q5_1, b, 32);
    EXPECT_EQ(y[2], 11.5f);   // 21 * 0.5 + 1
    EXPECT_EQ(y[18], 11.0f);  // 20 * 0.5 + 1
    EXPECT_EQ(y[0], 1.0f);
}

TEST(QuantBlocks, Q8_0AndQ8_1) {
    block_q8_0 b{};
    b.d = 0x2E66;  // 0.0999755859375
    b.qs[0] = -127;
    b.qs[9] = 5;
    const auto y = dequantize_block(TensorType::Q8_0, b, 32);
    EXPECT_EQ(y[0], -12.6968994140625f);
    EXPECT_EQ(y[9], 0.4998779296875f);
    EXPECT_EQ(y[1], 0.0f);

    block_q8_1 c{};
    c.d = kHalfOne;
    c.s = 0x7C00;  // the sum is for dot products, not for the values
    for (int j = 0; j < 32; ++j) c.qs[j] = int8_t(j - 16);
    const auto z = dequantize_block(TensorType::Q8_1, c, 32);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(z[size_t(j)], float(j - 16));

    // q8_1 stores s = d * sum(q): here q = +-127 in equal numbers except one 0.
    std::vector<float> x(32);
    for (int j = 0; j < 32; ++j) x[size_t(j)] = j == 31 ? 0.0f : (j % 2 ? 1.0f : -1.0f);
    const auto q = quantize(TensorType::Q8_1, x);
    block_q8_1 out;
    std::memcpy(&out, q.data(), sizeof out);
    EXPECT_EQ(out.qs[0], -127);
    EXPECT_EQ(out.qs[1], 127);
    EXPECT_EQ(out.qs[31], 0);
    EXPECT_EQ(out.d, fp32_to_fp16(1.0f / 127));
    EXPECT_EQ(out.s, fp32_to_fp16(-127.0f * (1.0f / 127)));  // sum = -127
}

TEST(QuantBlocks, Q2_K) {
    block_q2_K b{};
    b.d = kHalfOne;
    b.dmin = kHalfHalf;
    b.scales[0] = 0x21;  // sub-block 0: scale 1, min 2
    b.scales[1] = 0x0F;  // sub-block 1: scale 15, min 0
    b.scales[2] = 0x13;
    b.scales[4] = 0x05;
    b.scales[6] = 0xF2;
    b.scales[8] = 0x11;
    b.qs[0] = 0xE4;   // planes 0..3 = 0, 1, 2, 3 -> elements 0, 32, 64, 96
    b.qs[16] = 0x03;  // element 16
    b.qs[32] = 0x02;  // element 128
    const auto y = dequantize_block(TensorType::Q2_K, b, 256);
    EXPECT_EQ(y[0], -1.0f);    // 1 * 0 - 0.5 * 2
    EXPECT_EQ(y[16], 45.0f);   // 15 * 3
    EXPECT_EQ(y[32], 2.5f);    // 3 * 1 - 0.5 * 1
    EXPECT_EQ(y[64], 10.0f);   // 5 * 2
    EXPECT_EQ(y[96], -1.5f);   // 2 * 3 - 0.5 * 15
    EXPECT_EQ(y[128], 1.5f);   // 1 * 2 - 0.5 * 1
    EXPECT_EQ(y[1], -1.0f);    // level 0 in sub-block 0
    EXPECT_EQ(y[255], 0.0f);   // sub-block 15: scale 0, min 0
}

TEST(QuantBlocks, Q3_K) {
    block_q3_K b{};
    b.d = kHalfOne;
    // Biased 6-bit scales: 32 (= 0) everywhere except sub-block 0 (35 = +3),
    // 9 (0 = -32) and 15 (63 = +31). Low nibbles: 0 except 3 (sub 0) and
    // 15 (sub 15, high half of byte 7); top bits 2 everywhere except 0 for
    // sub 9 (byte 9 bits 4..5) and 3 for sub 15 (byte 11 bits 6..7).
    b.scales[0] = 0x03;
    b.scales[7] = 0xF0;
    b.scales[8] = 0xAA;
    b.scales[9] = 0x8A;
    b.scales[10] = 0xAA;
    b.scales[11] = 0xEA;
    b.qs[0] = 0x02;       // element 0: low bits 2
    b.qs[1] = 0x01;       // element 1: low bits 1
    b.hmask[0] = 0x01;    // element 0: high bit set (no -4)
    b.qs[48] = 0x03;      // element 144 (half 1, plane 0, l 16)
    b.hmask[16] = 0x10;   // element 144: bit 4 = half 1, plane 0
    const auto y = dequantize_block(TensorType::Q3_K, b, 256);
    EXPECT_EQ(y[0], 6.0f);      // 3 * 2
    EXPECT_EQ(y[1], -9.0f);     // 3 * (1 - 4)
    EXPECT_EQ(y[144], -96.0f);  // -32 * 3
    EXPECT_EQ(y[255], -124.0f); // 31 * (0 - 4)
    EXPECT_EQ(y[100], 0.0f);    // scale 0
}

TEST(QuantBlocks, Q4_KAndQ5_K) {
    // Sub-block 0: scale 10, min 4. Sub-block 5: scale 33, min 17, split
    // into low nibbles (byte 9) and top two bits (bytes 1 and 5).
    const uint8_t scales[12] = {10, 0x80, 0, 0, 4, 0x40, 0, 0, 0, 0x11, 0, 0};
    block_q4_K b{};
    b.d = kHalfOne;
    b.dmin = kHalfHalf;
    std::memcpy(b.scales, scales, 12);
    b.qs[0] = 0x07;    // element 0 (low nibble of byte 0)
    b.qs[74] = 0x30;   // element 170 = sub-block 5, high nibble of qs[64 + 10]
    const auto y = dequantize_block(TensorType::Q4_K, b, 256);
    EXPECT_EQ(y[0], 68.0f);     // 10 * 7 - 0.5 * 4
    EXPECT_EQ(y[1], -2.0f);     // 10 * 0 - 0.5 * 4
    EXPECT_EQ(y[170], 90.5f);   // 33 * 3 - 0.5 * 17
    EXPECT_EQ(y[32], 0.0f);     // sub-block 1: scale 0, min 0

    block_q5_K c{};
    c.d = kHalfOne;
    c.dmin = kHalfHalf;
    std::memcpy(c.scales, scales, 12);
    c.qs[0] = 0x07;
    c.qs[74] = 0x30;
    c.qh[0] = 0x01;    // element 0: fifth bit (sub-block 0 = bit 0)
    c.qh[10] = 0x20;   // element 170: fifth bit (sub-block 5 = bit 5)
    const auto z = dequantize_block(TensorType::Q5_K, c, 256);
    EXPECT_EQ(z[0], 228.0f);    // 10 * 23 - 2
    EXPECT_EQ(z[170], 618.5f);  // 33 * 19 - 8.5
    EXPECT_EQ(z[1], -2.0f);
}

TEST(QuantBlocks, Q6_K) {
    block_q6_K b{};
    b.d = kHalfHalf;
    b.scales[0] = -3;
    b.scales[13] = 100;
    b.ql[0] = 0x05;    // element 0 low nibble 5 (element 64 gets 0)
    b.qh[0] = 0x02;    // element 0 top bits 2 -> level 37
    b.ql[80] = 0xA0;   // element 208 = half 1, l 16 + 64: high nibble of ql[64 + 16]
    b.qh[48] = 0x10;   // its top bits (bits 4..5 of qh[32 + 16]) = 1 -> level 26
    const auto y = dequantize_block(TensorType::Q6_K, b, 256);
    EXPECT_EQ(y[0], -7.5f);     // 0.5 * -3 * (37 - 32)
    EXPECT_EQ(y[1], 48.0f);     // 0.5 * -3 * (0 - 32)
    EXPECT_EQ(y[208], -300.0f); // 0.5 * 100 * (26 - 32)
    EXPECT_EQ(y[64], 0.0f);     // sub-block 4: scale 0
}

TEST(QuantBlocks, Q8_K) {
    block_q8_K b{};
    b.d = 0.125f;
    for (int j = 0; j < 256; ++j) b.qs[j] = int8_t(j % 2 ? j / 2 : -(j / 2));
    const auto y = dequantize_block(TensorType::Q8_K, b, 256);
    for (int j = 0; j < 256; ++j) EXPECT_EQ(y[size_t(j)], float(b.qs[j]) * 0.125f);

    // Largest magnitude -128: iscale = -127 / -128 = 0.9921875 exactly, so
    // 64 -> 63.5 and -64 -> -63.5 are ties, which round to even.
    std::vector<float> x(256, 0.0f);
    x[0] = -128.0f;
    x[1] = 64.0f;
    x[2] = -64.0f;
    x[3] = 1.0f;
    x[17] = 100.0f;  // 99.21875 -> 99
    const auto q = quantize(TensorType::Q8_K, x);
    block_q8_K out;
    std::memcpy(&out, q.data(), sizeof out);
    EXPECT_EQ(out.qs[0], -127);
    EXPECT_EQ(out.qs[1], 64);
    EXPECT_EQ(out.qs[2], -64);
    EXPECT_EQ(out.qs[3], 1);
    EXPECT_EQ(out.qs[17], 99);
    EXPECT_EQ(out.d, 1.0f / 0.9921875f);
    EXPECT_EQ(out.bsums[0], -127 + 64 - 64 + 1);
    EXPECT_EQ(out.bsums[1], 99);
    EXPECT_EQ(out.bsums[2], 0);
}

}  // namespace
