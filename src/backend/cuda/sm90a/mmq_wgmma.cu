// Prefill matmul of the K-quants (q4_K, q5_K, padded q6_K) on Hopper's
// warpgroup tensor cores: wgmma.mma_async, which exists only in sm_90a code,
// so this file is compiled for sm_90a alone and runs where the device is
// compute capability 9.0 (mmq_wgmma_runs).
//
// The tensor cores multiply bytes by bytes. A K-quant's sub-block scale does
// not fit that: its term is sum(sc * q * x), with sc * q up to 4,096. So the
// scaled weights enter as two byte operands and two products over the
// super-block give S_hi and S_lo, whose sum A = kHi S_hi + S_lo is the
// super-block's integer total of the other kernels (kernels.h), exactly:
// - q4_K, q5_K: the 6-bit scale splits as sc = 8 sh + sl (each 0..7), and
//   the values q (at most 31) times sh and times sl are unsigned bytes, four
//   to a word in one integer multiply (kHi = 8);
// - q6_K, whose int8 scales cover 16 elements: each scaled weight splits as
//   sc * q = 128 hi + lo (hi a small int8, lo in 0..127; kHi = 128).
// The mins' total X = sum_j m_j s_j (s_j the tokens' block sums) is one f16
// product of K 16 against the split sums (DevAct::sum_split, s = 64 hi + lo):
// a row holds 64 m_j then m_j, every product and sum an integer below 2^22,
// so the f32 outputs are X exactly. (An int8 product against the tokens
// themselves, a row holding m_j in every byte of sub-block j, took eight
// instructions of the tensor cores' time where this takes one; LOG g71.)
// Then one inner term per output and super-block, r = fma(D, inner, r) in
// super-block order from +0.0, with float(A) rounded once: mmq's bits, the
// CPU twin's (quant::dot_row_chunked).
// What bounds this kernel is the integer and float work its threads issue,
// not the tensor cores (LOG g68, g69), so that work is kept to a few
// instructions a word and an output.
//
// A CTA: 128 rows (two warpgroups of 64) by NT tokens. One thread streams
// super-blocks ahead into a ring of shared-memory stages by tensor copies
// (super_block_ring.cuh): the tokens in the 128-byte swizzle that wgmma
// reads from shared memory, the rows' blocks, the tokens' group scales and
// (q4_K, q5_K) their split sums. Each warpgroup decodes its rows'
// sub-blocks from the stage into the A fragments (registers) and issues
// the products; the tokens and their split sums are the B operands, read
// by the tensor cores from the stage itself.
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/lane_row.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/super_block_ring.cuh"
#include "backend/cuda/wgmma.cuh"

