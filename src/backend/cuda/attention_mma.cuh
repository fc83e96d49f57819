// The tensor-core attention's steps for one chunk of 32 positions, shared by
// its two kernels: attention_mma.cu (warps of 16 rows each, the chunks one
// after another) and attention_mma_decode.cu (one warp's rows, four warps
// taking the chunks' scores side by side and a share of the head's dims
// each). Both run these steps on the same values in the same order, so a
// token gets the same bits from either (attention_internal.cuh).
//
// Fragments are mma.sync m16n8k16's (mma_f16.cuh): lane (g = lane / 4,
// tig = lane % 4) holds rows g and g + 8 of its warp's sixteen.
#pragma once

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/attention_internal.cuh"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/ldmatrix.cuh"
#include "backend/cuda/mma_f16.cuh"

namespace tern::cuda::attn {

constexpr int kChunk = 32;        // positions per step: four n8 tiles of S
constexpr int kRowsPerWarp = 16;  // the m16 of the mma
constexpr unsigned kAll = 0xffffffffu;

struct MmaShape {
    int n_heads = 0, n_kv_heads = 0, group = 0;
    int tile_tokens = 0;  // tokens per CTA
    int seg_len = 0;      // positions per segment (grid y)
    float scale = 0.0f;
};

__device__ __forceinline__ unsigned half2_bits(__half2 h) { return *reinterpret_cast<unsigned*>(&h); }

// (a, b) as two f16 pairs: hi = f16(a), f16(b) and lo = f16 of what hi missed.
__device__ __forceinline__ void split_pair(float a, float b, unsigned& hi, unsigned& lo) {
    const __half2 h = __floats2half2_rn(a, b);
    const float2 back = __half22float2(h);
    hi = half2_bits(h);
    lo = half2_bits(__floats2half2_rn(__fsub_rn(a, back.x), __fsub_rn(b, back.y)));
}

// Starts copying rows c0..c0+n-1 (a chunk) of K or V (f16, global) into a
// chunk tile of pitch P halves, 16 bytes per cp.async, thread `id` of
// `threads`; rows n..kChunk-1 become zeros (a zero-byte source fills them).
// The caller commits and waits.
template <int HD, int P>
__device__ __forceinline__ void stage_async(const SlotRows& rows, int c0, int n, uint16_t* tile, int id,
                                            int threads) {
    constexpr int per_row = HD / 8;  // 16-byte pieces
    const uint16_t* chunk = rows.chunk(c0);
    for (int i = id; i < kChunk * per_row; i += threads) {
        const int j = i / per_row, c = i % per_row;
        const uint16_t* src = chunk + int64_t(j < n ? j : 0) * rows.stride + c * 8;
        cp_async16(tile + j * P + c * 8, src, j < n ? 16 : 0);
    }
}

// q of the lane's rows as hi/lo f16 A fragments: [k][0] row g, dims 16k +
// 2tig (+1); [k][1] row g + 8; [k][2], [k][3] the same rows, dims + 8. A row
// that is not cached gets zeros.
template <int HD>
__device__ __forceinline__ void load_q(const float* q, const bool (&cached)[2], const int64_t (&row)[2], int tig,
                                       unsigned (&hi)[HD / 16][4], unsigned (&lo)[HD / 16][4]) {
#pragma unroll
    for (int k = 0; k < HD / 16; ++k)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int h = i & 1, dim = 16 * k + 2 * tig + 8 * (i >> 1);
            float2 x = make_float2(0.0f, 0.0f);
            if (cached[h]) x = *reinterpret_cast<const float2*>(q + row[h] * HD + dim);
            split_pair(x.x, x.y, hi[k][i], lo[k][i]);
        }
}

// S = q K^T over a staged chunk: n8 tile i holds positions 8i..8i+7; for
// each k step the hi term, then the lo.
template <int HD, int P>
__device__ __forceinline__ void chunk_scores(const unsigned (&qa_hi)[HD / 16][4], const unsigned (&qa_lo)[HD / 16][4],
                                             const uint16_t* k_chunk, int lane, float (&sc)[4][4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
#pragma unroll
        for (int k = 0; k < HD / 16; k += 2) {
            unsigned b[4];
            ldmatrix_x4(b, k_chunk + (8 * i + (lane & 7)) * P + 16 * k + 8 * (lane >> 3));
            mma_f16(sc[i], qa_hi[k], b[0], b[1]);
            mma_f16(sc[i], qa_lo[k], b[0], b[1]);
            mma_f16(sc[i], qa_hi[k + 1], b[2], b[3]);
            mma_f16(sc[i], qa_lo[k + 1], b[2], b[3]);
        }
    }
}

