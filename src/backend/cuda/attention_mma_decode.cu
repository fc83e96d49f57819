// The tensor-core attention of one token per CTA whose rows (its query heads
// of one KV head) fit one warp's sixteen: decode steps and small batches.
//
// attention_mma.cu gives such a CTA one warp, which walks the positions a
// chunk at a time: the chunk's scores (S = q K^T, 32 products in chains of
// 16), its softmax, then P V over the whole head (64 products), one chunk
// after another. At short contexts that chain was the whole kernel, on as
// many CTAs as the model has KV heads (LOG g77, g78). Here four warps take a
// round of four chunks (128 positions, which segments are a multiple of):
//   1. each warp loads its chunk's K and V rows and computes its chunk's
//      scores, side by side, into shared memory;
//   2. every warp folds the round's chunks into the rows' online softmax in
//      order (the same running max, weights and denominator in each warp)
//      and adds P V for its share of the head's dims.
// Each value goes through the steps of attention_mma.cuh in the order the
// one-warp kernel takes them (a dim's products form the same chain), so the
// bits are that kernel's: the choice between them depends on the batch and
// never changes a result (attention_internal.cuh).
//
// Early: the token's slot and position, and the page-table entries, are read
// before the wait for the previous kernel (launch.cuh); the cache's rows and
// q are read after it, since the step's own tokens write them.
#include <cmath>

#include "backend/cuda/attention_internal.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/launch.cuh"

