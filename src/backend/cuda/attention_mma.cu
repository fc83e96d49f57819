// Attention on the tensor cores (mma.sync m16n8k16, f16 inputs, f32
// accumulators), for head dims 32, 64, 96 and 128: prefill, decode and the
// split-KV segments all run this kernel, or for a decode batch of few units
// of work attention_mma_decode.cu's, which takes the same steps
// (attention_mma.cuh) in the same order, so a token gets the same bits
// whatever batch it comes in.
//
// Rows are (token, query head) pairs of one KV head: row r of a CTA is token
// t0 + r / group, head r % group. A warp owns 16 rows; a CTA stages chunks of
// 32 positions of K and V (f16, as cached) in shared memory for all its warps.
// Per chunk a warp forms S = Q K^T (16 rows x 32 positions), folds it into
// each row's online softmax (running max m, denominator l, as the CPU twin
// does per chunk of positions), and adds P V to its accumulators.
//
// Precision: K and V are f16 already, so their products with f16 operands
// are exact; q and the probabilities are f32 and go in as two f16 terms,
// hi = f16(x) and lo = f16(x - hi), each its own mma. That keeps about 22
// bits of q and p, near the f32 CUDA-core kernel's accuracy, for twice the
// tensor work (cheap: attention is far from the tensor-core roof).
//
// Determinism and batch independence: each row's arithmetic depends only on
// its own q, its slot's K/V and its position: positions are taken in the
// segments of attention_internal.cuh (one per CTA when splitting, else one
// after another, merged in shared memory), the chunk grid starts at each
// segment's first position, positions past a row's end are masked to a zero
// probability (and rows past every row's end are staged as zeros, so stale
// cache bytes never meet a multiply), and a chunk with no position for a row
// leaves its state untouched bit for bit (correction 1, products 0). Sums over
// a row's quad of lanes are butterflies, whose result is the same on every lane.
#include <cmath>

#include "backend/cuda/attention_internal.cuh"
#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/launch.cuh"