// The online softmax of row g + 8h over the chunk at c0 (positions at or
// past `end` masked): updates its m and l, leaves the probabilities in p
// (p[2i + e]: position c0 + 8i + 2tig + e) and returns the correction its
// accumulators take.
__device__ __forceinline__ float fold_row(const float (&sc)[4][4], int h, int c0, int tig, int end, float scale,
                                          float& m, float& l, float (&p)[8]) {
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const bool valid = c0 + 8 * i + 2 * tig + e < end;
            const float score = valid ? __fmul_rn(sc[i][2 * h + e], scale) : -INFINITY;
            p[2 * i + e] = score;
            mx = fmaxf(mx, score);
        }
    mx = fmaxf(mx, __shfl_xor_sync(kAll, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(kAll, mx, 2));
    const float m_new = fmaxf(m, mx);
    // No position yet (m_new = -inf): nothing to correct or weigh.
    const float correction = m_new == -INFINITY ? 1.0f : expf(__fsub_rn(m, m_new));
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float w = p[i] == -INFINITY ? 0.0f : expf(__fsub_rn(p[i], m_new));
        p[i] = w;
        sum = i == 0 ? w : __fadd_rn(sum, w);
    }
    sum = __fadd_rn(sum, __shfl_xor_sync(kAll, sum, 1));
    sum = __fadd_rn(sum, __shfl_xor_sync(kAll, sum, 2));
    l = __fadd_rn(__fmul_rn(l, correction), sum);
    m = m_new;
    return correction;
}

// Rows g + 8h of n8 tiles 0..NT-1 times the correction.
template <int NT>
__device__ __forceinline__ void correct_rows(float (&acc)[NT][4], int h, float correction) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        acc[j][2 * h] = __fmul_rn(acc[j][2 * h], correction);
        acc[j][2 * h + 1] = __fmul_rn(acc[j][2 * h + 1], correction);
    }
}

// Both of the lane's rows through fold_row, their accumulators (NT tiles)
// corrected. upper_live false (warp-uniform): rows 8..15 are in no pass and
// keep their state bit for bit; their probabilities are zeros.
template <int NT>
__device__ __forceinline__ void fold_rows(const float (&sc)[4][4], int c0, int tig, const int (&end)[2], float scale,
                                          bool upper_live, float (&m)[2], float (&l)[2], float (&acc)[NT][4],
                                          float (&p)[2][8]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (h == 1 && !upper_live) {
#pragma unroll
            for (int i = 0; i < 8; ++i) p[1][i] = 0.0f;
            continue;
        }
        correct_rows(acc, h, fold_row(sc, h, c0, tig, end[h], scale, m[h], l[h], p[h]));
    }
}

// acc += P V over the chunk's two k16 steps, for the NT n8 tiles of the
// head's dims from tile j0 (acc[j] is tile j0 + j); the S tiles 2k, 2k + 1 are
// the A fragment. upper_live false: rows 8..15 weigh nothing (p[1] is zero).
template <int NT, int P>
__device__ __forceinline__ void add_pv(float (&acc)[NT][4], const float (&p)[2][8], bool upper_live,
                                       const uint16_t* v_chunk, int j0, int lane) {
    static_assert(NT % 2 == 0, "tiles go in pairs, one ldmatrix_x4 each");
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        unsigned pa_hi[4], pa_lo[4];
        split_pair(p[0][4 * k], p[0][4 * k + 1], pa_hi[0], pa_lo[0]);
        split_pair(p[0][4 * k + 2], p[0][4 * k + 3], pa_hi[2], pa_lo[2]);
        if (upper_live) {
            split_pair(p[1][4 * k], p[1][4 * k + 1], pa_hi[1], pa_lo[1]);
            split_pair(p[1][4 * k + 2], p[1][4 * k + 3], pa_hi[3], pa_lo[3]);
        } else {  // what splitting the zero probabilities gives
            pa_hi[1] = pa_lo[1] = pa_hi[3] = pa_lo[3] = 0u;
        }
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            unsigned b[4];
            ldmatrix_x4<true>(b, v_chunk + (16 * k + (lane & 7) + 8 * ((lane >> 3) & 1)) * P + 8 * (j0 + j) +
                                     8 * (lane >> 4));
            mma_f16(acc[j], pa_hi, b[0], b[1]);
            mma_f16(acc[j], pa_lo, b[0], b[1]);
            mma_f16(acc[j + 1], pa_hi, b[2], b[3]);
            mma_f16(acc[j + 1], pa_lo, b[2], b[3]);
        }
    }
}

