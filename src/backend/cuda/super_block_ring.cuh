// A ring of shared-memory stages that tensor copies (TMA) fill super-block
// by super-block, for the K-quant kernels that stream: mmq_batch's streamed
// kernel (decode of many sequences) and mmq_wgmma (prefill). A stage holds
// super-block kc of a row tile and of a token tile:
// - the tokens' first and second 128-byte halves of the super-block, NT rows
//   of 128 bytes each in the 128-byte swizzle (16-byte chunk c of token t at
//   c ^ (t % 8)): ldmatrix's eight rows fall on distinct banks, and it is the
//   layout wgmma reads as a shared-memory operand;
// - the rows' blocks, as registered (q6_K padded: the copies take whole
//   16-byte multiples);
// - each token's eight block scales (the group scale first);
// - where kSums, each token's split block sums (DevAct::sum_split, 32 bytes)
//   in the 32-byte swizzle (16-byte chunk c of token t at c ^ (t / 4 % 2)),
//   which wgmma reads as a 16-bit operand of K 16.
// Rows past the matrix and tokens past the last arrive as zeros.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tensor_map.h"
#include "quant/act_quant.h"

namespace tern::cuda {

// The registered block the copies take whole.
__host__ __device__ constexpr int ring_block_bytes(WType t) {
    return t == WType::Q4_K ? 144 : t == WType::Q5_K ? 176 : 224;
}

// kRows rows of kBlockBytes blocks by NT tokens (a multiple of 8) a stage;
// as many stages as kBudget bytes hold, up to eight (kSmem adds the
// alignment slack and the barriers).
template <int kRows, int kBlockBytes, int NT, int kBudget, bool kSums = false>
struct SuperBlockRing {
    static constexpr int kHalfBytes = NT * 128;
    static constexpr int kWeightOffset = 2 * kHalfBytes;
    static constexpr int kScaleOffset = kWeightOffset + kRows * kBlockBytes;
    static constexpr int kSumOffset = (kScaleOffset + NT * 32 + 1023) / 1024 * 1024;  // a whole swizzle pattern
    // The bytes a stage's copies bring (what its `full` barrier waits for),
    // and the bytes it spans, the gap before the sums included.
    static constexpr int kCopyBytes = kScaleOffset + NT * 32 + (kSums ? NT * 32 : 0);
    static constexpr int kExtent = kSums ? kSumOffset + NT * 32 : kScaleOffset + NT * 32;
    static constexpr int kStageBytes = (kExtent + 1023) / 1024 * 1024;  // swizzled halves land 1024-aligned
    static constexpr int kStages = kBudget / kStageBytes < 8 ? kBudget / kStageBytes : 8;
    // Dynamic shared memory: the stages (after up to 1,023 bytes of alignment),
    // then a `full` and an `empty` mbarrier a stage.
    static constexpr int kSmem = 1024 + kStages * kStageBytes + 2 * kStages * int(sizeof(uint64_t));
    static_assert(kStages >= 2, "a ring of at least two stages");
    static_assert(kHalfBytes % 1024 == 0, "each swizzled half starts 1024-aligned");
    static_assert(kWeightOffset % 128 == 0 && kScaleOffset % 128 == 0, "tensor copies land 128-byte aligned");
    static_assert(kSumOffset % 1024 == 0, "the swizzled sums start 1024-aligned");

    unsigned char* base;
    uint64_t* full;   // a stage has landed
    uint64_t* empty;  // its consumers are done with it

    __device__ explicit SuperBlockRing(unsigned char* smem_raw)
        : base(smem_raw + ((1024 - smem_addr(smem_raw) % 1024) % 1024)),
          full(reinterpret_cast<uint64_t*>(base + kStages * kStageBytes)),
          empty(full + kStages) {}

    __device__ unsigned char* stage(int s) const { return base + s * kStageBytes; }

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    // One thread: the barriers, `empty` completing on `consumers` arrivals.
    __device__ void init(int consumers) const {
        for (int s = 0; s < kStages; ++s) {
            mbarrier_init(&full[s]);
            mbarrier_init(&empty[s], consumers);
        }
    }