namespace tern::cuda::attn {
namespace {

constexpr int kMaxWarps = kMmaMaxGroup / kRowsPerWarp;
constexpr int kMaxTileTokens = 128;

template <int HD, bool kSplit>
__global__ void __launch_bounds__(kMaxWarps * 32)
    attention_mma_kernel(KvLayer kv, const float* __restrict__ q, MmaShape sh, int64_t n_tokens,
                         const int32_t* slot, const int32_t* pos, float* out, Partials part,
                         const int32_t* __restrict__ tile_start, int64_t n_tiles) {
    after_prior_grids();
    constexpr int KS = HD / 16;     // k steps of q.k
    constexpr int NT = HD / 8;      // n8 tiles of the accumulator
    constexpr int P = HD + 8;       // halves per staged row: ldmatrix rows land in distinct banks
    // Two buffers: the next chunk loads while this one is computed.
    __shared__ __align__(16) uint16_t k_tile[2][kChunk * P];
    __shared__ __align__(16) uint16_t v_tile[2][kChunk * P];
    __shared__ int pass_slot[kMaxTileTokens], pass_end[kMaxTileTokens];
    __shared__ int n_pass;
    // Direct: the merge of each row's finished segments, kept in shared
    // memory (registers would spill): this lane's accumulator element (j, c)
    // at ((warp * NT + j) * 4 + c) * 32 + lane, conflict-free.
    extern __shared__ float tot_smem[];

    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    const int g = lane >> 2, tig = lane & 3;
    const int kvh = int(blockIdx.x % unsigned(sh.n_kv_heads));
    // Heaviest tiles (latest tokens, longest contexts) first.
    const int64_t tile = n_tiles - 1 - int64_t(blockIdx.x / unsigned(sh.n_kv_heads));
    const int64_t t0 = tile_start ? tile_start[tile] : tile * sh.tile_tokens;
    const int64_t t_end = tile_start ? tile_start[tile + 1] : min(t0 + int64_t(sh.tile_tokens), n_tokens);
    if (t0 >= t_end) return;  // a table's empty tile: a graph's grid holds as many tiles as tokens
    const int n_rows = int(t_end - t0) * sh.group;
    constexpr bool split = kSplit;  // part.acc is set
    const int begin = split ? int(blockIdx.y) * sh.seg_len : 0;
    const int seg_end = split ? begin + sh.seg_len : kv.n_ctx;

    // This lane's two rows: g and g + 8 of the warp's sixteen.
    bool live[2], cached[2];
    int row_slot[2], row_end[2];
    int64_t out_row[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = warp * kRowsPerWarp + g + 8 * h;
        const int64_t t = t0 + r / sh.group;
        live[h] = r < n_rows && t < t_end;
        cached[h] = false;
        row_slot[h] = -1;
        row_end[h] = 0;
        out_row[h] = t * sh.n_heads + int64_t(kvh) * sh.group + r % sh.group;
        if (live[h]) {
            const int32_t s = slot[t], p = pos[t];
            cached[h] = in_cache(kv, s, p);
            if (cached[h]) {
                row_slot[h] = s;
                row_end[h] = min(p + 1, seg_end);
            } else if (!split) {
                store_nan_row<HD, NT>(out, out_row[h], tig);  // in split mode the combine writes it
            }
        }
    }

    // The tile's slots in order of first appearance, each with its furthest
    // position: one pass over the chunks per slot (one pass but for batches
    // that mix sequences in a tile).
    if (threadIdx.x == 0) {
        int n = 0;
        for (int64_t u = t0; u < t_end; ++u) {
            const int32_t s = slot[u], p = pos[u];
            if (!in_cache(kv, s, p)) continue;
            int i = 0;
            while (i < n && pass_slot[i] != s) ++i;
            if (i == n) {
                pass_slot[n] = s;
                pass_end[n++] = 0;
            }
            pass_end[i] = max(pass_end[i], p + 1);
        }
        n_pass = n;
    }
    __syncthreads();
    // A split segment past every row's end has nothing to compute or write (the
    // combine reads no segment at or past a row's end). Decode graphs launch
    // segments for the whole cache, so most of them leave here, CTA-uniformly.
    if (split) {
        int furthest = 0;
        for (int ps = 0; ps < n_pass; ++ps) furthest = max(furthest, pass_end[ps]);
        if (furthest <= begin) return;
    }

    // q as hi/lo f16 A fragments (load_q). A split CTA (one segment of one
    // token) loads them once its first chunk is under way, so the two
    // latencies overlap; in the direct kernels that order cost pp512 at depth
    // 4096 0.8%, so they load q first.
    unsigned qa_hi[KS][4], qa_lo[KS][4];
    auto load_q_fragments = [&]() { load_q<HD>(q, cached, out_row, tig, qa_hi, qa_lo); };
    if constexpr (!split) load_q_fragments();

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    // Direct: the merge of each row's finished segments (m and l here, acc in
    // tot_smem); the running state above starts afresh at every segment boundary.
    auto tot_acc = [&](int j, int c) -> float& { return tot_smem[((warp * NT + j) * 4 + c) * 32 + lane]; };
    float tot_m[2] = {-INFINITY, -INFINITY}, tot_l[2] = {0.0f, 0.0f};
    if constexpr (!split) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) tot_acc(j, c) = 0.0f;
    }
    auto merge_segment = [&]() { attn::merge_segment<NT>(m, l, acc, tot_m, tot_l, tot_acc); };

    for (int ps = 0; ps < n_pass; ++ps) {
        const int s = pass_slot[ps];
        const int stage_end = min(pass_end[ps], seg_end);
        int end[2];  // this pass's end for each of the lane's rows (0: not in this pass)
#pragma unroll
        for (int h = 0; h < 2; ++h) end[h] = row_slot[h] == s ? row_end[h] : 0;
        const int warp_end = __reduce_max_sync(kAll, unsigned(max(end[0], end[1])));
        // Whether any of the warp's rows 8..15 is in this pass. A row outside
        // it keeps its state bit for bit (correction 1, probabilities 0), so
        // skipping that half's softmax changes nothing. Split decode warps with
        // at most 8 rows (one token, a GQA group of up to 8) skip it always;
        // the direct kernels' tiles are mostly full and keep their code.
        const bool upper_live = !split || __any_sync(kAll, end[1] > 0);
        const SlotRows k_rows = slot_rows(kv.k, kv, s, kvh);
        const SlotRows v_rows = slot_rows(kv.v, kv, s, kvh);

        // Chunk i computes from buffer i % 2 while chunk i + 1 loads into the other.
        auto issue = [&](int c0) {
            const int buf = ((c0 - begin) / kChunk) & 1, n = min(kChunk, stage_end - c0);
            stage_async<HD, P>(k_rows, c0, n, k_tile[buf], int(threadIdx.x), int(blockDim.x));
            stage_async<HD, P>(v_rows, c0, n, v_tile[buf], int(threadIdx.x), int(blockDim.x));
            cp_async_commit();
        };
        __syncthreads();  // the previous pass's warps are done with both buffers
        if (begin < stage_end) issue(begin);
        if constexpr (split) {
            if (ps == 0) load_q_fragments();
        }
        for (int c0 = begin; c0 < stage_end; c0 += kChunk) {
            const int buf = ((c0 - begin) / kChunk) & 1;
            if constexpr (!split) {
                if (c0 != begin && c0 % sh.seg_len == 0) merge_segment();
            }
            __syncthreads();  // every warp is done with the buffer the next issue overwrites
            if (c0 + kChunk < stage_end) {
                issue(c0 + kChunk);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();  // this chunk's bytes are visible to every warp
            if (c0 >= warp_end) continue;  // warp-uniform: no row of this warp reaches the chunk
            const uint16_t* k_chunk = k_tile[buf];
            const uint16_t* v_chunk = v_tile[buf];

            float sc[4][4];
            chunk_scores<HD, P>(qa_hi, qa_lo, k_chunk, lane, sc);
            float p[2][8];
            fold_rows(sc, c0, tig, end, sh.scale, upper_live, m, l, acc, p);
            add_pv<NT, P>(acc, p, upper_live, v_chunk, 0, lane);
        }
        if constexpr (!split) merge_segment();  // the pass's rows end here
    }

#pragma unroll
    for (int h = 0; h < 2; ++h) {
        if (!cached[h] || row_end[h] <= begin) continue;  // split: the combine does not read this segment
        if (split)
            store_partial<HD>(part, out_row[h] * part.n_seg + blockIdx.y, h, acc, 0, tig, m[h], l[h], true);
        else
            store_output<HD, NT>(out, out_row[h], h, tot_acc, tot_l[h], 0, tig);
    }
}

// The direct kernels' merged accumulators take up to kMaxWarps warps x 16
// rows x HD floats of dynamic shared memory, past the default 48 KiB.
template <int HD>
bool allow_direct_smem() {
    const int bytes = kMaxWarps * kRowsPerWarp * HD * int(sizeof(float));
    return cudaFuncSetAttribute(attention_mma_kernel<HD, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                bytes) == cudaSuccess;
}

}  // namespace

