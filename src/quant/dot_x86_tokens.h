// The x86 multi-token kernels (prefill), and the table of every kernel this
// path exports. Included by dot_avx2.cpp and dot_avx512.cpp right after
// dot_x86_body.h, whose unpacking and combining steps they reuse.
//
// A one-token kernel unpacks every weight block for every token; with many
// tokens that unpacking dominates. These kernels walk the row once: each
// group of eight 32-blocks (or each K-quant super-block) is unpacked into
// registers, then every token's activations pass over it. Token t keeps its
// own eight-lane accumulator and gets the same exact integer sums and the same
// float steps in the same order as the one-token kernel, so the same bits
// (docs/cpu-kernels.md, "Prefill kernels").
//
// Not a public header; everything is in an unnamed namespace.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/dot_internal.h"

namespace tern::quant::detail {
namespace {

// ---- 32-element types ------------------------------------------------------
//
// kFull: eight whole blocks. Otherwise `valid` < 8 blocks are real: w is a
// zero-padded copy, and lanes >= valid load no activations and add +0.0f to
// their accumulator, which leaves it unchanged (an accumulator that starts at
// +0.0f never holds -0.0f).

template <class T, bool kFull>
inline void legacy_group_tokens(const typename T::Block* w, const ActTokens& a, int64_t b, int valid, int n,
                                __m256* acc) {
    using Block = typename T::Block;
    typename T::Unpacked q[8];
    for (int j = 0; j < 8; ++j) q[j] = T::unpack(w[j]);
    const __m256 dw = half8(&w[0].d, sizeof(Block));
    __m256 mw = _mm256_setzero_ps();
    if constexpr (T::kMin) mw = half8(&w[0].m, sizeof(Block));
    const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int t = 0; t < n; ++t) {
        const int64_t at = t * a.stride + b;
        const block_q8a* x = a.q + at;
        __m256i p[8];
        for (int j = 0; j < 8; ++j)
            p[j] = kFull || j < valid ? T::mul(q[j], load_a(x[j])) : _mm256_setzero_si256();
        __m256i A = reduce8(p);
        const __m256 da = kFull ? _mm256_loadu_ps(a.d + at) : _mm256_maskload_ps(a.d + at, live);
        __m256i S = _mm256_setzero_si256();
        if constexpr (T::kMin || T::kOffsetShift != 0)
            S = kFull ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sum + at))
                      : _mm256_maskload_epi32(reinterpret_cast<const int*>(a.sum + at), live);
        if constexpr (T::kOffsetShift != 0) A = _mm256_sub_epi32(A, _mm256_slli_epi32(S, T::kOffsetShift));
        __m256 term = _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(A));
        if constexpr (T::kMin)
            term = _mm256_add_ps(term, _mm256_mul_ps(_mm256_mul_ps(mw, da), _mm256_cvtepi32_ps(S)));
        acc[t] = _mm256_add_ps(acc[t], term);
    }
}

template <class T>
void dot_legacy_tokens(const void* wv, const ActTokens& a, int n, int64_t k, float* out, int64_t out_stride) {
    using Block = typename T::Block;
    const auto* w = static_cast<const Block*>(wv);
    const int64_t nb = k / 32;
    __m256 acc[kDotMaxTokens];
    for (int t = 0; t < n; ++t) acc[t] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) legacy_group_tokens<T, true>(w + b, a, b, 8, n, acc);
    if (b < nb) {
        Block tail[8];
        std::memset(static_cast<void*>(tail), 0, sizeof tail);
        std::memcpy(static_cast<void*>(tail), w + b, size_t(nb - b) * sizeof(Block));
        legacy_group_tokens<T, false>(tail, a, b, int(nb - b), n, acc);
    }
    for (int t = 0; t < n; ++t) out[t * out_stride] = fold8(acc[t]);
}

// ---- K-quants: one super-block (eight 32-blocks) at a time -------------------