namespace tern::cuda::attn {
namespace {

constexpr int kWarps = 4;                 // chunks of a round
constexpr int kRound = kWarps * kChunk;   // positions of a round
constexpr int kScores = 16;               // a lane's values of one chunk's S: sc[4][4]

// Warps that share P V: the largest count up to kWarps that divides the
// head's n8 tile pairs (one ldmatrix_x4 each), so every warp takes whole pairs.
__host__ __device__ constexpr int pv_warps(int pairs) {
    int w = kWarps;
    while (pairs % w != 0) --w;
    return w;
}

template <int HD>
constexpr size_t decode_smem_bytes() {
    constexpr int P = HD + 8;
    return size_t(2 * kWarps * kChunk * P) * sizeof(uint16_t) + size_t(kWarps * kScores * 32) * sizeof(float);
}

template <int HD, bool kSplit, bool kEarly>
__global__ void __launch_bounds__(kWarps * 32)
    attention_mma_decode_kernel(KvLayer kv, const float* __restrict__ q, MmaShape sh, int64_t n_tokens,
                                const int32_t* slot, const int32_t* pos, float* out, Partials part) {
    constexpr int NT = HD / 8;                 // n8 tiles of the head's dims
    constexpr int kPvWarps = pv_warps(NT / 2);
    constexpr int NW = NT / kPvWarps;          // tiles of a P V warp
    constexpr int P = HD + 8;                  // halves per staged row: ldmatrix rows land in distinct banks
    constexpr bool split = kSplit;             // part.acc is set
    // K chunks of the round, V chunks, then each chunk's scores: this lane's
    // value v of chunk w at (w * kScores + v) * 32 + lane, conflict-free.
    extern __shared__ __align__(16) uint16_t smem[];
    uint16_t* const k_tiles = smem;
    uint16_t* const v_tiles = smem + kWarps * kChunk * P;
    float* const scores = reinterpret_cast<float*>(v_tiles + kWarps * kChunk * P);

    if constexpr (!kEarly) after_prior_grids();
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int g = lane >> 2, tig = lane & 3;
    const int kvh = int(blockIdx.x % unsigned(sh.n_kv_heads));
    // Latest tokens (longest contexts) first, as attention_mma.cu orders them.
    const int64_t t = n_tokens - 1 - int64_t(blockIdx.x / unsigned(sh.n_kv_heads));
    const int32_t s = slot[t], last = pos[t];
    const int begin = split ? int(blockIdx.y) * sh.seg_len : 0;
    const int seg_end = split ? begin + sh.seg_len : kv.n_ctx;
    // This lane's two rows: g and g + 8 of the warp's sixteen, all of token t.
    bool live[2];
    int64_t out_row[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = g + 8 * h;
        live[h] = r < sh.group;
        out_row[h] = t * sh.n_heads + int64_t(kvh) * sh.group + r % sh.group;
    }
    // Every return below is CTA-uniform and comes before the first barrier.
    if (!in_cache(kv, s, last)) {
        if constexpr (kEarly) after_prior_grids();  // before writing out
        if (!split && warp == 0) {  // in split mode the combine writes the NaN row
#pragma unroll
            for (int h = 0; h < 2; ++h)
                if (live[h]) store_nan_row<HD, NT>(out, out_row[h], tig);
        }
        return;
    }
    const int stop = min(last + 1, seg_end);  // every row's end: one token
    // A split segment past the token's end: the combine does not read it.
    // The CTA holding the token's last position always waits, so no grid of
    // this kernel completes before the grids it follows.
    if (stop <= begin) return;
    const SlotRows k_rows = slot_rows(kv.k, kv, s, kvh);
    const SlotRows v_rows = slot_rows(kv.v, kv, s, kvh);
    if constexpr (kEarly) {
        // The page-table entry of this warp's first chunk into L1 for the first issue (K and V share the table).
        const int mine = begin + warp * kChunk;
        if (mine < stop) asm volatile("prefetch.global.L1 [%0];" ::"l"(k_rows.pages + mine / k_rows.page_size));
        after_prior_grids();
    }
    // Split decode rows of at most 8 (a GQA group of up to 8) leave rows 8..15
    // out of the softmax, as attention_mma.cu does: they keep their state bit
    // for bit either way.
    const bool upper_live = !split || sh.group > 8;
    const int end[2] = {live[0] ? stop : 0, live[1] ? stop : 0};

    // Warp w stages chunk w of the round at r0: K, then V, a commit group each.
    uint16_t* const my_k = k_tiles + warp * kChunk * P;
    auto issue = [&](int r0) {
        const int c0 = r0 + warp * kChunk;
        if (c0 >= stop) return;
        const int n = min(kChunk, stop - c0);
        stage_async<HD, P>(k_rows, c0, n, my_k, lane, 32);
        cp_async_commit();
        stage_async<HD, P>(v_rows, c0, n, v_tiles + warp * kChunk * P, lane, 32);
        cp_async_commit();
    };
    issue(begin);

    unsigned qa_hi[HD / 16][4], qa_lo[HD / 16][4];
    load_q<HD>(q, live, out_row, tig, qa_hi, qa_lo);  // the token is in the cache: live rows are cached

    // This warp's P V tiles (none for warps past kPvWarps) and their state.
    const int j0 = warp * NW;
    const bool pv = warp < kPvWarps;
    float acc[NW][4];
#pragma unroll
    for (int j = 0; j < NW; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    // Direct: the merge of the finished segments; the state above starts
    // afresh at every segment boundary.
    float tot[NW][4];
#pragma unroll
    for (int j = 0; j < NW; ++j) tot[j][0] = tot[j][1] = tot[j][2] = tot[j][3] = 0.0f;
    float tot_m[2] = {-INFINITY, -INFINITY}, tot_l[2] = {0.0f, 0.0f};
    auto tot_acc = [&](int j, int c) -> float& { return tot[j][c]; };

    for (int r0 = begin; r0 < stop; r0 += kRound) {
        if (r0 != begin) {
            __syncthreads();  // every warp is done with the last round's V rows and scores
            issue(r0);
        }
        // 1. This warp's chunk's scores, once its K rows are in (V may still load).
        const int c0 = r0 + warp * kChunk;
        if (c0 < stop) {
            cp_async_wait<1>();
            __syncwarp();  // the other lanes' copies are visible
            float sc[4][4];
            chunk_scores<HD, P>(qa_hi, qa_lo, my_k, lane, sc);
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) scores[(warp * kScores + 4 * i + e) * 32 + lane] = sc[i][e];
        }
        cp_async_wait<0>();
        __syncthreads();  // every chunk's scores and V rows are visible to every warp

        // 2. The round's chunks in order: the softmax, then P V on this warp's tiles.
        for (int w = 0; w < kWarps; ++w) {
            const int cw = r0 + w * kChunk;
            if (cw >= stop) break;  // no row reaches it, nor the chunks after it
            if constexpr (!split) {
                if (cw != begin && cw % sh.seg_len == 0) merge_segment<NW>(m, l, acc, tot_m, tot_l, tot_acc);
            }
            float sc[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) sc[i][e] = scores[(w * kScores + 4 * i + e) * 32 + lane];
            float p[2][8];
            fold_rows(sc, cw, tig, end, sh.scale, upper_live, m, l, acc, p);
            if (pv) add_pv<NW, P>(acc, p, upper_live, v_tiles + w * kChunk * P, j0, lane);
        }
    }
    if constexpr (!split) merge_segment<NW>(m, l, acc, tot_m, tot_l, tot_acc);

    if (!pv) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (!live[h]) continue;
        if (split)
            store_partial<HD>(part, out_row[h] * part.n_seg + blockIdx.y, h, acc, j0, tig, m[h], l[h], warp == 0);
        else
            store_output<HD, NW>(out, out_row[h], h, tot_acc, tot_l[h], j0, tig);
    }
}

template <int HD, bool kSplit, bool kEarly>
void launch_decode(const KvLayer& kv, const float* q, int64_t n_tokens, const MmaShape& sh, const int32_t* slot,
                   const int32_t* pos, float* out, const Partials& part, cudaStream_t stream) {
    const auto kernel = attention_mma_decode_kernel<HD, kSplit, kEarly>;
    constexpr size_t smem = decode_smem_bytes<HD>();
    // Past the default 48 KiB for the wider heads. Set once per process,
    // before any launch and so before any graph capture.
    static const bool smem_ok =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) == cudaSuccess;
    (void)smem_ok;  // a failure shows as the launch's error
    const dim3 grid(unsigned(n_tokens * kv.n_kv_heads), kSplit ? unsigned(part.n_seg) : 1u);
    launch(kernel, grid, kWarps * 32, smem, stream, kv, q, sh, n_tokens, slot, pos, out, part);
}

