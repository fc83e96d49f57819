// Attention over the f16 KV cache (ops.h), with the online softmax of the CPU
// twin (cpu::attention_kv_group): a running max m, denominator l and numerator
// acc per (token, query head), positions taken in increasing order.
//
// Work split: one warp per (token, query head). A CTA holds the warps of up to
// kMaxWarps query heads that share one KV head, so each K/V row the first warp
// loads is found in L1 by the others. Positions go by chunks of 32: lane j
// scores position p0 + j (a whole q.k dot product; q sits in shared memory and
// is read as a broadcast), then the 32 probabilities are broadcast with
// __shfl_sync while each lane accumulates its own dims (lane, lane+32, ...) of V.
//
// Split-KV (decode): a single token has too few (token, head) warps to fill the
// GPU, so each token's context is cut into segments of kSegment positions,
// computed by separate CTAs (grid y) that write (m, l, acc) partials to the
// workspace; a second kernel combines them in segment order. The grid covers
// n_ctx positions because pos lives on the device (and the launch must not
// change inside a CUDA graph); CTAs of segments past pos[t] exit at once.
//
// Every sum runs in a fixed order and warp reductions are butterflies whose
// result is the same bits on every lane, so results are deterministic.
#include <cuda_fp16.h>

#include <cmath>

#include "backend/cuda/ops.h"