template <class T>
void dot_kquant_tokens(const void* wv, const ActTokens& a, int n, int64_t k, float* out, int64_t out_stride) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    __m256 acc[kDotMaxTokens];
    for (int t = 0; t < n; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / QK_K; ++i) {
        typename T::Unpacked u;
        T::unpack(w[i], u);
        const __m256 d = _mm256_set1_ps(half1(w[i].d));
        __m256 dmin = _mm256_setzero_ps();
        if constexpr (T::kMin) dmin = _mm256_set1_ps(half1(w[i].dmin));
        for (int t = 0; t < n; ++t) {
            const int64_t at = t * a.stride + 8 * i;
            __m256i asum = _mm256_setzero_si256();
            if constexpr (T::kActSum) asum = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.sum + at));
            __m256i A, X;
            T::sums(u, a.q + at, asum, A, X);
            const __m256 da = _mm256_loadu_ps(a.d + at);
            __m256 term = _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(A));
            if constexpr (T::kMin)
                term = _mm256_sub_ps(term, _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(X)));
            acc[t] = _mm256_add_ps(acc[t], term);
        }
    }
    for (int t = 0; t < n; ++t) out[t * out_stride] = fold8(acc[t]);
}

// ---- float rows: NT tokens share each converted weight vector ----------------
//
// NT is a compile-time count so the 2 * NT accumulators stay in registers
// (sixteen ymm registers on AVX2: NT <= 4).

template <class T, int NT>
void dot_float_tokens_n(const void* w, const float* x, int64_t x_stride, int64_t k, float* out,
                        int64_t out_stride) {
    __m256 acc0[NT], acc1[NT];
    for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        const __m256 w0 = T::load8(w, i), w1 = T::load8(w, i + 8);
        for (int t = 0; t < NT; ++t) {
            const float* xt = x + t * x_stride + i;
            acc0[t] = _mm256_add_ps(acc0[t], _mm256_mul_ps(w0, _mm256_loadu_ps(xt)));
            acc1[t] = _mm256_add_ps(acc1[t], _mm256_mul_ps(w1, _mm256_loadu_ps(xt + 8)));
        }
    }
    for (int t = 0; t < NT; ++t) {
        if (i == k) {
            out[t * out_stride] = fold8(_mm256_add_ps(acc0[t], acc1[t]));
            continue;
        }
        // Ragged tail, lane by lane as dot_float does.
        const float* xt = x + t * x_stride;
        Lanes16 lanes;
        _mm256_storeu_ps(lanes.v, acc0[t]);
        _mm256_storeu_ps(lanes.v + 8, acc1[t]);
        for (int64_t e = i; e < k; ++e) {
            const float p = T::load1(w, e) * xt[e];
            lanes.v[e % 16] += p;
        }
        out[t * out_stride] = lanes16_total(lanes);
    }
}

template <class T>
void dot_float_tokens(const void* w, const float* x, int64_t x_stride, int n, int64_t k, float* out,
                      int64_t out_stride) {
    for (; n >= 4; n -= 4, x += 4 * x_stride, out += 4 * out_stride)
        dot_float_tokens_n<T, 4>(w, x, x_stride, k, out, out_stride);
    switch (n) {
    case 3: dot_float_tokens_n<T, 3>(w, x, x_stride, k, out, out_stride); break;
    case 2: dot_float_tokens_n<T, 2>(w, x, x_stride, k, out, out_stride); break;
    case 1: dot_float_tokens_n<T, 1>(w, x, x_stride, k, out, out_stride); break;
    default: break;
    }
}

// ---- this path's table ---------------------------------------------------------

template <class T>
constexpr IntKernel legacy() {
    return {dot_legacy<T>, int_sums_legacy<T>, dot_legacy_tokens<T>};
}
template <class T>
constexpr IntKernel kquant() {
    return {dot_kquant<T>, int_sums_kquant<T>, dot_kquant_tokens<T>};
}

const PathKernels kX86Kernels = {
    legacy<Q4_0>(), legacy<Q4_1>(), legacy<Q5_0>(), legacy<Q5_1>(), legacy<Q8_0>(),
    kquant<Q2_K>(), kquant<Q3_K>(), kquant<Q4_K>(), kquant<Q5_K>(), kquant<Q6_K>(),
    dot_float<F32>, dot_float<F16>, dot_float<BF16>,
    quantize_act_row_x86,
    dot_float_tokens<F32>, dot_float_tokens<F16>, dot_float_tokens<BF16>,
};

}  // namespace
}  // namespace tern::quant::detail
