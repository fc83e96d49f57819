// The scalar reference of every dot-product kernel: plain loops that compute
// each block's exact integer sums and combine them in the documented float
// order (dot_internal.h). The SIMD paths must return the same bits. Built
// with -ffp-contract=off so no compiler may fuse a multiply into an add.
// The per-block float terms are also exported on their own (block_terms_scalar)
// so that other summation orders have a CPU twin, and so is the CUDA kernels'
// K-quant order, one term per super-block (row_grouped_scalar).
#include "base/fp16.h"
#include "quant/dot_internal.h"

namespace tern::quant::detail {
namespace {

float half(uint16_t h) { return fp16_to_fp32(h); }

// ---- 32-element types: one weight block per activation block -------------
//
// Each type provides w_sum (A) and x_sum (S) of one block and the float term
// built from them.

struct Q4_0 {
    using Block = block_q4_0;
    static int32_t w_sum(const Block& w, const block_q8a& a) {
        int32_t s = 0;
        for (int j = 0; j < 16; ++j) {
            s += ((w.qs[j] & 0xF) - 8) * a.qs[j];
            s += ((w.qs[j] >> 4) - 8) * a.qs[j + 16];
        }
        return s;
    }
    static int32_t x_sum(const block_q8a&) { return 0; }
    static float term(const Block& w, const block_q8a& a, int32_t A, int32_t) {
        return term_scale(half(w.d), a.d, A);
    }
};

struct Q4_1 {
    using Block = block_q4_1;
    static int32_t w_sum(const Block& w, const block_q8a& a) {
        int32_t s = 0;
        for (int j = 0; j < 16; ++j) s += (w.qs[j] & 0xF) * a.qs[j] + (w.qs[j] >> 4) * a.qs[j + 16];
        return s;
    }
    static int32_t x_sum(const block_q8a& a) { return a.sum; }
    static float term(const Block& w, const block_q8a& a, int32_t A, int32_t S) {
        return term_offset(half(w.d), half(w.m), a.d, A, S);
    }
};

// Fifth bit of element j (0..31) is bit j of qh.
inline int q5_value(const uint8_t* qs, uint32_t qh, int j) {
    const int nib = j < 16 ? (qs[j] & 0xF) : (qs[j - 16] >> 4);
    return nib | int((qh >> j) & 1u) << 4;
}

struct Q5_0 {
    using Block = block_q5_0;
    static int32_t w_sum(const Block& w, const block_q8a& a) {
        const uint32_t qh = load_u32(w.qh);
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) s += (q5_value(w.qs, qh, j) - 16) * a.qs[j];
        return s;
    }
    static int32_t x_sum(const block_q8a&) { return 0; }
    static float term(const Block& w, const block_q8a& a, int32_t A, int32_t) {
        return term_scale(half(w.d), a.d, A);
    }
};

struct Q5_1 {
    using Block = block_q5_1;
    static int32_t w_sum(const Block& w, const block_q8a& a) {
        const uint32_t qh = load_u32(w.qh);
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) s += q5_value(w.qs, qh, j) * a.qs[j];
        return s;
    }
    static int32_t x_sum(const block_q8a& a) { return a.sum; }
    static float term(const Block& w, const block_q8a& a, int32_t A, int32_t S) {
        return term_offset(half(w.d), half(w.m), a.d, A, S);
    }
};

struct Q8_0 {
    using Block = block_q8_0;
    static int32_t w_sum(const Block& w, const block_q8a& a) {
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) s += w.qs[j] * a.qs[j];
        return s;
    }
    static int32_t x_sum(const block_q8a&) { return 0; }
    static float term(const Block& w, const block_q8a& a, int32_t A, int32_t) {
        return term_scale(half(w.d), a.d, A);
    }
};

// The float term t_b of one block, from its exact integer sums.
template <class T>
float legacy_term(const typename T::Block& w, const block_q8a& a) {
    const int32_t A = T::w_sum(w, a), S = T::x_sum(a);
    return T::term(w, a, A, S);
}

template <class T>
float dot_legacy(const void* wv, const block_q8a* a, int64_t k) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    Lanes8 acc;
    lanes8_clear(acc);
    for (int64_t b = 0; b < k / 32; ++b) acc.v[b % 8] += legacy_term<T>(w[b], a[b]);
    return lanes8_total(acc);
}

