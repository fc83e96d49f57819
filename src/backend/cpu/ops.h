// Plain CPU implementations of the non-matmul operations, on host f32 rows.
// They are the reference the GPU kernels are checked against, so each is
// written to read as the math it computes; threading is over independent rows.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "quant/simd_path.h"

namespace tern::backend::cpu {

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w; out may alias x. w may be null.
void rms_norm(const float* x, const float* w, float eps, float* out, int64_t rows, int64_t cols);

// Rotates x (rows: tokens, n_heads * head_dim cols) in place, token t at position pos[t].
// freq_factors: null or rope.n_dims/2 floats. rope_table then rope_apply.
void rope(float* x, int64_t rows, int n_heads, int head_dim, const int32_t* pos, const RopeParams& rope,
          const float* freq_factors);

// The cosines and sines rope rotates by, [token][rope.n_dims/2] each: they
// depend only on the positions and the parameters, so a backend computes them
// once a batch and every layer's q and k reuse them.
struct RopeTable {
    int half = 0;  // rope.n_dims / 2
    std::vector<float> cos, sin;
};
void rope_table(const int32_t* pos, int64_t rows, const RopeParams& rope, const float* freq_factors, RopeTable& out);
// Rotates x by a table of at least x's rows (pairs as rope.neox says).
void rope_apply(float* x, int64_t rows, int n_heads, int head_dim, bool neox, const RopeTable& table);

// gate = silu(gate) * up, elementwise over n values: g / (1 + e^-g) * up,
// e^ as expf_glibc (expf.h). path: the portable form (scalar) or AVX2 eight
// lanes at a time, the same bits; by default the best the CPU has.
void swiglu(float* gate, const float* up, int64_t n, quant::SimdPath path = quant::simd_path_best());

// gate = gelu(gate) * up with GELU's tanh form: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))),
// tanh as tanh_fdlibm. path: the portable form (scalar) or AVX2 eight lanes at
// a time, the same bits (gelu.cpp); by default the best the CPU has.
void geglu(float* gate, const float* up, int64_t n, quant::SimdPath path = quant::simd_path_best());

// tanh and expm1 with the bits of the single-precision fdlibm algorithm, which
// Debian 12's C library returns from tanhf and expm1f (gelu.cpp).
float tanh_fdlibm(float x);
float expm1_fdlibm(float x);

// x *= s over n values.
void scale(float* x, float s, int64_t n);

// One token's expert routing (Backend::route_experts): ids[0..k) the experts
// of the k largest of n_expert logits, the largest first (ties: the lower
// index; NaN as -inf), weights[j] = exp(l_j - l_0) / sum_i exp(l_i - l_0)
// summed in j order. 1 <= k <= n_expert.
void route_top_k(const float* logits, int n_expert, int k, int32_t* ids, float* weights);

// The greedy pick: the index of the first largest of x[0..n), NaN read as
// -inf; -1 when no value is above -inf. path: the portable loop (scalar), or
// on AVX2 two reads of the row (its maximum, then the first index holding
// it), the same index on every input; by default the best the CPU has.
int64_t argmax_first(const float* x, int64_t n, quant::SimdPath path = quant::simd_path_best());

// A sequence's cached K (or V) rows, f16 [n_kv_heads][head_dim] a position:
// position p's row lies in page pages[p >> page_shift] of the pool at base,
// at row p mod 2^page_shift; without pages, rows follow each other from base.
struct KvRows {
    const uint16_t* base = nullptr;
    int64_t row_stride = 0;          // halves from one position to the next
    const int32_t* pages = nullptr;  // the sequence's page table, or null
    int page_shift = 0;              // log2 of the positions per page
    const uint16_t* row(int p) const {
        if (!pages) return base + int64_t(p) * row_stride;
        const int64_t in_page = p & ((1 << page_shift) - 1);
        return base + ((int64_t(pages[p >> page_shift]) << page_shift) + in_page) * row_stride;
    }
};

// Attention of the n_q query heads that share KV head kv_head (q and out hold
// them back to back) over cached positions first..first+n_pos-1. Each
// position's K and V rows are converted once for the whole group. Online
// softmax, so memory stays O(head_dim) whatever the context length; every sum
// runs in position and element order.
// e^ is expf_glibc (expf.h).
// path: the portable form (scalar), or on AVX2 a tile of this one token (the
// same bits, attention_avx2.cpp); by default the best the CPU has.
void attention_kv_group(const float* q, int n_q, const KvRows& k, const KvRows& v, int first, int n_pos, int kv_head,
                        int head_dim, float scale, float* out, quant::SimdPath path = quant::simd_path_best());

// The same for up to kAttentionTileTokens query tokens of one sequence at
// once (a prefill tile): token t's n_q heads at q + t * q_stride, its output
// at out + t * out_stride, over positions first[t]..last[t] of k and v. Each
// position's K and V rows are converted once for the tile, and its q·k for
// the tile's tokens are summed side by side; every token gets the bits
// attention_kv_group gives it alone (the portable one-token form: on AVX2 a
// single token runs as a tile of one).
constexpr int kAttentionTileTokens = 8;
struct AttentionTile {
    const float* q;
    int64_t q_stride;
    int n_t, n_q;  // tokens (1..kAttentionTileTokens), query heads of the group
    const int* first;
    const int* last;
    float* out;
    int64_t out_stride;
};
// path: the portable form (scalar) or its AVX2 schedule, the same bits
// (attention_avx2.cpp); by default the best the CPU has.
void attention_tile(const AttentionTile& tile, const KvRows& k, const KvRows& v, int kv_head, int head_dim,
                    float scale, quant::SimdPath path = quant::simd_path_best());

namespace detail {
// dst[i] = the f16 src[i] as f32 (F16C where the CPU has it: the same values).
void fp16_row_to_fp32(const uint16_t* src, float* dst, int n);
// dst[i] = fp32_to_fp16(src[i]) (F16C where the CPU has it: the same bits,
// NaNs included). path: scalar forces the portable form.
void fp32_row_to_fp16(const float* src, uint16_t* dst, int64_t n, quant::SimdPath path = quant::simd_path_best());

// The online softmax of a tile, as the portable attention_tile keeps it:
// the queries transposed per head (qt[j][i][t]: one position's q·k for every
// token are kAttentionTileTokens sums side by side), per (head j, token t)
// at j * kAttentionTileTokens + t the running max m, denominator l and
// numerator acc (head_dim floats), and the positions lo..hi the tile spans.
struct TileSoftmax {
    std::vector<float> qt, acc, m, l;
    int lo = 0, hi = -1;
    TileSoftmax(const AttentionTile& tile, int head_dim);
    // Each token's heads: acc / l (0 where no position was seen).
    void write(const AttentionTile& tile, int head_dim) const;
};
void geglu_portable(float* gate, const float* up, int64_t n);
void geglu_avx2(float* gate, const float* up, int64_t n);  // x86-64 with AVX2 only
void attention_tile_avx2(const AttentionTile& tile, const KvRows& k, const KvRows& v, int kv_head, int head_dim,
                         float scale);
}  // namespace detail

}  // namespace tern::backend::cpu
