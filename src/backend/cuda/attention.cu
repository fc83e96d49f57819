// Attention over the f16 KV cache (ops.h), with the online softmax of the CPU
// twin (cpu::attention_kv_group): a running max m, denominator l and numerator
// acc per (token, query head), positions taken in chunks of 32 in increasing
// order.
//
// Head dims 32..128 run on the tensor cores (attention_mma.cu); this file
// holds the CUDA-core kernels for the wider heads (and for every shape under
// TERN_ATTN_MMA=0), the split combine, and the dispatch.
//
// One warp computes one (token, query head). Lane l owns the D = head_dim / 32
// contiguous dims l*D .. l*D+D-1 of q, of every K and V row and of acc, so a
// K or V row is read by the whole warp with one coalesced (vector) load.
// For a chunk of 32 positions each lane forms the partial dots of its dims
// with all 32 K rows; a transpose reduction over the warp (16+8+4+2+1 shuffle
// steps, each lane keeping one half and handing the other to its partner)
// leaves the full dot of position p on lane p. The 32 probabilities are then
// broadcast with __shfl_sync while each lane accumulates its dims of V.
//
// Two kernels feed that same chunk computation:
//  - decode: a CTA holds the warps of up to kMaxWarps query heads that share
//    one KV head (K/V rows found in L1 by all but the first) and reads K/V
//    straight from global memory. Split-KV: a few tokens have too few warps to
//    fill the GPU, so each token's context is cut into segments computed by
//    separate CTAs (grid y) that write (m, l, acc) partials to the workspace;
//    a second kernel combines them in segment order. The grid covers n_ctx
//    positions because pos lives on the device (and the launch must not change
//    inside a CUDA graph); CTAs of segments past pos[t] (or before a sliding window) exit at once.
//  - prefill (several tokens, no split): a CTA takes a tile of consecutive
//    tokens times the query heads of one KV head, each warp one head for T
//    consecutive tokens (T = 4, 2 for head dims over 128), so every K and V
//    row a lane reads from shared memory serves T tokens (one token per warp
//    was bound by shared-memory bandwidth). When every token of the tile that
//    lies in the cache uses the same slot (the usual prefill), each chunk of K
//    and then of V rows is staged once into shared memory, converted to f32,
//    and serves every warp of the tile. A tile mixing slots (the device
//    decides, since slot and pos are device arrays) has each warp read its own
//    rows from global memory, token by token, as the decode kernel does.
// Both kernels run the identical arithmetic per (token, head, chunk), and
// every kernel takes a token's positions in the segments of
// attention_internal.cuh (separate CTAs when splitting, else one after
// another, merged in the kernel as the combine merges them), so neither the
// choice of kernel nor the split changes a bit of the result: a token gets
// the same bits alone, among 64 others, in a prefill or in a decode step.
//
// Every sum runs in a fixed order and warp reductions are butterflies whose
// result is the same bits on every lane (or transpose reductions whose result
// lives on one lane), so results are deterministic.
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>

#include "backend/cuda/attention_internal.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.h"

namespace tern::cuda {
namespace {

using attn::in_cache;
using attn::merge_value;
using attn::merge_weights;
using attn::MergeWeights;
using attn::Partials;
using attn::slot_rows;
using attn::SlotRows;

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxHeadDim = 256;
constexpr int kChunk = kWarp;        // positions scored together: one per lane
constexpr int kMaxWarps = 8;         // query heads per CTA; larger GQA groups take several CTAs
constexpr int kPrefillWarps = 16;    // warps of a prefill CTA: tile tokens x query heads
// Positions per segment at most context lengths. Every token's arithmetic
// depends on it (attention_internal.cuh): 64 made a long prefill merge too
// often (pp2048 -1.4%), 256 gave a decode token too few CTAs (LOG g27).
constexpr int kMinSegment = 128;
constexpr int kMaxSegments = 256;    // longer contexts grow the segment instead (bounded workspace)

struct AttnShape {
    int n_heads = 0, n_kv_heads = 0, head_dim = 0;
    int group = 0;    // query heads per KV head
    int warps = 0;    // query heads per CTA: min(group, kMaxWarps)
    int chunks = 0;   // CTAs per (token or tile, KV head): ceil(group / warps)
    int seg_len = 0;  // positions per segment (segment_length of the cache)
    int window = 0;   // sliding window: the last `window` positions (0: all)
    float scale = 0.0f;
};

// A token's first position in its context: 0, or the window's start. Chunks
// and segments stay aligned to absolute positions, so a token whose window
// begins inside a chunk masks that chunk's lanes below it, and chunks and
// segments wholly before it are skipped; every kernel does the same.
__device__ __forceinline__ int context_first(int last, int window) {
    return window > 0 ? max(0, last - window + 1) : 0;
}

__device__ float warp_max(float v) {
    for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
    return v;
}

// Butterfly sum: a + b == b + a, so every lane ends with the same bits.
__device__ float warp_sum(float v) {
    for (int o = kWarp / 2; o > 0; o /= 2) v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, o));
    return v;
}

// part[j] on each lane is that lane's share of the value of item j; returns
// on lane p the sum over all lanes of item p. At step w each lane keeps the
// half of its items whose bit w matches its lane's and sends the other half
// to lane ^ w, which keeps exactly those: 31 shuffles, a fixed order.
template <int W>
__device__ void transpose_step(float (&part)[kWarp], int lane) {
    const bool upper = (lane & W) != 0;
#pragma unroll
    for (int i = 0; i < W; ++i) {
        const float send = upper ? part[i] : part[i + W];
        const float keep = upper ? part[i + W] : part[i];
        part[i] = __fadd_rn(keep, __shfl_xor_sync(kFullMask, send, W));
    }
}
__device__ float transpose_sum(float (&part)[kWarp], int lane) {
    // Steps spelled out so every index is a constant: part stays in registers.
    transpose_step<16>(part, lane);
    transpose_step<8>(part, lane);
    transpose_step<4>(part, lane);
    transpose_step<2>(part, lane);
    transpose_step<1>(part, lane);
    return part[0];
}

