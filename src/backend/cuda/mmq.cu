// Prefill matmul on int8 tensor cores (mma.sync m16n8k32, s8 x s8 -> s32).
// A CTA computes a 128-row x 64-token tile with eight warps (4 x 2, each 32
// rows x 32 tokens); per k step it stages one chunk
// (eight 32-element blocks) of weights, decoded to int8 by block_decode.cuh,
// and of quantized activations into shared memory. Each block's integer sums
// come from one mma (two m16n8k16 for q6_K, whose 16-element halves have their
// own scales); the float terms and chunk sums then follow the order kernels.h
// documents, so the result has mmvq's bits and the CPU twin's. For q4_K/q5_K
// the per-block products of the fused term are made once while staging.
#include <cstdlib>

#include "backend/cuda/block_decode.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/ldmatrix.cuh"

namespace tern::cuda {
namespace {

// Rows per tile: 128 (eight warps) by default; TERN_MMQ_ROWS=64 selects the
// four-warp tile for A/B measurements (docs/perf/LOG.md).
constexpr int kTileTokens = 64;
constexpr int kPitch = 256 + 16;       // bytes per staged row: a chunk plus padding against bank conflicts

template <int kTileRows>
struct Stage {
    int8_t w[kTileRows][kPitch];
    int8_t x[kTileTokens][kPitch];
    // Per row and block (one padding column: a warp's eight rows read distinct banks).
    int wscale[kTileRows][9];           // sc0 | sc1 << 8 | mn << 16 (bytes)
    float2 wdm[kTileRows][9];           // d, m; q4_K/q5_K: d * sc, dmin * mn (term_min_fused's products)
    // Per block and token: a lane's two adjacent tokens are one 8-byte load; the
    // pitch puts the eight blocks of four tokens that a warp stores in distinct banks.
    float xd[8][kTileTokens + 4];
    int xsum[8][kTileTokens + 4];      // the block's sum; q4_K/q5_K: the bits of da * sum
};

__device__ __forceinline__ void mma_k32(int (&c)[4], const int (&a)[4], int b0, int b1) {
    c[0] = c[1] = c[2] = c[3] = 0;
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b0) {
    c[0] = c[1] = c[2] = c[3] = 0;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

template <WType T, bool WIDE, int kTileRows, int kThreads = kTileRows * 2>
__global__ void __launch_bounds__(kThreads, 2) mmq_kernel(DevWeight w, DevAct a, int64_t n_tokens,
                                                         float* __restrict__ y, int64_t y_stride) {
    constexpr TermKind K = BlockInfo<T>::kind;
    constexpr bool two_scales = T == WType::Q6_K;
    static_assert(kTileRows * 8 % kThreads == 0 && kTileTokens * 8 % kThreads == 0, "staging units divide evenly");
    extern __shared__ __align__(16) unsigned char smem[];
    Stage<kTileRows>& s = *reinterpret_cast<Stage<kTileRows>*>(smem);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tig = lane & 3;
    const int wr = (warp >> 1) * 32, wt = (warp & 1) * 32;  // warp's first row and token in the tile (4 x 2 warps)
    const int64_t row0 = int64_t(blockIdx.x) * kTileRows, tok0 = int64_t(blockIdx.y) * kTileTokens;
    const int64_t nblocks = w.cols / 32, nchunks = (nblocks + 7) / 8;

    float acc[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

    for (int64_t kc = 0; kc < nchunks; ++kc) {
        const int nb = int(min64(8, nblocks - kc * 8));
        __syncthreads();  // the previous chunk's compute is done with the stage
        // Units past the matrix (rows past the last, blocks past the row's
        // end) stage a block that exists, the tile's first row's block 0: no
        // result reads them (their rows and tokens are not written, their
        // blocks are past nb), and every load is unconditional, so the
        // compiler issues all of a thread's loads before its first decode.
        // Weights: unit u = (row r, block j); eight consecutive threads read
        // one row's chunk.
#pragma unroll
        for (int i = 0; i < kTileRows * 8 / kThreads; ++i) {
            const int u = tid + i * kThreads, r = u >> 3, j = u & 7;
            const bool valid = row0 + r < w.rows && j < nb;
            const uint8_t* chunk = chunk_ptr<T>(w.data + (valid ? row0 + r : row0) * w.row_stride, kc, w.block_stride);
            const BlockVals v = decode_block<T, WIDE>(chunk, valid ? j : 0);
            int4* dst = reinterpret_cast<int4*>(&s.w[r][j * 32]);
            dst[0] = make_int4(v.q[0], v.q[1], v.q[2], v.q[3]);
            dst[1] = make_int4(v.q[4], v.q[5], v.q[6], v.q[7]);
            s.wscale[r][j] = (v.sc0 & 0xFF) | (v.sc1 & 0xFF) << 8 | (v.mn & 0xFF) << 16;
            if (K == TermKind::min)
                s.wdm[r][j] = make_float2(__fmul_rn(v.d, __int2float_rn(v.sc0)), __fmul_rn(v.m, __int2float_rn(v.mn)));
            else
                s.wdm[r][j] = make_float2(v.d, v.m);
        }
        // Activations: unit u = (token t, block j); eight consecutive threads
        // read one token's chunk.
#pragma unroll
        for (int i = 0; i < kTileTokens * 8 / kThreads; ++i) {
            const int u = tid + i * kThreads, t = u >> 3, j = u & 7;
            const bool valid = tok0 + t < n_tokens && j < nb;
            const int64_t ab = valid ? (tok0 + t) * a.blocks + kc * 8 + j : 0;
            const int4* src = reinterpret_cast<const int4*>(a.qs + ab * 32);
            int4* dst = reinterpret_cast<int4*>(&s.x[t][j * 32]);
            dst[0] = src[0];
            dst[1] = src[1];
            s.xd[j][t] = a.d[ab];
            if (K == TermKind::min)
                s.xsum[j][t] = __float_as_int(__fmul_rn(a.d[ab], __int2float_rn(a.sum[ab])));
            else
                s.xsum[j][t] = a.sum[ab];
        }
        __syncthreads();

        // The chunk's sum starts at -0.0, so the first term enters unchanged
        // (-0 + t == t for every t, signed zeros included).
        float c[2][4][4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int ni = 0; ni < 4; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) c[mi][ni][e] = -0.0f;
        for (int j = 0; j < nb; ++j) {
            // A fragments of this lane: rows g, g + 8 of each 16-row slice,
            // bytes 4tig.. of the block's halves (matrices: rows 0-7 / 8-15 x
            // bytes 0-15 / 16-31).
            int af[2][4];
            BlockVals rv[2][2];  // scales of this lane's rows g and g + 8 of each 16-row slice
#pragma unroll
            for (int mi = 0; mi < 2; ++mi) {
                const int r = wr + mi * 16 + g;
                ldmatrix_x4(af[mi], &s.w[wr + mi * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)][j * 32 + 16 * (lane >> 4)]);
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int packed = s.wscale[r + 8 * h][j];
                    const float2 dm = s.wdm[r + 8 * h][j];
                    rv[mi][h].sc0 = int(int8_t(packed & 0xFF));
                    rv[mi][h].sc1 = int(int8_t((packed >> 8) & 0xFF));
                    rv[mi][h].mn = (packed >> 16) & 0xFF;
                    rv[mi][h].d = dm.x;
                    rv[mi][h].m = dm.y;
                }
            }
            // B fragments of token tiles ni, ni + 1 (tokens wt + 8ni + g): bytes
            // 4tig.. of the block's halves.
            int bf[2][4];
#pragma unroll
            for (int np = 0; np < 2; ++np)
                ldmatrix_x4(bf[np], &s.x[wt + np * 16 + (lane & 7) + 8 * (lane >> 4)][j * 32 + 16 * ((lane >> 3) & 1)]);
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const int b0 = bf[ni >> 1][2 * (ni & 1)], b1 = bf[ni >> 1][2 * (ni & 1) + 1];
                // The token columns this lane's accumulators hold.
                const int t0 = wt + ni * 8 + tig * 2;
                const float2 da = *reinterpret_cast<const float2*>(&s.xd[j][t0]);
                const int2 as = *reinterpret_cast<const int2*>(&s.xsum[j][t0]);
                const float da0 = da.x, da1 = da.y;
                const int as0 = as.x, as1 = as.y;
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    int h0[4], h1[4];
                    if (two_scales) {
                        mma_k16(h0, af[mi][0], af[mi][1], b0);
                        mma_k16(h1, af[mi][2], af[mi][3], b1);
                    } else {
                        mma_k32(h0, af[mi], b0, b1);
                        h1[0] = h1[1] = h1[2] = h1[3] = 0;
                    }
                    float t_[4];
                    if (K == TermKind::min) {
                        const float s0 = __int_as_float(as0), s1 = __int_as_float(as1);
                        t_[0] = term_min_fused(rv[mi][0].d, rv[mi][0].m, da0, s0, h0[0]);
                        t_[1] = term_min_fused(rv[mi][0].d, rv[mi][0].m, da1, s1, h0[1]);
                        t_[2] = term_min_fused(rv[mi][1].d, rv[mi][1].m, da0, s0, h0[2]);
                        t_[3] = term_min_fused(rv[mi][1].d, rv[mi][1].m, da1, s1, h0[3]);
                    } else {
                        t_[0] = block_term<K>(rv[mi][0], h0[0], h1[0], da0, as0);
                        t_[1] = block_term<K>(rv[mi][0], h0[1], h1[1], da1, as1);
                        t_[2] = block_term<K>(rv[mi][1], h0[2], h1[2], da0, as0);
                        t_[3] = block_term<K>(rv[mi][1], h0[3], h1[3], da1, as1);
                    }
#pragma unroll
                    for (int e = 0; e < 4; ++e) c[mi][ni][e] = __fadd_rn(c[mi][ni][e], t_[e]);
                }
            }
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int ni = 0; ni < 4; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mi][ni][e] = __fadd_rn(acc[mi][ni][e], c[mi][ni][e]);
    }

#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t row = row0 + wr + mi * 16 + g + (e >= 2 ? 8 : 0);
                const int64_t tok = tok0 + wt + ni * 8 + tig * 2 + (e & 1);
                if (row < w.rows && tok < n_tokens) y[tok * y_stride + row] = acc[mi][ni][e];
            }
}