namespace tern::cuda {
namespace {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxDimsPerLane = kMaxHeadDim / kWarp;
constexpr int kMaxWarps = 8;    // query heads per CTA; larger GQA groups take several CTAs
constexpr int kSegment = 256;   // positions per split-KV segment

struct AttnShape {
    int n_heads = 0, n_kv_heads = 0, head_dim = 0;
    int group = 0;   // query heads per KV head
    int warps = 0;   // warps (query heads) per CTA: min(group, kMaxWarps)
    int chunks = 0;  // CTAs per (token, KV head): ceil(group / warps)
    float scale = 0.0f;
};

// Split partials of row r = (token * n_heads + head) and segment i, at index
// r * n_seg + i: m and l one float each, acc head_dim floats.
struct Partials {
    float* acc = nullptr;
    float* m = nullptr;
    float* l = nullptr;
    int n_seg = 0;
};

__device__ float warp_max(float v) {
    for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
    return v;
}

// Butterfly sum: a + b == b + a, so every lane ends with the same bits.
__device__ float warp_sum(float v) {
    for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(kFullMask, v, o);
    return v;
}

__device__ float half_bits_to_float(unsigned bits) { return __half2float(__ushort_as_half((unsigned short)bits)); }

// q . k over head_dim (a multiple of 8) in element order; k is a 16-byte
// aligned row of f16 in global memory, q 16-byte aligned in shared memory.
__device__ float dot_q_k(const float* q, const uint16_t* k, int head_dim) {
    float dot = 0.0f;
    for (int i = 0; i < head_dim; i += 8) {
        const uint4 kk = __ldg(reinterpret_cast<const uint4*>(k + i));
        const float4 qa = *reinterpret_cast<const float4*>(q + i);
        const float4 qb = *reinterpret_cast<const float4*>(q + i + 4);
        // Little-endian: the lower-addressed half is the low 16 bits of a word.
        dot = fmaf(qa.x, half_bits_to_float(kk.x & 0xffffu), dot);
        dot = fmaf(qa.y, half_bits_to_float(kk.x >> 16), dot);
        dot = fmaf(qa.z, half_bits_to_float(kk.y & 0xffffu), dot);
        dot = fmaf(qa.w, half_bits_to_float(kk.y >> 16), dot);
        dot = fmaf(qb.x, half_bits_to_float(kk.z & 0xffffu), dot);
        dot = fmaf(qb.y, half_bits_to_float(kk.z >> 16), dot);
        dot = fmaf(qb.z, half_bits_to_float(kk.w & 0xffffu), dot);
        dot = fmaf(qb.w, half_bits_to_float(kk.w >> 16), dot);
    }
    return dot;
}

__device__ bool in_cache(const KvLayer& kv, int32_t slot, int32_t pos) {
    return slot >= 0 && slot < kv.n_slots && pos >= 0 && pos < kv.n_ctx;
}

// Grid: x = (token * n_kv_heads + kv_head) * chunks + chunk, y = segment.
// Block: sh.warps warps. part.acc == null: one segment spanning the whole
// context, output written to out; otherwise segments of seg_len positions,
// partials written to part.
__global__ void __launch_bounds__(kMaxWarps * kWarp)
    attention_kernel(KvLayer kv, const float* q, AttnShape sh, const int32_t* slot, const int32_t* pos, float* out,
                     Partials part, int seg_len) {
    __shared__ __align__(16) float q_smem[kMaxWarps][kMaxHeadDim];
    const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
    const int64_t cta = blockIdx.x;
    const int chunk = int(cta % sh.chunks);
    const int kvh = int(cta / sh.chunks % sh.n_kv_heads);
    const int64_t t = cta / sh.chunks / sh.n_kv_heads;
    const int g = chunk * sh.warps + warp;  // query head within the group
    // A warp past the group's end (last chunk) has no head. No CTA-wide barrier
    // follows, so returning is safe; every return below is warp-uniform.
    if (g >= sh.group) return;

    const int hd = sh.head_dim;
    const int64_t row = t * sh.n_heads + int64_t(kvh) * sh.group + g;  // (token, head) row of q and out
    const int32_t s = slot[t], last = pos[t];
    if (!in_cache(kv, s, last)) {
        // A NaN row makes the caller's bug visible; in split mode the combine writes it.
        if (part.acc == nullptr)
            for (int d = lane; d < hd; d += kWarp) out[row * hd + d] = NAN;
        return;
    }
    const int begin = int(blockIdx.y) * seg_len;
    if (begin > last) return;  // segment past this token's context: the combine does not read it
    const int end = min(last + 1, begin + seg_len);  // begin + seg_len <= n_seg * seg_len: no overflow

    float* qs = q_smem[warp];
    for (int d = lane; d < hd; d += kWarp) qs[d] = q[row * hd + d];
    __syncwarp();

    // K and V rows of position p: base + p * stride (layout [slot][pos][kv_head][head_dim]).
    const int64_t stride = int64_t(kv.n_kv_heads) * hd;
    const uint16_t* k_rows = kv.k + int64_t(s) * kv.n_ctx * stride + int64_t(kvh) * hd;
    const uint16_t* v_rows = kv.v + int64_t(s) * kv.n_ctx * stride + int64_t(kvh) * hd;
    const int dims = hd / kWarp;  // dims per lane: lane, lane + 32, ...

    float m = -INFINITY, l = 0.0f;
    float acc[kMaxDimsPerLane];
#pragma unroll
    for (int k = 0; k < kMaxDimsPerLane; ++k) acc[k] = 0.0f;

    for (int p0 = begin; p0 < end; p0 += kWarp) {
        const int n_valid = min(kWarp, end - p0);  // warp-uniform
        float score = -INFINITY;
        if (lane < n_valid) score = dot_q_k(qs, k_rows + int64_t(p0 + lane) * stride, hd) * sh.scale;
        const float m_new = fmaxf(m, warp_max(score));
        const float correction = expf(m - m_new);  // exp(-inf) = 0 on the first chunk
        const float w = lane < n_valid ? expf(score - m_new) : 0.0f;
        l = l * correction + warp_sum(w);
#pragma unroll
        for (int k = 0; k < kMaxDimsPerLane; ++k) acc[k] *= correction;
        for (int j = 0; j < n_valid; ++j) {
            const float wj = __shfl_sync(kFullMask, w, j);
            const uint16_t* vr = v_rows + int64_t(p0 + j) * stride;
#pragma unroll
            for (int k = 0; k < kMaxDimsPerLane; ++k)
                if (k < dims) acc[k] = fmaf(wj, half_bits_to_float(__ldg(vr + lane + k * kWarp)), acc[k]);
        }
        m = m_new;
    }

    if (part.acc == nullptr) {
        const float inv = l > 0.0f ? __fdiv_rn(1.0f, l) : 0.0f;
#pragma unroll
        for (int k = 0; k < kMaxDimsPerLane; ++k)
            if (k < dims) out[row * hd + lane + k * kWarp] = acc[k] * inv;
    } else {
        const int64_t r = row * part.n_seg + blockIdx.y;
#pragma unroll
        for (int k = 0; k < kMaxDimsPerLane; ++k)
            if (k < dims) part.acc[r * hd + lane + k * kWarp] = acc[k];
        if (lane == 0) {
            part.m[r] = m;
            part.l[r] = l;
        }
    }
}

// One CTA of head_dim threads per (token, head) row; thread d combines dim d
// of the segments 0..pos/seg_len in order. Every thread computes the same
// max and denominator from the same values, so they agree bit for bit.
__global__ void attention_combine_kernel(KvLayer kv, int n_heads, int head_dim, const int32_t* slot,
                                         const int32_t* pos, Partials part, int seg_len, float* out) {
    const int64_t row = blockIdx.x;
    const int64_t t = row / n_heads;
    const int d = int(threadIdx.x);
    const int32_t s = slot[t], last = pos[t];
    if (!in_cache(kv, s, last)) {
        out[row * head_dim + d] = NAN;
        return;
    }
    const int n_seg = last / seg_len + 1;  // <= part.n_seg since last < n_ctx
    const int64_t r0 = row * part.n_seg;
    float m = -INFINITY;
    for (int i = 0; i < n_seg; ++i) m = fmaxf(m, part.m[r0 + i]);
    float l = 0.0f, a = 0.0f;
    for (int i = 0; i < n_seg; ++i) {
        const float w = expf(part.m[r0 + i] - m);
        l += part.l[r0 + i] * w;
        a += part.acc[(r0 + i) * head_dim + d] * w;
    }
    const float inv = l > 0.0f ? __fdiv_rn(1.0f, l) : 0.0f;
    out[row * head_dim + d] = a * inv;
}

int current_sm_count() {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    return sms;
}

int segments(int n_ctx) { return (n_ctx + kSegment - 1) / kSegment; }

// Largest batch that splits: fewer (token, head) warps than twice the SMs,
// and a context longer than one segment.
int64_t max_split_tokens(int n_heads, int n_ctx) {
    if (n_heads <= 0 || n_ctx <= kSegment) return 0;
    const int64_t sms = current_sm_count();
    if (sms <= 0) return 0;
    return (2 * sms - 1) / n_heads;
}

}  // namespace

bool attention_supported(int n_heads, int n_kv_heads, int head_dim) {
    return n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && head_dim > 0 && head_dim % kWarp == 0 &&
           head_dim <= kMaxHeadDim;
}

bool attention_splits(int64_t n_tokens, int n_heads, int n_ctx) {
    return n_tokens >= 1 && n_tokens <= max_split_tokens(n_heads, n_ctx);
}

size_t attention_workspace_bytes(int64_t n_tokens, int n_heads, int head_dim, int n_ctx) {
    const int64_t max_tokens = max_split_tokens(n_heads, n_ctx);
    const int64_t tokens = n_tokens < max_tokens ? n_tokens : max_tokens;
    if (tokens <= 0 || head_dim <= 0) return 0;
    // acc, then m, then l (see Partials).
    return size_t(tokens) * size_t(n_heads) * size_t(segments(n_ctx)) * (size_t(head_dim) + 2) * sizeof(float);
}

void attention(const KvLayer& kv, const float* q, int64_t n_tokens, int n_heads, float scale, const int32_t* slot,
               const int32_t* pos, float* out, float* workspace, cudaStream_t stream) {
    if (n_tokens <= 0 || kv.n_ctx <= 0 || !attention_supported(n_heads, kv.n_kv_heads, kv.head_dim)) return;
    AttnShape sh;
    sh.n_heads = n_heads;
    sh.n_kv_heads = kv.n_kv_heads;
    sh.head_dim = kv.head_dim;
    sh.group = n_heads / kv.n_kv_heads;
    sh.warps = sh.group < kMaxWarps ? sh.group : kMaxWarps;
    sh.chunks = (sh.group + sh.warps - 1) / sh.warps;
    sh.scale = scale;
    const unsigned ctas = unsigned(n_tokens * kv.n_kv_heads * sh.chunks);
    const unsigned threads = unsigned(sh.warps * kWarp);

    if (workspace != nullptr && attention_splits(n_tokens, n_heads, kv.n_ctx)) {
        Partials part;
        part.n_seg = segments(kv.n_ctx);
        const size_t rows = size_t(n_tokens) * size_t(n_heads) * size_t(part.n_seg);
        part.acc = workspace;
        part.m = part.acc + rows * size_t(kv.head_dim);
        part.l = part.m + rows;
        attention_kernel<<<dim3(ctas, unsigned(part.n_seg)), threads, 0, stream>>>(kv, q, sh, slot, pos, out, part,
                                                                                   kSegment);
        attention_combine_kernel<<<unsigned(n_tokens * n_heads), unsigned(kv.head_dim), 0, stream>>>(
            kv, n_heads, kv.head_dim, slot, pos, part, kSegment, out);
    } else {
        attention_kernel<<<dim3(ctas, 1), threads, 0, stream>>>(kv, q, sh, slot, pos, out, Partials{}, kv.n_ctx);
    }
}

}  // namespace tern::cuda