__device__ float half_bits_to_float(unsigned bits) { return __half2float(__ushort_as_half((unsigned short)bits)); }

// Little-endian: the lower-addressed half is the low 16 bits of a word.
__device__ void unpack_halves(unsigned word, float* x) {
    x[0] = half_bits_to_float(word & 0xffffu);
    x[1] = half_bits_to_float(word >> 16);
}

// D f16 values at p (aligned to 2*D bytes' largest power-of-two factor, up to
// 16) as floats, with the widest loads that alignment allows.
template <int D>
__device__ void load_halves(const uint16_t* p, float (&x)[D]) {
    if constexpr (D % 8 == 0) {
#pragma unroll
        for (int c = 0; c < D / 8; ++c) {
            const uint4 w = __ldg(reinterpret_cast<const uint4*>(p) + c);
            unpack_halves(w.x, x + 8 * c);
            unpack_halves(w.y, x + 8 * c + 2);
            unpack_halves(w.z, x + 8 * c + 4);
            unpack_halves(w.w, x + 8 * c + 6);
        }
    } else if constexpr (D % 4 == 0) {
        const uint2 w = __ldg(reinterpret_cast<const uint2*>(p));
        unpack_halves(w.x, x);
        unpack_halves(w.y, x + 2);
    } else if constexpr (D % 2 == 0) {
#pragma unroll
        for (int c = 0; c < D / 2; ++c) unpack_halves(__ldg(reinterpret_cast<const unsigned*>(p) + c), x + 2 * c);
    } else {
#pragma unroll
        for (int c = 0; c < D; ++c) x[c] = half_bits_to_float(__ldg(p + c));
    }
}