template <class T>
void terms_legacy(const void* wv, const block_q8a* a, int64_t k, float* terms) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    for (int64_t b = 0; b < k / 32; ++b) terms[b] = legacy_term<T>(w[b], a[b]);
}

template <class T>
void int_sums_legacy(const void* wv, const block_q8a* a, int64_t k, int32_t* A, int32_t* S) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    for (int64_t b = 0; b < k / 32; ++b) {
        A[b] = T::w_sum(w[b], a[b]);
        S[b] = T::x_sum(a[b]);
    }
}

// ---- K-quants: one 256-element super-block spans eight activation blocks --
//
// sums() fills A[j], X[j] for the super-block's eight 32-element blocks j;
// term() is block j's float term. Element e of a super-block lies in
// activation block e / 32 at position e % 32.

struct Q2_K {
    using Block = block_q2_K;
    // A = sum sc(e) * q(e) * a(e), X = sum m(e) * a(e); sc, m per 16 elements.
    static void sums(const Block& w, const block_q8a* a, int32_t* A, int32_t* X) {
        for (int j = 0; j < 8; ++j) {
            const int h = j / 4, plane = j % 4;
            int32_t s = 0, m = 0;
            for (int l = 0; l < 32; ++l) {
                const int q = (w.qs[32 * h + l] >> (2 * plane)) & 3;
                const uint8_t sm = w.scales[2 * j + l / 16];
                s += (sm & 0xF) * q * a[j].qs[l];
                m += (sm >> 4) * a[j].qs[l];
            }
            A[j] = s;
            X[j] = m;
        }
    }
    static float term(const Block& w, const block_q8a& a, int32_t A, int32_t X) {
        return term_min(half(w.d), half(w.dmin), a.d, A, X);
    }
    static float inner(const Block& w, int32_t A, int32_t X) { return kquant_inner_min(half(w.d), half(w.dmin), A, X); }
};

struct Q3_K {
    using Block = block_q3_K;
    // A = sum sc(e) * v(e) * a(e), sc in -32..31 per 16 elements, v in -4..3.
    static void sums(const Block& w, const block_q8a* a, int32_t* A, int32_t* X) {
        int8_t sc[16];
        unpack_q3k_scales(w.scales, sc);
        for (int j = 0; j < 8; ++j) {
            const int h = j / 4, plane = j % 4;
            int32_t s = 0;
            for (int l = 0; l < 32; ++l) {
                const int low = (w.qs[32 * h + l] >> (2 * plane)) & 3;
                const int high = (w.hmask[l] >> (4 * h + plane)) & 1;
                s += sc[2 * j + l / 16] * (low - (high ? 0 : 4)) * a[j].qs[l];
            }
            A[j] = s;
            X[j] = 0;
        }
    }
    static float term(const Block& w, const block_q8a& a, int32_t A, int32_t) {
        return term_scale(half(w.d), a.d, A);
    }
    static float inner(const Block& w, int32_t A, int32_t) { return kquant_inner_scale(half(w.d), A); }
};