namespace tern::cuda {
namespace {

constexpr int kRows = 128;  // two warpgroups of 64 rows
constexpr int kWarps = 8;   // two a sub-partition: up to 255 registers a thread
constexpr int kThreads = 32 * kWarps;
constexpr int kRingBytes = 200 * 1024;

template <WType T, int NT>
using Ring = SuperBlockRing<kRows, ring_block_bytes(T), NT, kRingBytes, T != WType::Q6_K>;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// q6_K: four scaled weights (u - 32) * s, u the stored bytes (value + 32), as
// 128 hi + lo: hi an int8, lo in 0..127, a byte each. The products are formed
// two at a time in 16-bit lanes, each offset by 32,768 so that it stays in
// 0..65,535 (|w| <= 4,096) and no lane borrows from the next; 32,768 is 256 *
// 128, so a lane shifted right by 7 is hi + 256, whose low byte is hi, and
// its low seven bits are lo.
struct Split {
    int hi, lo;
};
__device__ __forceinline__ Split split_q6(int stored, int s) {
    const uint32_t c = uint32_t(32768 - 32 * s) * 0x00010001u;
    const uint32_t e = uint32_t(stored) & 0x00FF00FFu;         // values 0 and 2
    const uint32_t o = (uint32_t(stored) >> 8) & 0x00FF00FFu;  // values 1 and 3
    const uint32_t pe = e * uint32_t(s) + c, po = o * uint32_t(s) + c;
    return {int(__byte_perm(pe >> 7, po >> 7, 0x6240)), int(__byte_perm(pe, po, 0x6240) & 0x7F7F7F7Fu)};
}

// A warp's super-block in the making: the totals of its outputs (integers;
// the mins' exact in floats), written by the tensor cores while in flight,
// and its rows' float scales.
template <int NT, bool kMins>
struct Products {
    int hi[NT / 2], lo[NT / 2];
    float x[kMins ? NT / 2 : 1];
    float d[2], dmin[2];
};

// Issues the products of the super-block in stage st for rows lrow and
// lrow + 8 (and the rest of the warpgroup's 64) as one commit group.
template <WType T, bool WIDE, int NT, class P>
__device__ __forceinline__ void issue_products(const unsigned char* st, int lrow, int tig, P& p) {
    using R = Ring<T, NT>;
    constexpr bool has_min = T != WType::Q6_K;
    LaneRow<T, WIDE> rw[2];
    uint32_t mins[4] = {0, 0, 0, 0};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        rw[h].load(st + R::kWeightOffset + (lrow + 8 * h) * ring_block_bytes(T), tig);
        if constexpr (has_min) {
            p.d[h] = rw[h].hd.d();
            p.dmin[h] = rw[h].hd.dmin();
            const K4Header::MinsF16 mf = rw[h].hd.mins_f16(tig);
            mins[h] = mf.scaled;
            mins[2 + h] = mf.plain;
        } else {
            p.d[h] = rw[h].d;
            p.dmin[h] = 0.0f;
        }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        // A fragments: [row g, row g + 8] x [bytes 4tig.., 16 + 4tig..].
        int hi[4], lo[4];
#pragma unroll
        for (int f = 0; f < 4; ++f) {
            const int h = f & 1, half = f >> 1;
            if constexpr (has_min) {
                const int v = rw[h].vals(j, half);
                hi[f] = v * rw[h].hd.scale_high(j);
                lo[f] = v * rw[h].hd.scale_low(j);
            } else {
                const Split sp = split_q6(rw[h].stored(j, half), rw[h].scale(j, half));
                hi[f] = sp.hi;
                lo[f] = sp.lo;
            }
        }
        const uint64_t desc = wgmma_desc_sw128(st + (j >> 2) * R::kHalfBytes + (j & 3) * 32);
        wgmma_fence();  // the fragments were just written
        WgmmaS8<NT>::template run<has_min>(p.hi, hi, desc, j > 0);  // unsigned bytes where has_min
        WgmmaS8<NT>::template run<has_min>(p.lo, lo, desc, j > 0);
        if constexpr (has_min)
            if (j == 0) wgmma_f16_m64n64k16(p.x, mins, wgmma_desc_sw32(st + R::kSumOffset));
    }
    wgmma_commit_group();
}

// The super-block's term per output, its products done: output i is row
// lrow (+ 8 for odd i / 2), token 8(i / 4) + 2tig (+ 1 for odd i); the
// tokens' scales from stage st.
template <WType T, int NT, class P>
__device__ __forceinline__ void add_terms(const unsigned char* st, int tig, const P& p, float (&acc)[NT / 2]) {
    constexpr bool has_min = T != WType::Q6_K;
    constexpr int kHi = has_min ? 8 : 128;  // A = kHi S_hi + S_lo
    const float* scale = reinterpret_cast<const float*>(st + Ring<T, NT>::kScaleOffset);
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) {
        const int h = (i >> 1) & 1, t = 8 * (i >> 2) + 2 * tig + (i & 1);
        const float a = __int2float_rn(kHi * p.hi[i] + p.lo[i]);  // |A| < 2^28: exact, then one rounding
        float inner = __fmul_rn(p.d[h], a);
        if constexpr (has_min) inner = __fmaf_rn(-p.dmin[h], p.x[i], inner);
        acc[i] = __fmaf_rn(scale[8 * t], inner, acc[i]);
    }
}

#endif

// One CTA: rows blockIdx.x * 128.., tokens blockIdx.y * NT... Rows past the
// matrix and tokens past n arrive as zeros: computed, never stored. A warp
// waits for its super-block's products before forming their terms; the
// other warpgroup's products run meanwhile. (Overlapping a warp's own terms
// with its next products needs a second set of totals, and ptxas then
// serialized the products or spilled: slower, LOG g67.)
template <WType T, bool WIDE, int NT>
__global__ void __launch_bounds__(kThreads, 1)
    mmq_wgmma_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap qmap,
                     const __grid_constant__ CUtensorMap dmap, const __grid_constant__ CUtensorMap smap,
                     int64_t rows, int nsb, int64_t n,
                     float* __restrict__ y, int64_t y_stride) {
    wait_for_prior_grids();  // no early launch of the next grid (launch.cuh)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using R = Ring<T, NT>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const R ring(smem_raw);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = int(blockIdx.x) * kRows, tok0 = int(blockIdx.y) * NT;
    if (threadIdx.x == 0) ring.init(kWarps);
    __syncthreads();

    // Thread 0 also produces, kStages - 1 super-blocks ahead of the one its
    // warp computes: the stage it refills is the one its own warp released a
    // step before. It waits for the other warps to release it too, so
    // neither warpgroup runs more than about a super-block ahead of the other.
    constexpr int ahead = R::kStages - 1;
    if (threadIdx.x == 0)
        for (int kc = 0; kc < ahead && kc < nsb; ++kc) ring.produce(kc, wmap, qmap, dmap, row0, tok0, &smap);

    // Warp w holds rows 16w.. of the tile (warpgroup w / 4 the 64 from 64(w / 4)).
    const int tig = lane & 3;
    const int lrow = 16 * warp + (lane >> 2);  // and lrow + 8
    float acc[NT / 2];
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[i] = 0.0f;
    Products<NT, T != WType::Q6_K> p;
    for (int kc = 0; kc < nsb; ++kc) {
        if (threadIdx.x == 0 && kc + ahead < nsb) ring.produce(kc + ahead, wmap, qmap, dmap, row0, tok0, &smap);
        const unsigned char* st = ring.wait_full(kc);
        issue_products<T, WIDE, NT>(st, lrow, tig, p);
        wgmma_wait_group<0>();
        add_terms<T, NT>(st, tig, p, acc);
        ring.release(kc);
    }

    const int g = lane >> 2;
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) {
        const int64_t t = tok0 + 8 * (i >> 2) + 2 * tig + (i & 1);
        const int64_t row = row0 + 16 * warp + g + 8 * ((i >> 1) & 1);
        if (t < n && row < rows) y[t * y_stride + row] = acc[i];
    }