// D floats of shared memory at p (aligned like load_halves' p, in floats).
template <int D>
__device__ void load_floats(const float* p, float (&x)[D]) {
    if constexpr (D % 4 == 0) {
#pragma unroll
        for (int c = 0; c < D / 4; ++c) {
            const float4 f = reinterpret_cast<const float4*>(p)[c];
            x[4 * c] = f.x;
            x[4 * c + 1] = f.y;
            x[4 * c + 2] = f.z;
            x[4 * c + 3] = f.w;
        }
    } else if constexpr (D % 2 == 0) {
#pragma unroll
        for (int c = 0; c < D / 2; ++c) {
            const float2 f = reinterpret_cast<const float2*>(p)[c];
            x[2 * c] = f.x;
            x[2 * c + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int c = 0; c < D; ++c) x[c] = p[c];
    }
}

// Rows j = 0..31 of a chunk, this lane's D dims: f16 in global memory, or f32
// staged in shared memory. Both give the same floats (f16 -> f32 is exact).
struct GlobalRows {
    const uint16_t* base;  // row 0 of the chunk
    int64_t stride;        // halves between rows
    template <int D>
    __device__ void load(int j, int lane, float (&x)[D]) const {
        load_halves<D>(base + j * stride + lane * D, x);
    }
};
struct SmemRows {
    const float* base;  // row 0 of the chunk
    int stride;         // floats between rows (head_dim)
    template <int D>
    __device__ void load(int j, int lane, float (&x)[D]) const {
        load_floats<D>(base + j * stride + lane * D, x);
    }
};

// Online-softmax state of one (token, head); acc holds this lane's dims.
template <int D>
struct Softmax {
    float m = -INFINITY, l = 0.0f;
    float acc[D];
    __device__ Softmax() {
#pragma unroll
        for (int k = 0; k < D; ++k) acc[k] = 0.0f;
    }
};

// Folds the chunk's dots (position p's on lane p) into m and l and rescales
// acc. Lanes lo..n_valid-1 hold positions of the context (lo < n_valid).
// Returns this lane's unnormalised probability (0 outside them).
template <int D>
__device__ float fold_scores(float dot, int lo, int n_valid, float scale, int lane, Softmax<D>& st) {
    // Rounded operations spelled out: nvcc contracts a * b + c into an fma
    // where it sees fit, which could differ between the kernels that inline this.
    const bool valid = lane >= lo && lane < n_valid;
    const float score = valid ? __fmul_rn(dot, scale) : -INFINITY;
    const float m_new = fmaxf(st.m, warp_max(score));
    const float correction = expf(__fsub_rn(st.m, m_new));  // exp(-inf) = 0 on the first chunk
    const float w = valid ? expf(__fsub_rn(score, m_new)) : 0.0f;
    st.l = __fadd_rn(__fmul_rn(st.l, correction), warp_sum(w));
#pragma unroll
    for (int c = 0; c < D; ++c) st.acc[c] = __fmul_rn(st.acc[c], correction);
    st.m = m_new;
    return w;
}

// Lane j's share of the dots of q with a chunk's rows lo..n_valid-1 (0 <= lo
// < n_valid <= 32, warp-uniform), summed over the lanes: row j's score
// before scaling, on lane j (0 outside those rows).
template <int D, class Rows>
__device__ float chunk_dots(const float (&q)[D], const Rows& k_rows, int lo, int n_valid, int lane) {
    float part[kWarp];
#pragma unroll
    for (int j = 0; j < kWarp; ++j) {
        part[j] = 0.0f;
        if (j >= lo && j < n_valid) {
            float kk[D];
            k_rows.template load<D>(j, lane, kk);
            float dot = 0.0f;
#pragma unroll
            for (int c = 0; c < D; ++c) dot = fmaf(q[c], kk[c], dot);
            part[j] = dot;
        }
    }
    return transpose_sum(part, lane);
}

// First half of a chunk whose rows lo..n_valid-1 are positions of the
// context: scores them, folds them into m and l and rescales acc. Returns
// this lane's unnormalised probability (0 outside them).
template <int D, class Rows>
__device__ float score_chunk(const float (&q)[D], const Rows& k_rows, int lo, int n_valid, float scale, int lane,
                             Softmax<D>& st) {
    return fold_scores<D>(chunk_dots<D>(q, k_rows, lo, n_valid, lane), lo, n_valid, scale, lane, st);
}

// Second half: acc += w_j * V row j for j = lo..n_valid-1 in order.
template <int D, class Rows>
__device__ void accumulate_chunk(float w, const Rows& v_rows, int lo, int n_valid, int lane, Softmax<D>& st) {
#pragma unroll
    for (int j = 0; j < kWarp; ++j) {
        if (j >= lo && j < n_valid) {
            const float wj = __shfl_sync(kFullMask, w, j);
            float vv[D];
            v_rows.template load<D>(j, lane, vv);
#pragma unroll
            for (int c = 0; c < D; ++c) st.acc[c] = fmaf(wj, vv[c], st.acc[c]);
        }
    }
}

// Positions max(first, begin)..end-1 (begin a multiple of kChunk) read from
// global memory, in chunks aligned to begin.
template <int D>
__device__ void attend_global(const float (&q)[D], const SlotRows& k_rows, const SlotRows& v_rows, int first, int begin,
                              int end, float scale, int lane, Softmax<D>& st) {
    for (int p0 = begin; p0 < end; p0 += kChunk) {
        if (p0 + kChunk <= first) continue;  // wholly before the window
        const int lo = max(0, first - p0);
        const int n_valid = min(kChunk, end - p0);
        const float w = score_chunk<D>(q, GlobalRows{k_rows.chunk(p0), k_rows.stride}, lo, n_valid, scale, lane, st);
        accumulate_chunk<D>(w, GlobalRows{v_rows.chunk(p0), v_rows.stride}, lo, n_valid, lane, st);
    }
}

// Folds a finished segment's state into the merge of the earlier ones
// (attention_internal.cuh) and starts the segment state afresh.
template <int D>
__device__ void merge_segment(Softmax<D>& total, Softmax<D>& seg) {
    if (seg.m != -INFINITY) {
        const MergeWeights w = merge_weights(total.m, seg.m);
        total.l = merge_value(total.l, seg.l, w);
#pragma unroll
        for (int c = 0; c < D; ++c) total.acc[c] = merge_value(total.acc[c], seg.acc[c], w);
        total.m = w.m;
    }
    seg = Softmax<D>();
}

// Positions first..end-1 segment by segment (segments before first's skipped:
// they hold no position), merged into total.
template <int D>
__device__ void attend_segments(const float (&q)[D], const SlotRows& k_rows, const SlotRows& v_rows, int first,
                                int end, int seg_len, float scale, int lane, Softmax<D>& total) {
    for (int begin = first / seg_len * seg_len; begin < end; begin += seg_len) {
        Softmax<D> st;
        attend_global<D>(q, k_rows, v_rows, first, begin, min(end, begin + seg_len), scale, lane, st);
        merge_segment<D>(total, st);
    }
}

template <int D>
__device__ void write_output(const Softmax<D>& st, float* out_row, int lane) {
    const float inv = st.l > 0.0f ? __fdiv_rn(1.0f, st.l) : 0.0f;
#pragma unroll
    for (int c = 0; c < D; ++c) out_row[lane * D + c] = st.acc[c] * inv;
}

template <int D>
__device__ void load_q(const float* q_row, int lane, float (&q)[D]) {
#pragma unroll
    for (int c = 0; c < D; ++c) q[c] = q_row[lane * D + c];
}

// Decode (and split) kernel. Grid: x = (token * n_kv_heads + kv_head) * chunks
// + chunk, y = segment. Block: sh.warps warps. part.acc == null: every
// segment in turn, merged, output written to out; otherwise segment y of
// sh.seg_len positions, partials written to part.
template <int D>
__global__ void __launch_bounds__(kMaxWarps * kWarp, 2)
    attention_decode_kernel(KvLayer kv, const float* q, AttnShape sh, const int32_t* slot, const int32_t* pos,
                            float* out, Partials part) {
    after_prior_grids();
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
    const int first = context_first(last, sh.window);
    const SlotRows k_rows = slot_rows(kv.k, kv, s, kvh);
    const SlotRows v_rows = slot_rows(kv.v, kv, s, kvh);
    float qr[D];
    if (part.acc == nullptr) {
        load_q<D>(q + row * hd, lane, qr);
        Softmax<D> total;
        attend_segments<D>(qr, k_rows, v_rows, first, last + 1, sh.seg_len, sh.scale, lane, total);
        write_output<D>(total, out + row * hd, lane);
    } else {
        const int begin = int(blockIdx.y) * sh.seg_len;
        // A segment outside this token's context: the combine does not read it.
        if (begin > last || begin + sh.seg_len <= first) return;
        const int end = min(last + 1, begin + sh.seg_len);  // begin + seg_len <= n_seg * seg_len: no overflow
        load_q<D>(q + row * hd, lane, qr);
        Softmax<D> st;
        attend_global<D>(qr, k_rows, v_rows, first, begin, end, sh.scale, lane, st);
        const int64_t r = row * part.n_seg + blockIdx.y;
#pragma unroll
        for (int c = 0; c < D; ++c) part.acc[r * hd + lane * D + c] = st.acc[c];
        if (lane == 0) {
            part.m[r] = st.m;
            part.l[r] = st.l;
        }
    }
}

// Decode (and split) kernel for wide heads (head dims 128 and 256 on the
// CUDA cores), the same arithmetic with four warps per (token, head). One warp
// per head walks its chunks one after another, each a chain of loads, two
// reductions and the V rows; at short contexts (a segment or two) a decode
// layer waited on that chain for a dozen microseconds. Here the chunk's dots,
// which depend on nothing before them, are computed by the warps side by side,
// a chunk each, into shared memory; then every warp folds the chunks in order
// (the same max, weights and denominator, bit for bit, in every warp) and
// accumulates its quarter of the dims. Each dim's chain of products is the one
// the one-warp kernel forms, so every bit is the same.
// Grid: x = token * n_heads + head, y = segment (split) or 1. Block: kWideWarps warps.
// Early: the token's slot and position are read before the wait (launch.cuh),
// and one page-table entry near the warp's first chunk is prefetched into L1,
// so that the chain after the wait starts at the cache rows. A split CTA
// whose segment lies outside the context returns without waiting; that is
// sound because the CTA holding the token's last position always waits, so
// no grid of this kernel completes before the grids it follows.
constexpr int kWideWarps = 4;

template <int D, bool Early>
__global__ void __launch_bounds__(kWideWarps * kWarp)
    attention_decode_wide_kernel(KvLayer kv, const float* q, AttnShape sh, const int32_t* slot, const int32_t* pos,
                                 float* out, Partials part) {
    static_assert(D % kWideWarps == 0, "a warp takes a whole share of each lane's dims");
    constexpr int DW = D / kWideWarps;  // dims a lane accumulates
    __shared__ float dots[kWideWarps][kChunk];
    if constexpr (!Early) after_prior_grids();
    const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
    const int64_t row = blockIdx.x;  // (token, head) row of q and out
    const int64_t t = row / sh.n_heads;
    const int kvh = int(row % sh.n_heads) / sh.group;
    const int hd = sh.head_dim;
    const int32_t s = slot[t], last = pos[t];
    // Every return below is CTA-uniform and comes before the first barrier.
    if (!in_cache(kv, s, last)) {
        if constexpr (Early) after_prior_grids();  // before writing out
        if (part.acc == nullptr)
            for (int d = int(threadIdx.x); d < hd; d += int(blockDim.x)) out[row * hd + d] = NAN;
        return;
    }
    const int first = context_first(last, sh.window);
    int seg_begin = first / sh.seg_len * sh.seg_len, seg_stop = last + 1;  // the segments to walk
    if (part.acc != nullptr) {
        seg_begin = int(blockIdx.y) * sh.seg_len;
        if (seg_begin > last || seg_begin + sh.seg_len <= first) return;  // the combine does not read it
        seg_stop = min(last + 1, seg_begin + sh.seg_len);
    }
    const SlotRows k_rows = slot_rows(kv.k, kv, s, kvh);
    const SlotRows v_rows = slot_rows(kv.v, kv, s, kvh);
    if constexpr (Early) {
        // Into L1 for the loop's first read of it (K and V share the table).
        const int mine = max(seg_begin + warp * kChunk, first / kChunk * kChunk);
        if (mine < seg_stop) asm volatile("prefetch.global.L1 [%0];" ::"l"(k_rows.pages + mine / k_rows.page_size));
        after_prior_grids();
    }
    float qr[D];
    load_q<D>(q + row * hd, lane, qr);
    const int d0 = warp * (kWarp * DW) + lane * DW;  // this lane's dims of V and acc
    Softmax<DW> total;
    for (int begin = seg_begin; begin < seg_stop; begin += sh.seg_len) {
        const int end = min(seg_stop, begin + sh.seg_len);
        Softmax<DW> st;
        for (int p0 = begin; p0 < end; p0 += kWideWarps * kChunk) {
            // Chunks wholly before the window are skipped, as attend_global skips them.
            const int mine = p0 + warp * kChunk;
            if (mine < end && mine + kChunk > first) {
                const int lo = max(0, first - mine), n_valid = min(kChunk, end - mine);
                const GlobalRows k_chunk{k_rows.chunk(mine), k_rows.stride};
                dots[warp][lane] = chunk_dots<D>(qr, k_chunk, lo, n_valid, lane);
            }
            __syncthreads();
            for (int w = 0; w < kWideWarps; ++w) {
                const int c0 = p0 + w * kChunk;
                if (c0 >= end) break;
                if (c0 + kChunk <= first) continue;
                const int lo = max(0, first - c0), n_valid = min(kChunk, end - c0);
                const float wgt = fold_scores<DW>(dots[w][lane], lo, n_valid, sh.scale, lane, st);
                const uint16_t* v_chunk = v_rows.chunk(c0) + d0;
#pragma unroll
                for (int j = 0; j < kWarp; ++j) {
                    if (j >= lo && j < n_valid) {
                        const float wj = __shfl_sync(kFullMask, wgt, j);
                        float vv[DW];
                        load_halves<DW>(v_chunk + j * v_rows.stride, vv);
#pragma unroll
                        for (int c = 0; c < DW; ++c) st.acc[c] = fmaf(wj, vv[c], st.acc[c]);
                    }
                }
            }
            __syncthreads();  // before the next group's dots overwrite these
        }
        if (part.acc == nullptr) {
            merge_segment<DW>(total, st);
        } else {
            const int64_t r = row * part.n_seg + blockIdx.y;
#pragma unroll
            for (int c = 0; c < DW; ++c) part.acc[r * hd + d0 + c] = st.acc[c];
            if (threadIdx.x == 0) {
                part.m[r] = st.m;
                part.l[r] = st.l;
            }
            return;
        }
    }
    const float inv = total.l > 0.0f ? __fdiv_rn(1.0f, total.l) : 0.0f;
#pragma unroll
    for (int c = 0; c < DW; ++c) out[row * hd + d0 + c] = total.acc[c] * inv;
}

// Copies rows p0..p0+n-1 (a chunk) of one slot's K or V (f16, global) to
// tile as f32, 16 bytes per load, all threads of the CTA taking part.
__device__ void stage_rows(const SlotRows& rows, int p0, int n, int hd, float* tile) {
    const uint16_t* chunk = rows.chunk(p0);
    const int per_row = hd / 8;
    for (int i = int(threadIdx.x); i < n * per_row; i += int(blockDim.x)) {
        const int j = i / per_row, c = i % per_row;
        float x[8];
        load_halves<8>(chunk + j * rows.stride + c * 8, x);
        float4* dst = reinterpret_cast<float4*>(tile + j * hd + c * 8);
        dst[0] = make_float4(x[0], x[1], x[2], x[3]);
        dst[1] = make_float4(x[4], x[5], x[6], x[7]);
    }
}

// Tokens a prefill warp computes together: each K and V row it loads from
// shared memory serves all of them (shared memory bandwidth, not arithmetic,
// bounds one token per warp). Fewer for wide heads, whose registers run out.
template <int D>
struct PrefillTokens {
    static constexpr int per_warp = D <= 4 ? 4 : 2;
};

// The dots of T tokens' queries with the chunk's K rows 0..n_rows-1: on
// return dots[t] on lane p is token t's dot with row p, with score_chunk's
// bits (each lane's partial over its dims in the same order, and a transpose
// sum whose tree over the lanes is the same for every item). Rows go in T
// groups of 32 / T; item (row jj of the group, token t) sits at jj * T + t.
template <int D, int T>
__device__ void dots_chunk(const float (&q)[T][D], const SmemRows& k_rows, int n_rows, int lane, float (&dots)[T]) {
    constexpr int P = kWarp / T;
    float res[T];  // group g: item l on lane l
#pragma unroll
    for (int g = 0; g < T; ++g) {
        float part[kWarp];
#pragma unroll
        for (int jj = 0; jj < P; ++jj) {
            const int j = g * P + jj;
            float kk[D];
            if (j < n_rows) k_rows.template load<D>(j, lane, kk);
#pragma unroll
            for (int t = 0; t < T; ++t) {
                float dot = 0.0f;
                if (j < n_rows) {
#pragma unroll
                    for (int c = 0; c < D; ++c) dot = fmaf(q[t][c], kk[c], dot);
                }
                part[jj * T + t] = dot;
            }
        }
        res[g] = transpose_sum(part, lane);
    }
    // Row p of token t lies in group p / P on lane (p % P) * T + t.
#pragma unroll
    for (int t = 0; t < T; ++t) {
        const int src = (lane % P) * T + t;
        float v = 0.0f;
#pragma unroll
        for (int g = 0; g < T; ++g) {
            const float x = __shfl_sync(kFullMask, res[g], src);
            if (lane / P == g) v = x;
        }
        dots[t] = v;
    }
}

// Prefill kernel. Grid: x = (tile * n_kv_heads + kv_head) * chunks + chunk.
// Block: kPrefillWarps / sh.warps token groups times sh.warps heads; warp w
// computes query head chunk * sh.warps + w % sh.warps for the T consecutive
// tokens tile * tile_tokens + (w / sh.warps) * T + i. Each token's arithmetic
// is the decode kernel's, chunk by chunk and position by position, so a token
// gets the same bits here as alone.
template <int D>
__global__ void __launch_bounds__(kPrefillWarps * kWarp)
    attention_prefill_kernel(KvLayer kv, const float* q, AttnShape sh, int64_t n_tokens, int tile_tokens,
                             const int32_t* slot, const int32_t* pos, float* out) {
    after_prior_grids();
    constexpr int T = PrefillTokens<D>::per_warp;
    __shared__ __align__(16) float tile[kChunk * kMaxHeadDim];  // K, then V, of one chunk
    __shared__ int tile_slot, tile_begin, tile_end, tile_mixed;
    const int warp = int(threadIdx.x) / kWarp, lane = int(threadIdx.x) % kWarp;
    const int64_t cta = blockIdx.x;
    const int chunk = int(cta % sh.chunks);
    const int kvh = int(cta / sh.chunks % sh.n_kv_heads);
    const int64_t t0 = cta / sh.chunks / sh.n_kv_heads * tile_tokens;
    const int64_t first = t0 + int64_t(warp / sh.warps) * T;  // the warp's first token
    const int g = chunk * sh.warps + warp % sh.warps;
    const int hd = sh.head_dim;

    // Output row of the warp's token i (registers are scarce: recomputed, not kept).
    auto row_of = [&](int i) { return (first + i) * sh.n_heads + int64_t(kvh) * sh.group + g; };
    // Per token of the warp: its context begin and end (end 0: not computed here).
    int begin[T], end[T];
#pragma unroll
    for (int i = 0; i < T; ++i) {
        const int64_t t = first + i;
        begin[i] = end[i] = 0;
        if (t >= n_tokens || g >= sh.group) continue;
        const int32_t s = slot[t], last = pos[t];
        if (!in_cache(kv, s, last)) {
            for (int d = lane; d < hd; d += kWarp) out[row_of(i) * hd + d] = NAN;
            continue;
        }
        begin[i] = context_first(last, sh.window);
        end[i] = last + 1;
    }

    // Which slot the tile's cached tokens share, where the earliest context
    // begins (in whole chunks) and how far the furthest reaches.
    if (threadIdx.x == 0) {
        int first_slot = -1, earliest = INT_MAX, furthest = 0, mixed = 0;
        for (int64_t u = t0; u < t0 + tile_tokens && u < n_tokens; ++u) {
            const int32_t su = slot[u], pu = pos[u];
            if (!in_cache(kv, su, pu)) continue;
            if (first_slot < 0) first_slot = su;
            mixed |= su != first_slot;
            earliest = min(earliest, context_first(pu, sh.window));
            furthest = max(furthest, pu + 1);
        }
        tile_slot = first_slot;
        tile_begin = first_slot < 0 ? 0 : earliest / kChunk * kChunk;
        tile_end = furthest;
        tile_mixed = mixed;
    }
    __syncthreads();
    if (tile_slot < 0) return;  // no token of the tile in the cache (CTA-uniform)

    float qr[T][D];
    Softmax<D> total[T];  // the merge of each token's finished segments
#pragma unroll
    for (int i = 0; i < T; ++i)
        if (end[i] > 0) load_q<D>(q + row_of(i) * hd, lane, qr[i]);
    if (tile_mixed) {  // CTA-uniform: each token on its own, no barriers below
#pragma unroll
        for (int i = 0; i < T; ++i)
            if (end[i] > 0) {
                const int32_t s = slot[first + i];
                attend_segments<D>(qr[i], slot_rows(kv.k, kv, s, kvh), slot_rows(kv.v, kv, s, kvh), begin[i], end[i],
                                   sh.seg_len, sh.scale, lane, total[i]);
            }
    } else {
        Softmax<D> st[T];  // the current segment's state
        const SlotRows k_rows = slot_rows(kv.k, kv, tile_slot, kvh);
        const SlotRows v_rows = slot_rows(kv.v, kv, tile_slot, kvh);
        const SmemRows rows{tile, hd};
        int warp_end = 0;  // warp-uniform
#pragma unroll
        for (int i = 0; i < T; ++i) warp_end = max(warp_end, end[i]);
        for (int p0 = tile_begin; p0 < tile_end; p0 += kChunk) {
            const int n = min(kChunk, tile_end - p0);
            const bool mine = p0 < warp_end;  // warp-uniform
            // (A token's segments before its window hold fresh states: merging them changes nothing.)
            if (p0 > 0 && p0 % sh.seg_len == 0) {
#pragma unroll
                for (int i = 0; i < T; ++i) merge_segment<D>(total[i], st[i]);
            }
            __syncthreads();  // every warp is done with the previous V
            stage_rows(k_rows, p0, n, hd, tile);
            __syncthreads();
            int lo[T] = {}, n_valid[T] = {};
            float w[T] = {};
            if (mine) {
                float dots[T];
                dots_chunk<D, T>(qr, rows, min(n, warp_end - p0), lane, dots);
#pragma unroll
                for (int i = 0; i < T; ++i) {
                    // Rows lo..n_valid-1 of the chunk are the token's; none when its
                    // context ended before the chunk or its window begins after it.
                    lo[i] = max(0, begin[i] - p0);
                    n_valid[i] = min(kChunk, end[i] - p0);
                    if (lo[i] >= n_valid[i]) lo[i] = n_valid[i] = 0;
                    w[i] = n_valid[i] > 0 ? fold_scores<D>(dots[i], lo[i], n_valid[i], sh.scale, lane, st[i]) : 0.0f;
                }
            }
            __syncthreads();  // every warp is done with K
            stage_rows(v_rows, p0, n, hd, tile);
            __syncthreads();
            if (mine) {
                // acc += w_j * V row j, j in order, for each token whose context holds j.
#pragma unroll
                for (int j = 0; j < kChunk; ++j) {
                    if (p0 + j >= warp_end) break;
                    float vv[D];
                    rows.template load<D>(j, lane, vv);
#pragma unroll
                    for (int i = 0; i < T; ++i) {
                        if (j >= lo[i] && j < n_valid[i]) {
                            const float wj = __shfl_sync(kFullMask, w[i], j);
#pragma unroll
                            for (int c = 0; c < D; ++c) st[i].acc[c] = fmaf(wj, vv[c], st[i].acc[c]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int i = 0; i < T; ++i) merge_segment<D>(total[i], st[i]);
    }
#pragma unroll
    for (int i = 0; i < T; ++i)
        if (end[i] > 0) write_output<D>(total[i], out + row_of(i) * hd, lane);
}

// One CTA of head_dim threads per (token, head) row; thread d merges dim d
// of the segments first/seg_len..pos/seg_len in order (attention_internal.cuh), as the
// direct kernels merge them. Every thread computes the same running max and
// denominator from the same values, so they agree bit for bit. The merge is a
// chain, but its loads are not: m and l are staged in shared memory by the
// whole CTA and each thread loads kBatch segments' acc before merging them,
// so a row costs a few memory latencies, not one per segment.
__global__ void attention_combine_kernel(KvLayer kv, int n_heads, int head_dim, const int32_t* slot,
                                         const int32_t* pos, Partials part, int seg_len, int window, float* out) {
    constexpr int kBatch = 8;
    __shared__ float seg_m[kMaxSegments], seg_l[kMaxSegments];
    after_prior_grids();
    const int64_t row = blockIdx.x;
    const int64_t t = row / n_heads;
    const int d = int(threadIdx.x);
    const int32_t s = slot[t], last = pos[t];
    if (!in_cache(kv, s, last)) {  // the whole CTA leaves: no barrier is skipped
        out[row * head_dim + d] = NAN;
        return;
    }
    // Segments before the window's were not written (and hold no position).
    const int i0 = context_first(last, window) / seg_len;
    const int n_seg = last / seg_len + 1;  // <= part.n_seg <= kMaxSegments since last < n_ctx
    const int64_t r0 = row * part.n_seg;
    for (int i = i0 + d; i < n_seg; i += int(blockDim.x)) {
        seg_m[i] = part.m[r0 + i];
        seg_l[i] = part.l[r0 + i];
    }
    __syncthreads();
    float m = -INFINITY, l = 0.0f, a = 0.0f;
    for (int b = i0; b < n_seg; b += kBatch) {
        float acc[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) acc[j] = b + j < n_seg ? part.acc[(r0 + b + j) * head_dim + d] : 0.0f;
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const int i = b + j;
            // No position (never for a segment up to pos; kept as the kernels do).
            if (i >= n_seg || seg_m[i] == -INFINITY) continue;
            const MergeWeights w = merge_weights(m, seg_m[i]);
            l = merge_value(l, seg_l[i], w);
            a = merge_value(a, acc[j], w);
            m = w.m;
        }
    }
    const float inv = l > 0.0f ? __fdiv_rn(1.0f, l) : 0.0f;
    out[row * head_dim + d] = a * inv;
}

// Short segments give a decode token many CTAs (depth 1024: 8 per head); past
// kMaxSegments * kMinSegment positions the segment doubles instead, so the
// workspace stays bounded. A function of the cache's length alone: it fixes
// the arithmetic of every token (attention_internal.cuh).
int segment_length(int n_ctx) {
    int seg = kMinSegment;
    while (int64_t(seg) * kMaxSegments < n_ctx) seg *= 2;
    return seg;
}

int segments(int n_ctx) {
    const int seg = segment_length(n_ctx);
    return (n_ctx + seg - 1) / seg;
}

// Prefill-like batches split while they have fewer (token, head) warps than
// twice the SMs; decode batches (a token per sequence) up to kMaxSplitTokens
// tokens, as far as kSplitBudget bytes of partials allow. Nothing splits
// where the whole cache is one segment.
constexpr int64_t kMaxSplitTokens = 64;
constexpr size_t kSplitBudget = size_t(64) << 20;

int64_t fill_tokens(int n_heads) {
    const int64_t sms = current_sm_count();
    return n_heads > 0 && sms > 0 ? (2 * sms - 1) / n_heads : 0;
}

size_t split_bytes_per_token(int n_heads, int head_dim, int n_ctx) {
    return size_t(n_heads) * size_t(segments(n_ctx)) * (size_t(head_dim) + 2) * sizeof(float);
}

int64_t max_split_tokens(int n_heads, int head_dim, int n_ctx, AttnBatch kind) {
    if (n_heads <= 0 || head_dim <= 0 || n_ctx <= segment_length(n_ctx)) return 0;
    const int64_t fill = fill_tokens(n_heads);
    if (kind == AttnBatch::Prefill) return fill;
    const int64_t budget = int64_t(kSplitBudget / split_bytes_per_token(n_heads, head_dim, n_ctx));
    return std::max(fill, std::min(kMaxSplitTokens, budget));
}

// The workspace as split partials: acc, then m, then l (see Partials).
Partials split_partials(float* workspace, int64_t n_tokens, int n_heads, const KvLayer& kv) {
    Partials part;
    part.n_seg = segments(kv.n_ctx);
    const size_t rows = size_t(n_tokens) * size_t(n_heads) * size_t(part.n_seg);
    part.acc = workspace;
    part.m = part.acc + rows * size_t(kv.head_dim);
    part.l = part.m + rows;
    return part;
}

// The combine of either implementation's split partials: a CTA per (token, head) row.
void combine(const KvLayer& kv, int64_t n_tokens, int n_heads, const int32_t* slot, const int32_t* pos,
             const Partials& part, int seg_len, int window, float* out, cudaStream_t stream) {
    launch(attention_combine_kernel, unsigned(n_tokens * n_heads), unsigned(kv.head_dim), 0, stream, kv, n_heads,
           kv.head_dim, slot, pos, part, seg_len, window, out);
}

// TERN_ATTN_WIDE=0 keeps wide heads' decode on the one-warp-per-head kernel,
// for A/B measurements (the bits are the same either way).
bool wide_decode_on() {
    static const bool on = !switched_off("TERN_ATTN_WIDE");
    return on;
}

// CUDA-core kernels: split segments, a CTA per token (decode batches: their
// tokens belong to different sequences), or tiles of consecutive tokens that
// share staged K/V (prefill).
template <int D>
void launch_cuda_cores(const KvLayer& kv, const float* q, int64_t n_tokens, const AttnShape& sh, const int32_t* slot,
            const int32_t* pos, float* out, float* workspace, bool split, AttnBatch kind, cudaStream_t stream) {
    const unsigned threads = unsigned(sh.warps * kWarp);
    const unsigned token_ctas = unsigned(n_tokens * kv.n_kv_heads * sh.chunks);
    if constexpr (D % kWideWarps == 0) {
        if ((split || n_tokens == 1 || kind == AttnBatch::Decode) && wide_decode_on()) {
            const Partials part = split ? split_partials(workspace, n_tokens, sh.n_heads, kv) : Partials{};
            const dim3 grid(unsigned(n_tokens * sh.n_heads), split ? unsigned(part.n_seg) : 1);
            const auto kernel =
                early_reads_on() ? attention_decode_wide_kernel<D, true> : attention_decode_wide_kernel<D, false>;
            launch(kernel, grid, kWideWarps * kWarp, 0, stream, kv, q, sh, slot, pos, out, part);
            if (split) combine(kv, n_tokens, sh.n_heads, slot, pos, part, sh.seg_len, sh.window, out, stream);
            return;
        }
    }
    if (split) {
        const Partials part = split_partials(workspace, n_tokens, sh.n_heads, kv);
        launch(attention_decode_kernel<D>, dim3(token_ctas, unsigned(part.n_seg)), threads, 0, stream, kv, q, sh,
               slot, pos, out, part);
        combine(kv, n_tokens, sh.n_heads, slot, pos, part, sh.seg_len, sh.window, out, stream);
    } else if (n_tokens == 1 || kind == AttnBatch::Decode) {
        launch(attention_decode_kernel<D>, dim3(token_ctas, 1), threads, 0, stream, kv, q, sh, slot, pos, out,
               Partials{});
    } else {
        const int tile_tokens = kPrefillWarps / sh.warps * PrefillTokens<D>::per_warp;
        const int64_t tiles = (n_tokens + tile_tokens - 1) / tile_tokens;
        const unsigned ctas = unsigned(tiles * kv.n_kv_heads * sh.chunks);
        const unsigned prefill_threads = unsigned(kPrefillWarps / sh.warps * sh.warps * kWarp);
        launch(attention_prefill_kernel<D>, ctas, prefill_threads, 0, stream, kv, q, sh, n_tokens, tile_tokens, slot,
               pos, out);
    }
}

// TERN_ATTN_MMA=0 keeps every shape on the CUDA-core kernels, for A/B
// measurements (docs/perf/LOG.md); read once, so prefill and decode agree.
bool tensor_cores_on() {
    static const bool on = !switched_off("TERN_ATTN_MMA");
    return on;
}

// The tensor-core kernel (attention_mma.cu) for the head shapes it takes.
// Tiles: one token per CTA for decode batches and small ones (their tokens
// usually belong to different sequences), else about 64 rows of (token, head).
int mma_tile_tokens(int group, int64_t n_tokens, bool split, AttnBatch kind) {
    constexpr int kSmallBatch = 16;
    const bool per_token = split || kind == AttnBatch::Decode || n_tokens <= kSmallBatch;
    return per_token ? 1 : std::max(1, 64 / group);
}

// Where the table was made for these tiles (else uniform tiles: a tile may
// then hold several sequences, each its own pass).
void launch_mma(const KvLayer& kv, const float* q, int64_t n_tokens, int n_heads, float scale, const int32_t* slot,
                const int32_t* pos, float* out, float* workspace, bool split, AttnBatch kind, AttnTiles tiles,
                bool few_units, cudaStream_t stream) {
    const int tile_tokens = mma_tile_tokens(n_heads / kv.n_kv_heads, n_tokens, split, kind);
    const bool table = tile_tokens > 1 && tiles.starts && tiles.tile_tokens == tile_tokens;
    const Partials part = split ? split_partials(workspace, n_tokens, n_heads, kv) : Partials{};
    const int seg = segment_length(kv.n_ctx);
    attn::attention_mma(kv, q, n_tokens, n_heads, scale, slot, pos, out, part, seg, tile_tokens,
                        table ? tiles.starts : nullptr, table ? tiles.count : 0, few_units, stream);
    if (split) combine(kv, n_tokens, n_heads, slot, pos, part, seg, /*window=*/0, out, stream);
}

}  // namespace

bool attention_supported(int n_heads, int n_kv_heads, int head_dim) {
    return n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 && head_dim > 0 && head_dim % kWarp == 0 &&
           head_dim <= kMaxHeadDim;
}

int attention_segment_length(int n_ctx) { return segment_length(n_ctx); }

bool attention_few_units(const int32_t* pos, int64_t n_tokens, int n_kv_heads, int n_ctx) {
    const int64_t sms = current_sm_count();
    const int seg = segment_length(n_ctx);
    int64_t units = 0;
    for (int64_t t = 0; t < n_tokens && units <= sms; ++t)
        units += int64_t(n_kv_heads) * (pos[t] >= 0 && pos[t] < n_ctx ? pos[t] / seg + 1 : 1);
    return units <= sms;
}

bool attention_splits(int64_t n_tokens, int n_heads, int head_dim, int n_ctx, AttnBatch kind) {
    return n_tokens >= 1 && n_tokens <= max_split_tokens(n_heads, head_dim, n_ctx, kind);
}

size_t attention_workspace_bytes(int64_t n_tokens, int n_heads, int head_dim, int n_ctx) {
    const int64_t max_tokens = max_split_tokens(n_heads, head_dim, n_ctx, AttnBatch::Decode);
    const int64_t tokens = n_tokens < max_tokens ? n_tokens : max_tokens;
    if (tokens <= 0) return 0;
    // acc, then m, then l (see Partials).
    return size_t(tokens) * split_bytes_per_token(n_heads, head_dim, n_ctx);
}

namespace {

// The tensor-core kernel takes the layer: no window, a shape it handles.
bool takes_mma(int group, int head_dim, int window, int n_ctx) {
    const bool windowed = window > 0 && window < n_ctx;
    return !windowed && tensor_cores_on() && attn::mma_takes(group, head_dim);
}

}  // namespace

int attention_tile_tokens(int n_heads, int n_kv_heads, int head_dim, int n_ctx, int window, int64_t n_tokens,
                          AttnBatch kind, bool has_workspace) {
    if (!attention_supported(n_heads, n_kv_heads, head_dim) || n_tokens <= 0) return 0;
    const int group = n_heads / n_kv_heads;
    if (!takes_mma(group, head_dim, window, n_ctx)) return 0;
    const bool split = has_workspace && attention_splits(n_tokens, n_heads, head_dim, n_ctx, kind);
    const int tokens = mma_tile_tokens(group, n_tokens, split, kind);
    return tokens > 1 ? tokens : 0;
}

int64_t attention_tiles(const int32_t* slot, int64_t n_tokens, int tile_tokens, int32_t* starts) {
    int64_t n = 0;
    for (int64_t t = 0; t < n_tokens; ++t)
        if (t == 0 || slot[t] != slot[t - 1] || t - starts[n - 1] == tile_tokens) starts[n++] = int32_t(t);
    starts[n] = int32_t(n_tokens);
    return n;
}

void attention(const KvLayer& kv, const float* q, int64_t n_tokens, int n_heads, float scale, int window,
               const int32_t* slot, const int32_t* pos, float* out, float* workspace, AttnBatch kind,
               cudaStream_t stream, AttnTiles tiles, bool few_units) {
    if (n_tokens <= 0 || kv.n_ctx <= 0 || !attention_supported(n_heads, kv.n_kv_heads, kv.head_dim)) return;
    AttnShape sh;
    sh.n_heads = n_heads;
    sh.n_kv_heads = kv.n_kv_heads;
    sh.head_dim = kv.head_dim;
    sh.group = n_heads / kv.n_kv_heads;
    sh.warps = sh.group < kMaxWarps ? sh.group : kMaxWarps;
    sh.chunks = (sh.group + sh.warps - 1) / sh.warps;
    sh.seg_len = segment_length(kv.n_ctx);
    sh.window = window > 0 && window < kv.n_ctx ? window : 0;  // a window as long as the cache is all of it
    sh.scale = scale;
    const bool split = workspace != nullptr && attention_splits(n_tokens, n_heads, kv.head_dim, kv.n_ctx, kind);
    // Sliding-window layers stay on the CUDA-core kernels, prefill and decode
    // alike (a layer's choice, never the batch's), which skip whole chunks before the window.
    if (takes_mma(sh.group, kv.head_dim, window, kv.n_ctx)) {
        launch_mma(kv, q, n_tokens, n_heads, scale, slot, pos, out, workspace, split, kind, tiles, few_units, stream);
        return;
    }
    switch (kv.head_dim / kWarp) {
        case 1: launch_cuda_cores<1>(kv, q, n_tokens, sh, slot, pos, out, workspace, split, kind, stream); break;
        case 2: launch_cuda_cores<2>(kv, q, n_tokens, sh, slot, pos, out, workspace, split, kind, stream); break;
        case 3: launch_cuda_cores<3>(kv, q, n_tokens, sh, slot, pos, out, workspace, split, kind, stream); break;
        case 4: launch_cuda_cores<4>(kv, q, n_tokens, sh, slot, pos, out, workspace, split, kind, stream); break;
        case 5: launch_cuda_cores<5>(kv, q, n_tokens, sh, slot, pos, out, workspace, split, kind, stream); break;
        case 6: launch_cuda_cores<6>(kv, q, n_tokens, sh, slot, pos, out, workspace, split, kind, stream); break;
        case 7: launch_cuda_cores<7>(kv, q, n_tokens, sh, slot, pos, out, workspace, split, kind, stream); break;
        case 8: launch_cuda_cores<8>(kv, q, n_tokens, sh, slot, pos, out, workspace, split, kind, stream); break;
        default: break;  // attention_supported refused it
    }
}

}  // namespace tern::cuda
