// Small helpers shared by the K-quant quantizers and dequantizers: the
// rounding the reference quantizers use, and the packing of the 6-bit scales
// of q3_K (signed, 16 per block) and q4_K / q5_K (scale + min, 8 per block).
// Kept inline so the per-block loops stay free of calls.
#pragma once

#include <cstdint>
#include <cstring>

namespace tern::quant {

// Round to nearest, ties to even, by adding 1.5 * 2^23 and reading the low
// mantissa bits. The reference quantizers round this way (not roundf), so a
// bit-exact quantizer must too. Valid for |f| <= 4194303.
inline int nearest_int(float f) {
    const float biased = f + 12582912.f;
    int32_t bits;
    std::memcpy(&bits, &biased, sizeof bits);
    return (bits & 0x007fffff) - 0x00400000;
}

// q4_K / q5_K: scale j (0..7) and min j, each 6 bits, in 12 bytes. Bytes 0..3
// hold scales 0..3 (low 6 bits) and the top 2 bits of scales 4..7; bytes 4..7
// the same for the mins; bytes 8..11 the low nibbles of scale (low half) and
// min (high half) 4..7.
inline void unpack_scale_min_k4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
    if (j < 4) {
        *scale = q[j] & 63;
        *min = q[j + 4] & 63;
    } else {
        *scale = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *min = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Inverse of unpack_scale_min_k4 for all 8 pairs; ls and lm are 0..63.
inline void pack_scales_mins_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* q) {
    for (int j = 0; j < 4; ++j) {
        q[j] = ls[j];
        q[j + 4] = lm[j];
    }
    for (int j = 4; j < 8; ++j) {
        q[j + 4] = uint8_t((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
        q[j - 4] = uint8_t(q[j - 4] | ((ls[j] >> 4) << 6));
        q[j] = uint8_t(q[j] | ((lm[j] >> 4) << 6));
    }
}

// q3_K: 16 scales of 6 bits stored biased by 32. Low nibbles: scale j < 8 in
// the low half of byte j, j >= 8 in the high half of byte j - 8; the top two
// bits of scale j in byte 8 + j % 4 at bit 2 * (j / 4).
inline int unpack_scale_q3_k(int j, const uint8_t* q) {
    const int low = j < 8 ? (q[j] & 0xF) : (q[j - 8] >> 4);
    const int high = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (low | (high << 4)) - 32;
}

// Stores biased scale l (0..63) as scale j; q must start zeroed.
inline void pack_scale_q3_k(int j, int l, uint8_t* q) {
    if (j < 8) {
        q[j] = uint8_t(q[j] | (l & 0xF));
    } else {
        q[j - 8] = uint8_t(q[j - 8] | ((l & 0xF) << 4));
    }
    q[8 + j % 4] = uint8_t(q[8 + j % 4] | ((l >> 4) << (2 * (j / 4))));
}

}  // namespace tern::quant