template <int HD>
void launch_decode(const KvLayer& kv, const float* q, int64_t n_tokens, const MmaShape& sh, const int32_t* slot,
                   const int32_t* pos, float* out, const Partials& part, cudaStream_t stream) {
    with_flag(part.acc != nullptr, [&](auto split) {
        with_flag(early_reads_on(), [&](auto early) {
            launch_decode<HD, decltype(split)::value, decltype(early)::value>(kv, q, n_tokens, sh, slot, pos, out,
                                                                               part, stream);
        });
    });
}

}  // namespace

bool mma_decode_takes(int group, int tile_tokens, const int32_t* tile_start) {
    // TERN_ATTN_DECODE_WARPS=0 keeps these launches on attention_mma.cu's
    // one-warp CTAs, for A/B measurements (the bits are the same).
    static const bool on = !switched_off("TERN_ATTN_DECODE_WARPS");
    return on && tile_tokens == 1 && tile_start == nullptr && group >= 1 && group <= kRowsPerWarp;
}

void attention_mma_decode(const KvLayer& kv, const float* q, int64_t n_tokens, const MmaShape& sh,
                          const int32_t* slot, const int32_t* pos, float* out, const Partials& part,
                          cudaStream_t stream) {
    switch (kv.head_dim) {
        case 32: launch_decode<32>(kv, q, n_tokens, sh, slot, pos, out, part, stream); break;
        case 64: launch_decode<64>(kv, q, n_tokens, sh, slot, pos, out, part, stream); break;
        case 96: launch_decode<96>(kv, q, n_tokens, sh, slot, pos, out, part, stream); break;
        case 128: launch_decode<128>(kv, q, n_tokens, sh, slot, pos, out, part, stream); break;
        default: break;  // mma_takes refused it
    }
}

}  // namespace tern::cuda::attn
