// What the two attention implementations share: the split partials, the
// cache addressing, and the tensor-core kernel's entry point (attention.cu
// picks the implementation per head shape; attention_mma.cu holds the
// tensor-core one).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"
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

// Segments: the one arithmetic every attention kernel runs, whatever the
// batch. A (token, head)'s positions 0..pos (first..pos in a sliding-window
// layer: segments wholly before first are skipped) are cut into segments of seg_len
// positions (a multiple of 32 that depends on the cache's length alone); each
// segment's online softmax starts afresh, giving (m, l, acc), and segments
// are merged in order into (M, L, A), starting from (-inf, 0, 0):
//   M' = max(M, m), a = exp(M - M'), b = exp(m - M'),
//   L = L a + l b, A = A a + acc b   (each product and sum rounded alone),
// skipping a segment with no position (m = -inf). One segment merges to
// itself bit for bit (a = 0, b = 1). Whether the segments of a token run in
// separate CTAs and a combine kernel (split) or one after another in one CTA
// (direct) then never changes a bit: the batch only picks the launch.
struct MergeWeights {
    float total_w, seg_w, m;
};
__device__ __forceinline__ MergeWeights merge_weights(float total_m, float seg_m) {
    const float m = fmaxf(total_m, seg_m);
    return {expf(__fsub_rn(total_m, m)), expf(__fsub_rn(seg_m, m)), m};
}
// Branch-free: rows of one warp merge side by side (skipping the product by
// an exact 1 would change no bit, but divergent rows would run both paths).
__device__ __forceinline__ float merge_value(float total, float seg, const MergeWeights& w) {
    return __fadd_rn(__fmul_rn(total, w.total_w), __fmul_rn(seg, w.seg_w));
}

__device__ __forceinline__ bool in_cache(const KvLayer& kv, int32_t slot, int32_t pos) {
    return slot >= 0 && slot < kv.n_slots && pos >= 0 && pos < kv.n_ctx;
}

// One slot's K or V rows of one KV head, through its page table. Chunks of
// 32 positions start at multiples of 32 and pages hold a multiple of 32
// positions, so a chunk's rows lie in one page, `stride` halves apart.
struct SlotRows {
    const uint16_t* cache;  // the layer's pool, offset to the KV head's dims
    const int32_t* pages;   // the slot's page table
    int page_size;
    int64_t stride;         // halves between rows: n_kv_heads * head_dim
    // Row p0 (a multiple of 32) of the slot; the chunk's others follow it.
    __device__ __forceinline__ const uint16_t* chunk(int p0) const {
        // The host refuses batches that reach unmapped pages; a -1 read as
        // page 0 keeps a bug inside the pool.
        const int32_t page = max(pages[p0 / page_size], 0);
        return cache + (int64_t(page) * page_size + p0 % page_size) * stride;
    }
};
static_assert(backend::kKvPageSize % 32 == 0, "a 32-position chunk must lie in one page");

__device__ __forceinline__ SlotRows slot_rows(const uint16_t* cache, const KvLayer& kv, int32_t slot, int kvh) {
    const int64_t stride = int64_t(kv.n_kv_heads) * kv.head_dim;
    return {cache + int64_t(kvh) * kv.head_dim, kv.pages + int64_t(slot) * kv.pages_per_slot, kv.page_size, stride};
}

// Whether the tensor-core kernel takes this shape: head dims 32, 64, 96 and
// 128, at most kMmaMaxGroup query heads per KV head. The choice depends on the
// model's shape (and, in attention(), on the layer's window) alone, so prefill
// and decode always run the same arithmetic.
constexpr int kMmaMaxGroup = 128;
bool mma_takes(int group, int head_dim);

// The tensor-core attention (attention_mma.cu). tile_tokens consecutive tokens
// per CTA (1 when splitting), or the tiles of tile_start (n_tiles + 1 entries
// on the device, each tile at most tile_tokens) where it is set; seg_len
// positions per segment. part.acc set: one segment per CTA (grid y), partials
// written for the combine; else every segment in turn, merged in the kernel.
// few_units: attention_few_units() of the batch (ops.h).
void attention_mma(const KvLayer& kv, const float* q, int64_t n_tokens, int n_heads, float scale,
                   const int32_t* slot, const int32_t* pos, float* out, Partials part, int seg_len,
                   int tile_tokens, const int32_t* tile_start, int64_t n_tiles, bool few_units,
                   cudaStream_t stream);

}  // namespace tern::cuda::attn