    // One thread: super-block kc of rows row0.. and tokens tok0.. into its
    // stage, once the consumers are done with the super-block that stage
    // held before (kc - kStages).
    __device__ void produce(int kc, const CUtensorMap& wmap, const CUtensorMap& qmap, const CUtensorMap& dmap,
                            int row0, int tok0, const CUtensorMap* smap = nullptr) const {
        const int s = kc % kStages;
        const unsigned use = unsigned(kc / kStages);
        if (use > 0) mbarrier_wait(&empty[s], (use - 1) & 1);
        unsigned char* st = stage(s);
        mbarrier_expect_bytes(&full[s], kCopyBytes);
        tensor_copy(st, qmap, 256 * kc, tok0, &full[s]);
        tensor_copy(st + kHalfBytes, qmap, 256 * kc + 128, tok0, &full[s]);
        tensor_copy(st + kWeightOffset, wmap, kBlockBytes * kc, row0, &full[s]);
        tensor_copy(st + kScaleOffset, dmap, 8 * kc, tok0, &full[s]);
        if constexpr (kSums) tensor_copy(st + kSumOffset, *smap, 32 * kc, tok0, &full[s]);
    }

    // Until super-block kc has landed; its stage. The warp leaves together:
    // its lanes may leave the wait's loop at different turns, and what
    // follows (ldmatrix, mma, wgmma) is .aligned.
    __device__ const unsigned char* wait_full(int kc) const {
        const int s = kc % kStages;
        mbarrier_wait(&full[s], unsigned(kc / kStages) & 1);
        __syncwarp();
        return stage(s);
    }

    // A consumer warp is done with super-block kc's stage.
    __device__ void release(int kc) const {
        fence_shared_for_bulk_copies();  // this stage's reads before its next copies
        __syncwarp();
        if ((threadIdx.x & 31) == 0) mbarrier_arrive(&empty[kc % kStages]);
    }
#endif
};

// The maps the copies read: weights (a row's bytes by rows, boxes of one
// block by box_rows), the tokens' int8 blocks (bytes by tokens, 128-byte
// boxes by box_tokens, swizzled), their scales (floats by tokens, eight by
// box_tokens), with `sums` their split sums (bytes by tokens, 32-byte boxes
// by box_tokens, swizzled). False where the driver cannot describe them.
struct RingMaps {
    CUtensorMap w, q, d, s;
};
inline bool encode_ring_maps(RingMaps& m, const DevWeight& w, int box_rows, const DevAct& a, int64_t n,
                             int box_tokens, bool sums = false) {
    const uint64_t split_bytes = uint64_t(quant::split_sum_count(a.blocks)) * 2;  // a token's split sums
    if (sums && !encode_map(m.s, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.sum_split, split_bytes, uint64_t(n), split_bytes,
                            32, uint32_t(box_tokens), CU_TENSOR_MAP_SWIZZLE_32B))
        return false;
    return encode_map(m.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, w.data, uint64_t(w.row_stride), uint64_t(w.rows),
                      uint64_t(w.row_stride), uint32_t(w.block_stride), uint32_t(box_rows),
                      CU_TENSOR_MAP_SWIZZLE_NONE) &&
           encode_map(m.q, CU_TENSOR_MAP_DATA_TYPE_UINT8, a.qs, uint64_t(a.blocks) * 32, uint64_t(n),
                      uint64_t(a.blocks) * 32, 128, uint32_t(box_tokens), CU_TENSOR_MAP_SWIZZLE_128B) &&
           encode_map(m.d, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, a.d, uint64_t(a.blocks), uint64_t(n),
                      uint64_t(a.blocks) * 4, 8, uint32_t(box_tokens), CU_TENSOR_MAP_SWIZZLE_NONE);
}

}  // namespace tern::cuda