template <WType T, bool WIDE, int kTileRows>
void launch_tile(const DevWeight& w, const DevAct& a, int64_t n, float* y, int64_t ys, cudaStream_t s) {
    const dim3 grid(unsigned((w.rows + kTileRows - 1) / kTileRows), unsigned((n + kTileTokens - 1) / kTileTokens));
    const int smem = int(sizeof(Stage<kTileRows>));
    // More than the default 48 KiB of shared memory needs the opt-in (per device;
    // cheap, and prefill launches are few). A failure here fails the launch,
    // which the caller's error check reports.
    cudaFuncSetAttribute(mmq_kernel<T, WIDE, kTileRows>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    mmq_kernel<T, WIDE, kTileRows><<<grid, kTileRows * 2, smem, s>>>(w, a, n, y, ys);
}

int tile_rows() {
    static const int rows = [] {
        const char* e = std::getenv("TERN_MMQ_ROWS");
        return e && std::atoi(e) == 64 ? 64 : 128;
    }();
    return rows;
}

template <WType T, bool WIDE>
void launch(const DevWeight& w, const DevAct& a, int64_t n, float* y, int64_t ys, cudaStream_t s) {
    if (tile_rows() == 64)
        launch_tile<T, WIDE, 64>(w, a, n, y, ys, s);
    else
        launch_tile<T, WIDE, 128>(w, a, n, y, ys, s);
}

}  // namespace

void mmq(const DevWeight& w, const DevAct& a, int64_t n, float* y, int64_t ys, cudaStream_t s) {
    if (n < 1 || w.rows < 1) return;
    dispatch_int_type(w.type, w.block_stride, [&](auto tag) {
        using Tag = decltype(tag);
        launch<Tag::type, Tag::wide>(w, a, n, y, ys, s);
    });
}

}  // namespace tern::cuda
