// Picks the dot-product kernel for a (type, path) pair from the tables the
// per-path files export; unavailable paths and unsupported types give null.
// Also the packing of activations for the multi-token kernels, and the
// per-block terms summed in the CUDA kernels' chunked order.
#include "quant/dot.h"

#include <cstring>
#include <limits>
#include <string>

#include "quant/dot_internal.h"

namespace tern::quant {

namespace {

const detail::PathKernels* kernels_for(SimdPath path) {
    if (!simd_path_available(path)) return nullptr;
    switch (path) {
    case SimdPath::scalar: return detail::path_kernels_scalar();
    case SimdPath::avx2: return detail::path_kernels_avx2();
    case SimdPath::avx512: return detail::path_kernels_avx512();
    }
    return nullptr;
}

const detail::IntKernel* int_kernel(const detail::PathKernels& k, TensorType type) {
    switch (type) {
    case TensorType::Q4_0: return &k.q4_0;
    case TensorType::Q4_1: return &k.q4_1;
    case TensorType::Q5_0: return &k.q5_0;
    case TensorType::Q5_1: return &k.q5_1;
    case TensorType::Q8_0: return &k.q8_0;
    case TensorType::Q2_K: return &k.q2_K;
    case TensorType::Q3_K: return &k.q3_K;
    case TensorType::Q4_K: return &k.q4_K;
    case TensorType::Q5_K: return &k.q5_K;
    case TensorType::Q6_K: return &k.q6_K;
    default: return nullptr;
    }
}

}  // namespace

bool dot_int_type(TensorType type) { return int_kernel(*detail::path_kernels_scalar(), type) != nullptr; }

bool dot_float_type(TensorType type) {
    return type == TensorType::F32 || type == TensorType::F16 || type == TensorType::BF16;
}

DotRowFn dot_row_kernel(TensorType type, SimdPath path) {
    const detail::PathKernels* k = kernels_for(path);
    const detail::IntKernel* ik = k ? int_kernel(*k, type) : nullptr;
    return ik ? ik->row : nullptr;
}

DotIntSumsFn dot_int_sums_kernel(TensorType type, SimdPath path) {
    const detail::PathKernels* k = kernels_for(path);
    const detail::IntKernel* ik = k ? int_kernel(*k, type) : nullptr;
    return ik ? ik->int_sums : nullptr;
}

DotFloatFn dot_float_kernel(TensorType type, SimdPath path) {
    const detail::PathKernels* k = kernels_for(path);
    if (!k) return nullptr;
    switch (type) {
    case TensorType::F32: return k->f32;
    case TensorType::F16: return k->f16;
    case TensorType::BF16: return k->bf16;
    default: return nullptr;
    }
}

DotTokensFn dot_tokens_kernel(TensorType type, SimdPath path) {
    const detail::PathKernels* k = kernels_for(path);
    const detail::IntKernel* ik = k ? int_kernel(*k, type) : nullptr;
    return ik ? ik->tokens : nullptr;
}

DotRowsFn dot_rows_kernel(TensorType type, SimdPath path) {
    const detail::PathKernels* k = kernels_for(path);
    const detail::IntKernel* ik = k ? int_kernel(*k, type) : nullptr;
    return ik ? ik->rows : nullptr;
}

DotFloatTokensFn dot_float_tokens_kernel(TensorType type, SimdPath path) {
    const detail::PathKernels* k = kernels_for(path);
    if (!k) return nullptr;
    switch (type) {
    case TensorType::F32: return k->f32_tokens;
    case TensorType::F16: return k->f16_tokens;
    case TensorType::BF16: return k->bf16_tokens;
    default: return nullptr;
    }
}

namespace {

// Runs a terms kernel after checking the type has one and k is whole blocks.
Status write_block_terms(detail::DotTermsFn fn, const char* what, TensorType type, const void* w_row,
                         const block_q8a* a, int64_t k, float* terms) {
    if (!fn) return Error{std::string(what) + ": type " + tensor_type_name(uint32_t(type)) + " has no integer dot product"};
    const auto info = tensor_type_info(uint32_t(type));
    if (k < 0 || k % int64_t(info->block_elems) != 0)
        return Error{std::string(what) + ": row length " + std::to_string(k) + " is not a whole number of " +
                     tensor_type_name(uint32_t(type)) + " blocks (" + std::to_string(info->block_elems) + " elements)"};
    fn(w_row, a, k, terms);
    return {};
}

}  // namespace

Status dot_block_terms(TensorType type, const void* w_row, const block_q8a* a, int64_t k, float* terms) {
    return write_block_terms(detail::block_terms_scalar(type), "dot_block_terms", type, w_row, a, k, terms);
}

float sum_terms_chunked(const float* terms, int64_t n_blocks) {
    float r = 0.0f;
    for (int64_t first = 0; first < n_blocks; first += 8) {
        const int64_t end = first + 8 < n_blocks ? first + 8 : n_blocks;
        float c = terms[first];
        for (int64_t b = first + 1; b < end; ++b) c = c + terms[b];
        r = r + c;
    }
    return r;
}

bool dot_grouped_type(TensorType type) { return detail::row_grouped_scalar(type) != nullptr; }

float dot_row_chunked(TensorType type, const void* w_row, const block_q8a* a, int64_t k) {
    const auto info = tensor_type_info(uint32_t(type));
    const detail::DotTermsFn terms = detail::block_terms_scalar(type);  // null: no integer dot product
    if (!terms || k < 0 || k % int64_t(info->block_elems) != 0) return std::numeric_limits<float>::quiet_NaN();
    if (const DotRowFn grouped = detail::row_grouped_scalar(type)) return grouped(w_row, a, k);
    // Legacy blocks one chunk of eight at a time, so no buffer grows with the row.
    const auto* w = static_cast<const uint8_t*>(w_row);
    float r = 0.0f;
    for (int64_t i = 0; 256 * i < k; ++i) {
        const int64_t n = k - 256 * i < 256 ? k - 256 * i : 256;
        float t[8];
        terms(w + i * 8 * int64_t(info->block_bytes), a + 8 * i, n, t);
        float c = t[0];
        for (int64_t b = 1; b < n / 32; ++b) c = c + t[b];
        r = r + c;
    }
    return r;
}

int64_t act_tokens_stride(int64_t k) { return (k / QK8A + 7) / 8 * 8; }

void pack_act_tokens(const block_q8a* q, int64_t n_tokens, int64_t k, int8_t* qs, float* d, int32_t* sum) {
    const int64_t nb = k / QK8A, stride = act_tokens_stride(k);
    for (int64_t t = 0; t < n_tokens; ++t) {
        const block_q8a* row = q + t * nb;
        int8_t* out = qs + t * 32 * stride;
        for (int64_t b = 0; b < stride; ++b) {
            int8_t* group = out + 256 * (b / 8) + 4 * (b % 8);
            if (b < nb) {
                d[t * stride + b] = row[b].d;
                sum[t * stride + b] = row[b].sum;
                for (int s = 0; s < 8; ++s) std::memcpy(group + 32 * s, row[b].qs + 4 * s, 4);
            } else {
                d[t * stride + b] = 0.0f;
                sum[t * stride + b] = 0;
                for (int s = 0; s < 8; ++s) std::memset(group + 32 * s, 0, 4);
            }
        }
    }
}

}  // namespace tern::quant
