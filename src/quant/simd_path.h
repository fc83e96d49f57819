// Which instruction-set path a CPU kernel runs on. Every kernel family (the
// integer dot products, activation quantization, the float dot products) has
// a plain scalar reference and x86 variants compiled with their own flags;
// the variant is picked at run time from what the CPU reports, so one binary
// runs everywhere. All paths produce the same bits (see docs/cpu-kernels.md).
#pragma once

namespace tern::quant {

enum class SimdPath : int {
    scalar = 0,  // portable C++, the reference
    avx2 = 1,    // AVX2 + FMA + F16C
    avx512 = 2,  // AVX-512 F/BW/VL + VNNI, on 256-bit vectors (vpdpbusd, mask registers)
};
constexpr int kSimdPathCount = 3;

// "scalar", "avx2", "avx512".
const char* simd_path_name(SimdPath path);

// Compiled into this binary and supported by this CPU (and its OS), and not
// above the cap the environment may set (TERN_CPU_SIMD=scalar|avx2: run as a
// CPU without AVX-512, or without either, would).
bool simd_path_available(SimdPath path);

// The fastest available path; decided once per process.
SimdPath simd_path_best();

}  // namespace tern::quant