struct Q4_K {
    using Block = block_q4_K;
    // Element l of 32-element block j: 0..15.
    static int q(const Block& w, int j, int l) { return (w.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF; }
    // A = sc(j) * sum q(e) * a(e), X = m(j) * sum a(e); sc, m per 32 elements.
    static void sums(const Block& w, const block_q8a* a, int32_t* A, int32_t* X) {
        uint8_t sc[8], mn[8];
        unpack_k4_scales(w.scales, sc, mn);
        for (int j = 0; j < 8; ++j) {
            int32_t s = 0;
            for (int l = 0; l < 32; ++l) s += q(w, j, l) * a[j].qs[l];
            A[j] = sc[j] * s;
            X[j] = mn[j] * a[j].sum;
        }
    }
    static float term(const Block& w, const block_q8a& a, int32_t A, int32_t X) {
        return term_min(half(w.d), half(w.dmin), a.d, A, X);
    }
    static float inner(const Block& w, int32_t A, int32_t X) { return kquant_inner_min(half(w.d), half(w.dmin), A, X); }
};

struct Q5_K {
    using Block = block_q5_K;
    // As q4_K with q in 0..31; the fifth bit of block j's element l is bit j of qh[l].
    static int q(const Block& w, int j, int l) {
        return ((w.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF) | ((w.qh[l] >> j) & 1) << 4;
    }
    static void sums(const Block& w, const block_q8a* a, int32_t* A, int32_t* X) {
        uint8_t sc[8], mn[8];
        unpack_k4_scales(w.scales, sc, mn);
        for (int j = 0; j < 8; ++j) {
            int32_t s = 0;
            for (int l = 0; l < 32; ++l) s += q(w, j, l) * a[j].qs[l];
            A[j] = sc[j] * s;
            X[j] = mn[j] * a[j].sum;
        }
    }
    static float term(const Block& w, const block_q8a& a, int32_t A, int32_t X) {
        return term_min(half(w.d), half(w.dmin), a.d, A, X);
    }
    static float inner(const Block& w, int32_t A, int32_t X) { return kquant_inner_min(half(w.d), half(w.dmin), A, X); }
};

struct Q6_K {
    using Block = block_q6_K;
    // A = sum sc(e) * (q(e) - 32) * a(e), sc int8 per 16 elements.
    static void sums(const Block& w, const block_q8a* a, int32_t* A, int32_t* X) {
        for (int j = 0; j < 8; ++j) {
            const int h = j / 4, quarter = j % 4;
            const uint8_t* ql = w.ql + 64 * h + 32 * (quarter & 1);
            const uint8_t* qh = w.qh + 32 * h;
            int32_t s = 0;
            for (int l = 0; l < 32; ++l) {
                const int low = quarter < 2 ? (ql[l] & 0xF) : (ql[l] >> 4);
                const int high = (qh[l] >> (2 * quarter)) & 3;
                s += w.scales[2 * j + l / 16] * ((low | high << 4) - 32) * a[j].qs[l];
            }
            A[j] = s;
            X[j] = 0;
        }
    }
    static float term(const Block& w, const block_q8a& a, int32_t A, int32_t) {
        return term_scale(half(w.d), a.d, A);
    }
    static float inner(const Block& w, int32_t A, int32_t) { return kquant_inner_scale(half(w.d), A); }
};

// The float terms of a super-block's eight 32-element blocks.
template <class T>
void kquant_terms(const typename T::Block& w, const block_q8a* a, float* terms) {
    int32_t A[8], X[8];
    T::sums(w, a, A, X);
    for (int j = 0; j < 8; ++j) terms[j] = T::term(w, a[j], A[j], X[j]);
}

template <class T>
float dot_kquant(const void* wv, const block_q8a* a, int64_t k) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    Lanes8 acc;
    lanes8_clear(acc);
    for (int64_t i = 0; i < k / QK_K; ++i, a += 8) {
        float t[8];
        kquant_terms<T>(w[i], a, t);
        for (int j = 0; j < 8; ++j) acc.v[j] += t[j];
    }
    return lanes8_total(acc);
}

template <class T>
void terms_kquant(const void* wv, const block_q8a* a, int64_t k, float* terms) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    for (int64_t i = 0; i < k / QK_K; ++i) kquant_terms<T>(w[i], a + 8 * i, terms + 8 * i);
}

// The CUDA kernels' K-quant order (dot_internal.h kquant_inner_*): per
// super-block, the integer totals of its eight blocks, one inner term, and one
// fused multiply-add by the activations' group scale (that of block 8i, which
// quantize_act_row_grouped gives all eight blocks).
template <class T>
float dot_kquant_grouped(const void* wv, const block_q8a* a, int64_t k) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    float r = 0.0f;
    for (int64_t i = 0; i < k / QK_K; ++i) {
        int32_t A[8], X[8];
        T::sums(w[i], a + 8 * i, A, X);
        int32_t a_total = 0, x_total = 0;
        for (int j = 0; j < 8; ++j) {
            a_total += A[j];
            x_total += X[j];
        }
        r = std::fma(a[8 * i].d, T::inner(w[i], a_total, x_total), r);
    }
    return r;
}

template <class T>
void int_sums_kquant(const void* wv, const block_q8a* a, int64_t k, int32_t* A, int32_t* X) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    for (int64_t i = 0; i < k / QK_K; ++i) T::sums(w[i], a + 8 * i, A + 8 * i, X + 8 * i);
}

// ---- float rows -----------------------------------------------------------

