// Decode matmul (1..8 tokens, one to three matrices per launch): one warp per
// weight row. A warp takes four
// chunks (eight 32-element blocks each: a K-quant super-block, or eight legacy
// blocks) per round, one block per lane, so consecutive lanes read consecutive
// bytes of the row and of the activations. A chunk's terms are summed left to
// right across its eight lanes, and the chunks in order: the order kernels.h
// documents, the same bits as mmq.
#include "backend/cuda/block_decode.cuh"
#include "backend/cuda/kernels.h"

namespace tern::cuda {
namespace {

constexpr int kWarps = 4;
constexpr unsigned kAll = 0xffffffffu;

// Up to kMmvqMaxWeights matrices of one type and width that read the same
// activations (q/k/v, gate/up), launched as one grid: warp r takes row r of
// their rows stacked.
struct Targets {
    struct Segment {
        const uint8_t* data;
        int64_t rows, row_stride;
        float* y;
        int64_t y_stride;
    } seg[kMmvqMaxWeights];
    int64_t cols = 0, total_rows = 0;
    int block_stride = 0;
};

template <WType T, bool WIDE, int NT>
__global__ void __launch_bounds__(kWarps * 32) mmvq_kernel(Targets tg, DevAct a) {
    const int lane = threadIdx.x & 31, grp = lane >> 3, j = lane & 7;
    int64_t row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (row >= tg.total_rows) return;  // uniform per warp
    int s = 0;
    while (s + 1 < kMmvqMaxWeights && row >= tg.seg[s].rows) row -= tg.seg[s++].rows;
    const uint8_t* const data = tg.seg[s].data;
    float* const y = tg.seg[s].y;
    const int64_t y_stride = tg.seg[s].y_stride;
    const int64_t nblocks = tg.cols / 32;
    const int64_t nchunks = (nblocks + 7) / 8;
    const uint8_t* rowp = data + row * tg.seg[s].row_stride;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.0f;

#pragma unroll 4
    for (int64_t base = 0; base < nchunks; base += 4) {
        const int64_t ci = base + grp;        // this lane's chunk
        const int64_t b = ci * 8 + j;         // and block
        const int nb = ci < nchunks ? int(min64(8, nblocks - ci * 8)) : 0;
        float term[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) term[t] = 0.0f;
        if (j < nb) {
            const BlockVals v = decode_block<T, WIDE>(chunk_ptr<T>(rowp, ci, tg.block_stride), j);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const int64_t ab = int64_t(t) * a.blocks + b;
                int x[8];
                load32_aligned(reinterpret_cast<const uint8_t*>(a.qs + ab * 32), x);
                int H0 = 0, H1 = 0;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    H0 = __dp4a(v.q[i], x[i], H0);
                    H1 = __dp4a(v.q[i + 4], x[i + 4], H1);
                }
                term[t] = block_term<T>(v, H0, H1, a.d[ab], a.sum[ab]);
            }
        }
        // Chunk sums, left to right over the group's lanes (every lane of a
        // group ends with its group's sum).
        float c[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) c[t] = __shfl_sync(kAll, term[t], grp * 8);
#pragma unroll
        for (int jj = 1; jj < 8; ++jj)
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const float o = __shfl_sync(kAll, term[t], grp * 8 + jj);
                if (jj < nb) c[t] = __fadd_rn(c[t], o);
            }
        // Then the round's chunks in order.
        const int n_here = int(min64(4, nchunks - base));
#pragma unroll
        for (int g2 = 0; g2 < 4; ++g2)
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const float o = __shfl_sync(kAll, c[t], g2 * 8);
                if (g2 < n_here) acc[t] = __fadd_rn(acc[t], o);
            }
    }
    if (lane < NT) {
        float mine = acc[0];
#pragma unroll
        for (int t = 1; t < NT; ++t)
            if (lane == t) mine = acc[t];
        y[int64_t(lane) * y_stride + row] = mine;
    }
}

template <WType T, bool WIDE>
void launch(const Targets& tg, const DevAct& a, int n, cudaStream_t s) {
    const unsigned grid = unsigned((tg.total_rows + kWarps - 1) / kWarps);
    const int threads = kWarps * 32;
    switch (n) {
        case 1: mmvq_kernel<T, WIDE, 1><<<grid, threads, 0, s>>>(tg, a); break;
        case 2: mmvq_kernel<T, WIDE, 2><<<grid, threads, 0, s>>>(tg, a); break;
        case 3: mmvq_kernel<T, WIDE, 3><<<grid, threads, 0, s>>>(tg, a); break;
        case 4: mmvq_kernel<T, WIDE, 4><<<grid, threads, 0, s>>>(tg, a); break;
        case 5: mmvq_kernel<T, WIDE, 5><<<grid, threads, 0, s>>>(tg, a); break;
        case 6: mmvq_kernel<T, WIDE, 6><<<grid, threads, 0, s>>>(tg, a); break;
        case 7: mmvq_kernel<T, WIDE, 7><<<grid, threads, 0, s>>>(tg, a); break;
        default: mmvq_kernel<T, WIDE, 8><<<grid, threads, 0, s>>>(tg, a); break;
    }
}

}  // namespace

bool mmvq_batchable(const DevWeight& a, const DevWeight& b) {
    return a.type == b.type && a.cols == b.cols && a.block_stride == b.block_stride;
}

void mmvq_batch(const DevWeight* const* w, float* const* y, const int64_t* y_stride, int count, const DevAct& a,
                int n, cudaStream_t s) {
    if (n < 1 || n > kMmvqMaxTokens || count < 1 || count > kMmvqMaxWeights) return;
    Targets tg{};
    for (int i = 0; i < count; ++i) {
        if (!mmvq_batchable(*w[0], *w[i])) return;
        tg.seg[i] = {w[i]->data, w[i]->rows, w[i]->row_stride, y[i], y_stride[i]};
        tg.total_rows += w[i]->rows;
    }
    tg.cols = w[0]->cols;
    tg.block_stride = w[0]->block_stride;
    if (tg.total_rows < 1) return;
    switch (w[0]->type) {
        case WType::Q4_0: launch<WType::Q4_0, false>(tg, a, n, s); break;
        case WType::Q4_1: launch<WType::Q4_1, false>(tg, a, n, s); break;
        case WType::Q5_0: launch<WType::Q5_0, false>(tg, a, n, s); break;
        case WType::Q5_1: launch<WType::Q5_1, false>(tg, a, n, s); break;
        case WType::Q8_0: launch<WType::Q8_0, false>(tg, a, n, s); break;
        case WType::Q4_K: launch<WType::Q4_K, false>(tg, a, n, s); break;
        case WType::Q5_K: launch<WType::Q5_K, false>(tg, a, n, s); break;
        case WType::Q6_K:
            if (tg.block_stride % 16 == 0)
                launch<WType::Q6_K, true>(tg, a, n, s);
            else
                launch<WType::Q6_K, false>(tg, a, n, s);
            break;
        default: break;
    }
}

void mmvq(const DevWeight& w, const DevAct& a, int n, float* y, int64_t ys, cudaStream_t s) {
    const DevWeight* ws[1] = {&w};
    float* yy[1] = {y};
    const int64_t st[1] = {ys};
    mmvq_batch(ws, yy, st, 1, a, n, s);
}

}  // namespace tern::cuda
