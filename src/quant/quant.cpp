// Dispatch from TensorType to the typed reference functions (reference.h),
// with the checks the row API promises: supported type, whole blocks. Block
// data from a file may sit at any byte offset, so misaligned pointers are
// served through an aligned copy of one block at a time.
#include "quant/quant.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "base/fp16.h"
#include "quant/reference.h"

namespace tern::quant {
namespace {

using DequantizeFn = void (*)(const void* src, float* dst, int64_t nblocks);
using QuantizeFn = void (*)(const float* src, void* dst, int64_t nblocks);

struct Format {
    TensorType type;
    int block_elems;
    int block_bytes;
    DequantizeFn dequantize;
    QuantizeFn quantize;
};

bool aligned_for(const void* p, size_t alignment) {
    return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

template <class Block, int QK, void (*Deq)(const Block*, float*, int64_t)>
void dequantize_blocks(const void* src, float* dst, int64_t nb) {
    if (aligned_for(src, alignof(Block))) {
        Deq(static_cast<const Block*>(src), dst, nb);
        return;
    }
    const auto* bytes = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < nb; ++i) {
        Block b;
        std::memcpy(&b, bytes + i * int64_t(sizeof(Block)), sizeof(Block));
        Deq(&b, dst + i * QK, 1);
    }
}

template <class Block, int QK, void (*Quant)(const float*, Block*, int64_t)>
void quantize_blocks(const float* src, void* dst, int64_t nb) {
    if (aligned_for(dst, alignof(Block))) {
        Quant(src, static_cast<Block*>(dst), nb);
        return;
    }
    auto* bytes = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < nb; ++i) {
        Block b;
        Quant(src + i * QK, &b, 1);
        std::memcpy(bytes + i * int64_t(sizeof(Block)), &b, sizeof(Block));
    }
}

// Plain element types: element-wise conversion, unaligned-safe via memcpy.
void dequantize_f32(const void* src, float* dst, int64_t n) {
    std::memcpy(dst, src, size_t(n) * sizeof(float));
}
void quantize_f32(const float* src, void* dst, int64_t n) {
    std::memcpy(dst, src, size_t(n) * sizeof(float));
}

template <float (*ToF32)(uint16_t)>
void dequantize_half(const void* src, float* dst, int64_t n) {
    const auto* bytes = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        dst[i] = ToF32(h);
    }
}

template <uint16_t (*FromF32)(float)>
void quantize_half(const float* src, void* dst, int64_t n) {
    auto* bytes = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = FromF32(src[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
    }
}

template <class Block, int QK, void (*Deq)(const Block*, float*, int64_t),
          void (*Quant)(const float*, Block*, int64_t)>
constexpr Format block_format(TensorType type) {
    return {type, QK, int(sizeof(Block)), &dequantize_blocks<Block, QK, Deq>,
            &quantize_blocks<Block, QK, Quant>};
}

const Format kFormats[] = {
    {TensorType::F32, 1, 4, &dequantize_f32, &quantize_f32},
    {TensorType::F16, 1, 2, &dequantize_half<&fp16_to_fp32>, &quantize_half<&fp32_to_fp16>},
    {TensorType::BF16, 1, 2, &dequantize_half<&bf16_to_fp32>, &quantize_half<&fp32_to_bf16>},
    block_format<block_q4_0, QK4_0, ref::dequantize_q4_0, ref::quantize_q4_0>(TensorType::Q4_0),
    block_format<block_q4_1, QK4_1, ref::dequantize_q4_1, ref::quantize_q4_1>(TensorType::Q4_1),
    block_format<block_q5_0, QK5_0, ref::dequantize_q5_0, ref::quantize_q5_0>(TensorType::Q5_0),
    block_format<block_q5_1, QK5_1, ref::dequantize_q5_1, ref::quantize_q5_1>(TensorType::Q5_1),
    block_format<block_q8_0, QK8_0, ref::dequantize_q8_0, ref::quantize_q8_0>(TensorType::Q8_0),
    block_format<block_q8_1, QK8_1, ref::dequantize_q8_1, ref::quantize_q8_1>(TensorType::Q8_1),
    block_format<block_q2_K, QK_K, ref::dequantize_q2_K, ref::quantize_q2_K>(TensorType::Q2_K),
    block_format<block_q3_K, QK_K, ref::dequantize_q3_K, ref::quantize_q3_K>(TensorType::Q3_K),
    block_format<block_q4_K, QK_K, ref::dequantize_q4_K, ref::quantize_q4_K>(TensorType::Q4_K),
    block_format<block_q5_K, QK_K, ref::dequantize_q5_K, ref::quantize_q5_K>(TensorType::Q5_K),
    block_format<block_q6_K, QK_K, ref::dequantize_q6_K, ref::quantize_q6_K>(TensorType::Q6_K),
    block_format<block_q8_K, QK_K, ref::dequantize_q8_K, ref::quantize_q8_K>(TensorType::Q8_K),
};

const Format* find_format(TensorType type) {
    for (const Format& f : kFormats)
        if (f.type == type) return &f;
    return nullptr;
}

// The format for a row of n elements, or an error naming what is wrong.
Status check_row(TensorType type, int64_t n, const Format** out) {
    const Format* f = find_format(type);
    const std::string name = tensor_type_name(uint32_t(type));
    if (!f) return Error{"unsupported tensor type " + name};
    if (n < 0 || n % f->block_elems != 0) {
        return Error{"row of " + std::to_string(n) + " elements is not a whole number of " + name +
                     " blocks of " + std::to_string(f->block_elems)};
    }
    *out = f;
    return {};
}

}  // namespace

size_t row_bytes(TensorType type, int64_t n) {
    const Format* f = find_format(type);
    if (!f || n < 0 || n % f->block_elems != 0) return 0;
    return size_t(n / f->block_elems) * size_t(f->block_bytes);
}

Status dequantize_row(TensorType type, const void* src, float* dst, int64_t n) {
    const Format* f = nullptr;
    if (Status s = check_row(type, n, &f); !s) return s;
    f->dequantize(src, dst, n / f->block_elems);
    return {};
}

Status quantize_row(TensorType type, const float* src, void* dst, int64_t n) {
    const Format* f = nullptr;
    if (Status s = check_row(type, n, &f); !s) return s;
    f->quantize(src, dst, n / f->block_elems);
    return {};
}

Status dequantize_rows(TensorType type, const void* src, float* dst, int64_t n_rows,
                       int64_t n_per_row) {
    const Format* f = nullptr;
    if (Status s = check_row(type, n_per_row, &f); !s) return s;
    if (n_rows < 0) return Error{"negative row count " + std::to_string(n_rows)};
    const size_t stride = row_bytes(type, n_per_row);
    const auto* bytes = static_cast<const uint8_t*>(src);
    for (int64_t r = 0; r < n_rows; ++r) {
        f->dequantize(bytes + size_t(r) * stride, dst + r * n_per_row, n_per_row / f->block_elems);
    }
    return {};
}

Status quantize_rows(TensorType type, const float* src, void* dst, int64_t n_rows,
                     int64_t n_per_row) {
    const Format* f = nullptr;
    if (Status s = check_row(type, n_per_row, &f); !s) return s;
    if (n_rows < 0) return Error{"negative row count " + std::to_string(n_rows)};
    const size_t stride = row_bytes(type, n_per_row);
    auto* bytes = static_cast<uint8_t*>(dst);
    for (int64_t r = 0; r < n_rows; ++r) {
        f->quantize(src + r * n_per_row, bytes + size_t(r) * stride, n_per_row / f->block_elems);
    }
    return {};
}

}  // namespace tern::quant
