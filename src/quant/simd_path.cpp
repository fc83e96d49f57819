// Run-time detection of the SIMD paths: a path is available when its kernels
// were compiled in (the file exports a table) and the CPU, including the OS's
// saving of the wider registers, supports its instructions.
#include "quant/simd_path.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "quant/dot_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace tern::quant {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// CPUID and XGETBV directly: compilers disagree on which feature names
// __builtin_cpu_supports knows (clang 14 has no "f16c").
struct X86Features {
    bool avx2 = false, fma = false, f16c = false;
    bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false;
};

X86Features read_x86_features() {
    X86Features f;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool osxsave = c & (1u << 27);
    f.fma = c & (1u << 12);
    f.f16c = c & (1u << 29);
    if (!osxsave) return {};
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    const bool os_avx = (xcr0_lo & 0x6u) == 0x6u;           // XMM and YMM state saved
    const bool os_avx512 = (xcr0_lo & 0xe6u) == 0xe6u;      // plus opmask and ZMM state
    if (!os_avx) return {};
    if (__get_cpuid_max(0, nullptr) < 7) return f;
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = b & (1u << 5);
    if (os_avx512) {
        f.avx512f = b & (1u << 16);
        f.avx512bw = b & (1u << 30);
        f.avx512vl = b & (1u << 31);
        f.avx512vnni = c & (1u << 11);
    }
    return f;
}
#endif

bool cpu_has(SimdPath path) {
#if defined(__x86_64__) || defined(__i386__)
    static const X86Features f = read_x86_features();
    switch (path) {
    case SimdPath::scalar:
        return true;
    case SimdPath::avx2:
        return f.avx2 && f.fma && f.f16c;
    case SimdPath::avx512:
        return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
    }
    return false;
#else
    return path == SimdPath::scalar;
#endif
}

const detail::PathKernels* compiled(SimdPath path) {
    switch (path) {
    case SimdPath::scalar: return detail::path_kernels_scalar();
    case SimdPath::avx2: return detail::path_kernels_avx2();
    case SimdPath::avx512: return detail::path_kernels_avx512();
    }
    return nullptr;
}

}  // namespace

const char* simd_path_name(SimdPath path) {
    switch (path) {
    case SimdPath::scalar: return "scalar";
    case SimdPath::avx2: return "avx2";
    case SimdPath::avx512: return "avx512";
    }
    return "unknown";
}

namespace {

// TERN_CPU_SIMD=scalar|avx2 caps the paths this process may use, so that one
// machine runs (and tests) what a CPU without AVX-512, or without AVX2, would.
SimdPath simd_path_cap() {
    const char* v = std::getenv("TERN_CPU_SIMD");
    if (!v || !*v) return SimdPath::avx512;
    for (SimdPath p : {SimdPath::scalar, SimdPath::avx2, SimdPath::avx512})
        if (std::strcmp(v, simd_path_name(p)) == 0) return p;
    std::fprintf(stderr, "tern: TERN_CPU_SIMD=%s is not one of scalar, avx2, avx512; ignored\n", v);
    return SimdPath::avx512;
}

}  // namespace

bool simd_path_available(SimdPath path) {
    static const SimdPath cap = simd_path_cap();
    static const bool available[kSimdPathCount] = {
        true,
        compiled(SimdPath::avx2) != nullptr && cpu_has(SimdPath::avx2) && cap >= SimdPath::avx2,
        compiled(SimdPath::avx512) != nullptr && cpu_has(SimdPath::avx512) && cap >= SimdPath::avx512,
    };
    const int i = int(path);
    return i >= 0 && i < kSimdPathCount && available[i];
}

SimdPath simd_path_best() {
    static const SimdPath best = simd_path_available(SimdPath::avx512) ? SimdPath::avx512
                                 : simd_path_available(SimdPath::avx2) ? SimdPath::avx2
                                                                       : SimdPath::scalar;
    return best;
}

}  // namespace tern::quant