float load_f32(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
float load_f16(const void* w, int64_t i) { return fp16_to_fp32(static_cast<const uint16_t*>(w)[i]); }
float load_bf16(const void* w, int64_t i) { return bf16_to_fp32(static_cast<const uint16_t*>(w)[i]); }

template <float (*load)(const void*, int64_t)>
float dot_float(const void* w, const float* x, int64_t k) {
    Lanes16 acc = {};
    for (int64_t i = 0; i < k; ++i) {
        const float p = load(w, i) * x[i];
        acc.v[i % 16] += p;
    }
    return lanes16_total(acc);
}

// ---- several tokens: each token as the one-token kernels do it --------------
//
// The reference for the packed layout: every block is read back as a
// block_q8a and goes through the same integer sums and float steps.

template <class T>
void dot_legacy_tokens(const void* wv, const ActTokens& a, int n, int64_t k, float* out, int64_t out_stride) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    for (int t = 0; t < n; ++t) {
        Lanes8 acc;
        lanes8_clear(acc);
        for (int64_t b = 0; b < k / 32; ++b) acc.v[b % 8] += legacy_term<T>(w[b], act_block(a, t, b));
        out[t * out_stride] = lanes8_total(acc);
    }
}

template <class T>
void dot_kquant_tokens(const void* wv, const ActTokens& a, int n, int64_t k, float* out, int64_t out_stride) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    for (int t = 0; t < n; ++t) {
        Lanes8 acc;
        lanes8_clear(acc);
        for (int64_t i = 0; i < k / QK_K; ++i) {
            block_q8a x[8];
            for (int j = 0; j < 8; ++j) x[j] = act_block(a, t, 8 * i + j);
            float terms[8];
            kquant_terms<T>(w[i], x, terms);
            for (int j = 0; j < 8; ++j) acc.v[j] += terms[j];
        }
        out[t * out_stride] = lanes8_total(acc);
    }
}

template <DotFloatFn row>
void dot_float_tokens_by_row(const void* w, const float* x, int64_t x_stride, int n, int64_t k, float* out,
                             int64_t out_stride) {
    for (int t = 0; t < n; ++t) out[t * out_stride] = row(w, x + t * x_stride, k);
}

template <class T>
constexpr IntKernel legacy() {
    return {dot_legacy<T>, int_sums_legacy<T>, dot_legacy_tokens<T>};
}
template <class T>
constexpr IntKernel kquant() {
    return {dot_kquant<T>, int_sums_kquant<T>, dot_kquant_tokens<T>};
}

const PathKernels kScalar = {
    legacy<Q4_0>(), legacy<Q4_1>(), legacy<Q5_0>(), legacy<Q5_1>(), legacy<Q8_0>(),
    kquant<Q2_K>(), kquant<Q3_K>(), kquant<Q4_K>(), kquant<Q5_K>(), kquant<Q6_K>(),
    dot_float<load_f32>, dot_float<load_f16>, dot_float<load_bf16>,
    quantize_act_row_scalar,
    dot_float_tokens_by_row<dot_float<load_f32>>, dot_float_tokens_by_row<dot_float<load_f16>>,
    dot_float_tokens_by_row<dot_float<load_bf16>>,
};

}  // namespace

const PathKernels* path_kernels_scalar() { return &kScalar; }

DotTermsFn block_terms_scalar(TensorType type) {
    switch (type) {
    case TensorType::Q4_0: return terms_legacy<Q4_0>;
    case TensorType::Q4_1: return terms_legacy<Q4_1>;
    case TensorType::Q5_0: return terms_legacy<Q5_0>;
    case TensorType::Q5_1: return terms_legacy<Q5_1>;
    case TensorType::Q8_0: return terms_legacy<Q8_0>;
    case TensorType::Q2_K: return terms_kquant<Q2_K>;
    case TensorType::Q3_K: return terms_kquant<Q3_K>;
    case TensorType::Q4_K: return terms_kquant<Q4_K>;
    case TensorType::Q5_K: return terms_kquant<Q5_K>;
    case TensorType::Q6_K: return terms_kquant<Q6_K>;
    default: return nullptr;
    }
}

DotRowFn row_grouped_scalar(TensorType type) {
    switch (type) {
    case TensorType::Q2_K: return dot_kquant_grouped<Q2_K>;
    case TensorType::Q3_K: return dot_kquant_grouped<Q3_K>;
    case TensorType::Q4_K: return dot_kquant_grouped<Q4_K>;
    case TensorType::Q5_K: return dot_kquant_grouped<Q5_K>;
    case TensorType::Q6_K: return dot_kquant_grouped<Q6_K>;
    default: return nullptr;
    }
}

}  // namespace tern::quant::detail
