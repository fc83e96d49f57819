// IEEE half and bfloat16 conversions, bit-exact with the conversions numpy
// and other GGUF tools use (round to nearest even, NaN kept a NaN).
#pragma once

#include <cstdint>
#include <cstring>

namespace tern {

inline float fp32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t fp32_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// Half to float: exact for every half value, subnormals included.
inline float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return fp32_from_bits(sign | 0x7f800000u | (mant << 13));
    if (exp != 0) return fp32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0) return fp32_from_bits(sign);
    // Subnormal half: value = mant * 2^-24, exactly representable in float.
    const float v = float(mant) * (1.0f / 16777216.0f);
    return (h & 0x8000u) ? -v : v;
}

// Float to half with round to nearest even; overflow goes to infinity.
inline uint16_t fp32_to_fp16(float f) {
    const uint32_t x = fp32_to_bits(f);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
    const uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) {  // inf or NaN
        return uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0u));
    }
    if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504
    if (absx < 0x38800000u) {                                   // below the smallest normal half
        if (absx < 0x33000000u) return sign;                    // rounds to zero
        const uint32_t e = absx >> 23;
        const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e;                        // 14..24
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) ++r;
        return uint16_t(sign | r);
    }
    uint32_t r = ((absx - 0x38000000u) >> 13);
    const uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return uint16_t(sign | r);
}

inline float bf16_to_fp32(uint16_t b) { return fp32_from_bits(uint32_t(b) << 16); }

// Float to bfloat16, round to nearest even; NaN stays a quiet NaN.
inline uint16_t fp32_to_bf16(float f) {
    uint32_t u = fp32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 64u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

}  // namespace tern