#endif
}

// Tokens per CTA: 64. 48 and 32 (less decode per token, fewer registers)
// measured slower, LOG g67.
constexpr int kTileTokens = 64;

template <WType T, bool WIDE>
bool launch_tile(const DevWeight& w, const DevAct& a, int64_t n, float* y, int64_t ys, cudaStream_t s) {
    RingMaps maps{};  // q6_K leaves the sums' map unused (no mins)
    if (!encode_ring_maps(maps, w, kRows, a, n, kTileTokens, T != WType::Q6_K)) return false;
    const dim3 grid(unsigned((w.rows + kRows - 1) / kRows), unsigned((n + kTileTokens - 1) / kTileTokens));
    auto* kernel = mmq_wgmma_kernel<T, WIDE, kTileTokens>;
    constexpr int smem = Ring<T, kTileTokens>::kSmem;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    launch(kernel, grid, kThreads, smem, s, maps.w, maps.q, maps.d, maps.s, w.rows, int(w.cols / 256), n, y, ys);
    return true;
}

// Whether this file's machine code loads on the current device (sm_90a
// code runs on compute capability 9.0 only); cached per device.
bool code_runs_here() {
    static PerDeviceAnswers answers;
    return ask_once_per_device(answers, [](int dev) {
        int major = 0, minor = 0;
        cudaFuncAttributes fa{};
        const bool runs = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                          cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                          major == 9 && minor == 0 &&
                          cudaFuncGetAttributes(&fa, mmq_wgmma_kernel<WType::Q4_K, false, kTileTokens>) == cudaSuccess;
        if (!runs) cudaGetLastError();  // not the error of a later launch
        return runs;
    });
}

}  // namespace

bool mmq_wgmma_runs(const DevWeight& w, const DevAct& a, int64_t n) {
    static const bool allowed = !switched_off("TERN_MMQ_WGMMA");
    // Token tiles are the grid's y dimension (at most 65,535); rows and
    // tokens are tensor-copy coordinates (int).
    if (!allowed || n < 1 || n > int64_t(65535) * kTileTokens || w.rows < 1 || w.rows > int64_t(INT32_MAX))
        return false;
    if (w.type != WType::Q4_K && w.type != WType::Q5_K && w.type != WType::Q6_K) return false;
    const bool mins = w.type != WType::Q6_K;  // the mins' product reads the split sums
    if (mins && !a.sum_split) return false;
    const uintptr_t addrs = reinterpret_cast<uintptr_t>(w.data) | reinterpret_cast<uintptr_t>(a.qs) |
                            reinterpret_cast<uintptr_t>(a.d) | (mins ? reinterpret_cast<uintptr_t>(a.sum_split) : 0);
    return w.block_stride == ring_block_bytes(w.type) && w.cols % 256 == 0 && w.row_stride % 16 == 0 && a.group == 8 &&
           a.blocks == w.cols / 32 && addrs % 16 == 0 && code_runs_here() && tensor_map_encoder();
}

bool mmq_wgmma(const DevWeight& w, const DevAct& a, int64_t n, float* y, int64_t ys, cudaStream_t s) {
    if (!mmq_wgmma_runs(w, a, n)) return false;
    switch (w.type) {
        case WType::Q4_K: return launch_tile<WType::Q4_K, false>(w, a, n, y, ys, s);
        case WType::Q5_K: return launch_tile<WType::Q5_K, false>(w, a, n, y, ys, s);
        case WType::Q6_K: return launch_tile<WType::Q6_K, true>(w, a, n, y, ys, s);
        default: return false;
    }
}

}  // namespace tern::cuda
