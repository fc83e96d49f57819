// What the two attention implementations share: the split partials, the
// cache addressing, and the tensor-core kernel's entry point (attention.cu
// picks the implementation per head shape; attention_mma.cu holds the
// tensor-core one).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops.h"

namespace tern::cuda::attn {

// Split partials of row r = (token * n_heads + head) and segment i, at index
// r * n_seg + i: m and l one float each, acc head_dim floats. acc == null:
// no split, the kernel writes the normalised output.
struct Partials {
    float* acc = nullptr;
    float* m = nullptr;
    float* l = nullptr;
    int n_seg = 0;
};

__device__ __forceinline__ bool in_cache(const KvLayer& kv, int32_t slot, int32_t pos) {
    return slot >= 0 && slot < kv.n_slots && pos >= 0 && pos < kv.n_ctx;
}

// K or V row 0 of (slot, kv head); rows follow every n_kv_heads * head_dim halves.
__device__ __forceinline__ const uint16_t* slot_rows(const uint16_t* cache, const KvLayer& kv, int32_t slot, int kvh) {
    const int64_t stride = int64_t(kv.n_kv_heads) * kv.head_dim;
    return cache + int64_t(slot) * kv.n_ctx * stride + int64_t(kvh) * kv.head_dim;
}

// Whether the tensor-core kernel takes this shape: head dims 32, 64, 96 and
// 128, at most kMmaMaxGroup query heads per KV head. The choice depends on the
// model's shape alone, so prefill and decode always run the same arithmetic.
constexpr int kMmaMaxGroup = 128;
bool mma_takes(int group, int head_dim);

// The tensor-core attention (attention_mma.cu). tile_tokens consecutive tokens
// per CTA (1 when splitting); seg_len positions per segment (grid y) when
// part.acc is set, else the whole context.
void attention_mma(const KvLayer& kv, const float* q, int64_t n_tokens, int n_heads, float scale,
                   const int32_t* slot, const int32_t* pos, float* out, Partials part, int seg_len,
                   int tile_tokens, cudaStream_t stream);

}  // namespace tern::cuda::attn