// The lane's elements of row `row` of out (q's row) as NaN, NT tiles: a
// token outside the cache, so that the caller's bug shows.
template <int HD, int NT>
__device__ __forceinline__ void store_nan_row(float* out, int64_t row, int tig) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
        *reinterpret_cast<float2*>(out + row * HD + 8 * j + 2 * tig) = make_float2(NAN, NAN);
}

// Row g + 8h's split partial, at row r of the partials: tiles j0.. of acc,
// and m and l where with_ml (one lane of the row's quad writes them).
template <int HD, int NT>
__device__ __forceinline__ void store_partial(Partials part, int64_t r, int h, const float (&acc)[NT][4], int j0,
                                              int tig, float m, float l, bool with_ml) {
    float2* const lane_acc = reinterpret_cast<float2*>(part.acc + r * HD + 8 * j0 + 2 * tig);
#pragma unroll
    for (int j = 0; j < NT; ++j) lane_acc[4 * j] = make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
    if (with_ml && tig == 0) {
        part.m[r] = m;
        part.l[r] = l;
    }
}

// Row g + 8h's output, at row `row` of out: tiles j0.. of its merged
// accumulator (tot(j, c), NT tiles) over its denominator.
template <int HD, int NT, class Total>
__device__ __forceinline__ void store_output(float* out, int64_t row, int h, Total&& tot, float tot_l, int j0,
                                             int tig) {
    const float inv = tot_l > 0.0f ? __fdiv_rn(1.0f, tot_l) : 0.0f;
    float2* const lane_out = reinterpret_cast<float2*>(out + row * HD + 8 * j0 + 2 * tig);
#pragma unroll
    for (int j = 0; j < NT; ++j)
        lane_out[4 * j] = make_float2(__fmul_rn(tot(j, 2 * h), inv), __fmul_rn(tot(j, 2 * h + 1), inv));
}

// Merges the lane's rows' finished segment (m, l, acc) into their totals
// (tot_m, tot_l, tot(j, c) for element c of tile j) and starts the next
// segment afresh (attention_internal.cuh). Rows with no position skip the merge.
template <int NT, class Total>
__device__ __forceinline__ void merge_segment(float (&m)[2], float (&l)[2], float (&acc)[NT][4], float (&tot_m)[2],
                                              float (&tot_l)[2], Total&& tot) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (m[h] != -INFINITY) {
            const MergeWeights w = merge_weights(tot_m[h], m[h]);
            tot_l[h] = merge_value(tot_l[h], l[h], w);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                tot(j, 2 * h) = merge_value(tot(j, 2 * h), acc[j][2 * h], w);
                tot(j, 2 * h + 1) = merge_value(tot(j, 2 * h + 1), acc[j][2 * h + 1], w);
            }
            tot_m[h] = w.m;
        }
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[j][2 * h] = acc[j][2 * h + 1] = 0.0f;
    }
}

// The decode kernel (attention_mma_decode.cu): whether it takes a launch of
// attention_mma() (a token per CTA, its rows within one warp's sixteen, no
// tile table) of a batch with few units of work (attention_few_units), and
// that launch.
bool mma_decode_takes(int group, int tile_tokens, const int32_t* tile_start);
void attention_mma_decode(const KvLayer& kv, const float* q, int64_t n_tokens, const MmaShape& sh,
                          const int32_t* slot, const int32_t* pos, float* out, const Partials& part,
                          cudaStream_t stream);

}  // namespace tern::cuda::attn