bool mma_takes(int group, int head_dim) {
    return group >= 1 && group <= kMmaMaxGroup && head_dim >= 32 && head_dim <= 128 && head_dim % 32 == 0;
}

void attention_mma(const KvLayer& kv, const float* q, int64_t n_tokens, int n_heads, float scale,
                   const int32_t* slot, const int32_t* pos, float* out, Partials part, int seg_len,
                   int tile_tokens, const int32_t* tile_start, int64_t n_tiles, bool few_units,
                   cudaStream_t stream) {
    MmaShape sh;
    sh.n_heads = n_heads;
    sh.n_kv_heads = kv.n_kv_heads;
    sh.group = n_heads / kv.n_kv_heads;
    sh.tile_tokens = tile_tokens;
    sh.seg_len = seg_len;
    sh.scale = scale;
    if (few_units && mma_decode_takes(sh.group, tile_tokens, tile_start)) {
        attention_mma_decode(kv, q, n_tokens, sh, slot, pos, out, part, stream);
        return;
    }
    const int rows = tile_tokens * sh.group;  // the caller keeps this <= kMmaMaxGroup
    const unsigned threads = unsigned((rows + kRowsPerWarp - 1) / kRowsPerWarp * 32);
    const int64_t tiles = tile_start ? n_tiles : (n_tokens + tile_tokens - 1) / tile_tokens;
    const bool split = part.acc != nullptr;
    const dim3 grid(unsigned(tiles * kv.n_kv_heads), split ? unsigned(part.n_seg) : 1u);
    // Set once per process, before any launch (and so before any graph capture).
    static const bool smem_ok = allow_direct_smem<32>() && allow_direct_smem<64>() && allow_direct_smem<96>() &&
                                allow_direct_smem<128>();
    (void)smem_ok;  // a failure shows as the launch's error
    auto run = [&](auto kernel, int hd) {
        // Direct: the merged accumulators, a warp's 16 rows x hd floats.
        const size_t smem = split ? 0 : size_t(threads / 32) * size_t(kRowsPerWarp) * size_t(hd) * sizeof(float);
        launch(kernel, grid, threads, smem, stream, kv, q, sh, n_tokens, slot, pos, out, part, tile_start, tiles);
    };
    switch (kv.head_dim) {
        case 32: split ? run(attention_mma_kernel<32, true>, 32) : run(attention_mma_kernel<32, false>, 32); break;
        case 64: split ? run(attention_mma_kernel<64, true>, 64) : run(attention_mma_kernel<64, false>, 64); break;
        case 96: split ? run(attention_mma_kernel<96, true>, 96) : run(attention_mma_kernel<96, false>, 96); break;
        case 128: split ? run(attention_mma_kernel<128, true>, 128) : run(attention_mma_kernel<128, false>, 128); break;
        default: break;  // mma_takes refused it
    }
}

}  // namespace tern::cuda::attn
