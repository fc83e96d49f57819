// Element-wise, normalisation, rotary and attention kernels of the CUDA
// backend, as plain launch functions (see kernels.h for the conventions).
// Each has a CPU twin in backend/cpu/ops.h; tests/gpu/test_cuda_ops.cpp
// holds them to it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tern::cuda {

// out[r] = x[r] / rms(x[r]) * w  (w may be null: no scale); sums in double as the CPU does.
// out may equal x.
void rms_norm(const float* x, const float* w, float eps, float* out, int64_t rows, int64_t cols,
              cudaStream_t stream);
// x[r] += y[r] / rms(y[r]) * w: the bits of rms_norm of y then add, in one
// launch (w may be null). x and y are distinct.
void add_rms_norm(float* x, const float* y, const float* w, float eps, int64_t rows, int64_t cols,
                  cudaStream_t stream);

// Rotates the first n_dims dims of each head of x (rows x n_heads*head_dim) by the
// position of each row: pos is a device array of `rows` positions. Angles in double,
// as the CPU does. freq_factors: device f32 [n_dims/2] or null.
struct RopeArgs {
    int n_heads = 0, head_dim = 0, n_dims = 0;
    bool neox = false;
    float freq_base = 10000.0f, freq_scale = 1.0f;
    float attn_factor = 1.0f;  // cos and sin multiplied by this
    const float* freq_factors = nullptr;
    // Device table of the n_dims/2 inverse frequencies, base^(-2i/n_dims) / factor[i],
    // computed once on the host (pow in double is the kernel's costliest step);
    // null: the kernel computes them from freq_base and freq_factors.
    const double* inv_freq = nullptr;
};
void rope(float* x, int64_t rows, const int32_t* pos, const RopeArgs& args, cudaStream_t stream);

// gate[i] = silu(gate[i]) * up[i]
void swiglu(float* gate, const float* up, int64_t n, cudaStream_t stream);

// gate = gelu(gate) * up, GELU's tanh form (cpu::geglu's formula).
void geglu(float* gate, const float* up, int64_t n, cudaStream_t stream);

// x *= s
void scale(float* x, float s, int64_t n, cudaStream_t stream);
// x[i] += y[i]
void add(float* x, const float* y, int64_t n, cudaStream_t stream);
// y[r][c] += bias[c]
void add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);
// out[i] = x[rows[i]] for i < n; rows is a device array.
void gather_rows(const float* x, int64_t cols, const int32_t* rows, int64_t n, float* out, cudaStream_t stream);
// out[r] = the first index of row r's largest value (NaN read as -inf; -1
// when none is above -inf), for each of `rows` rows of `cols`: the CPU's
// backend::cpu::argmax_first, the greedy pick (argmax.cu).
void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream);

// One layer of the paged f16 KV cache (backend.h): pages of page_size
// positions, each [pos][kv_head][head_dim], for K and for V; position p of
// slot s in page pages[s * pages_per_slot + p / page_size] (a device array;
// -1: unmapped).
struct KvLayer {
    uint16_t* k = nullptr;
    uint16_t* v = nullptr;
    const int32_t* pages = nullptr;
    int n_slots = 0, n_ctx = 0, n_kv_heads = 0, head_dim = 0;
    int page_size = 0, pages_per_slot = 0;
};

// Writes row t of k and v (n_kv_heads*head_dim floats each, rounded to f16 to
// nearest even) at (slot[t], pos[t]). slot and pos are device arrays; a token
// whose slot or pos lies outside the cache, or whose page is unmapped, is not
// written.
void kv_store(const KvLayer& kv, const float* k, const float* v, int64_t n_tokens, const int32_t* slot,
              const int32_t* pos, cudaStream_t stream);

// Per-head RMSNorm weights of q and k (head_dim floats each, device memory;
// null: that tensor is not normalised).
struct HeadNorms {
    const float* q = nullptr;
    const float* k = nullptr;
    float eps = 0.0f;
};

// What attention() reads, made ready in one launch: for token t, every head of
// q (n_heads of them) and of k (kv.n_kv_heads) normalised over head_dim where
// its weight is given, rotated by the token's position, written back, and k
// and v stored in the cache as kv_store stores them. The bits of rms_norm (one
// row per head), rope on q, rope on k and kv_store in that order. Launches
// nothing unless prepare_attention_supported(kv.head_dim, rope).
bool prepare_attention_supported(int head_dim, const RopeArgs& rope);
void prepare_attention(const KvLayer& kv, float* q, float* k, const float* v, int64_t n_tokens, int n_heads,
                       const HeadNorms& norms, const RopeArgs& rope, const int32_t* slot, const int32_t* pos,
                       cudaStream_t stream);

// Head shapes attention() handles: head_dim a multiple of 32 up to 256 and
// n_heads a multiple of n_kv_heads. The backend checks this at init and refuses
// other models; attention() launches nothing for them.
bool attention_supported(int n_heads, int n_kv_heads, int head_dim);

// How a batch's tokens lie in the cache; it picks attention()'s launch,
// never its bits. Decode: no two consecutive tokens share a slot (a token per
// sequence), so each token gets its own CTAs; Prefill: runs of consecutive
// tokens of one sequence share staged K/V.
enum class AttnBatch { Prefill, Decode };

// Positions per segment of a token's context at this cache length: every
// token's arithmetic (attention_internal.cuh), whatever its batch.
int attention_segment_length(int n_ctx);

// Whether attention() computes a batch's segments in separate CTAs and
// combines them (decode batches and small ones, long contexts): a launch
// choice only. Decided on the host from the shapes and the current device's
// SM count, so it holds across a captured CUDA graph.
bool attention_splits(int64_t n_tokens, int n_heads, int head_dim, int n_ctx, AttnBatch kind);

// Bytes of scratch attention() needs for any batch of at most n_tokens tokens
// (the split partials); 0 when no such batch splits. Allocate once, outside
// graph capture, on the device that runs attention().
size_t attention_workspace_bytes(int64_t n_tokens, int n_heads, int head_dim, int n_ctx);

// Prefill tiles that never hold two sequences. The tensor-core kernel stages
// one slot's K/V per pass over the positions, so a tile of consecutive
// tokens from many sequences (a server step where prompts join decoding
// sequences) would take a pass per sequence, one after another, in one CTA.
// attention_tile_tokens: the tokens per tile of the launch attention() makes
// for this batch where it tiles prefill tokens on the tensor cores, else 0
// (single tokens, split segments, decode batches, the CUDA-core kernels).
// attention_tiles: the tiles of runs of consecutive tokens of one slot, at
// most tile_tokens each, from the batch's slots on the host: starts[i] is
// tile i's first token and starts[n_tiles] = n_tokens (n_tokens + 1 entries
// of room); returns n_tiles. A choice of launch only: a row's bits are the
// same in any tile.
int attention_tile_tokens(int n_heads, int n_kv_heads, int head_dim, int n_ctx, int window, int64_t n_tokens,
                          AttnBatch kind, bool has_workspace);
int64_t attention_tiles(const int32_t* slot, int64_t n_tokens, int tile_tokens, int32_t* starts);

// attention_tiles' table on the device, for tiles of tile_tokens: count
// tiles, count + 1 starts. Tiles past the batch's own may follow, empty (each
// starting at n_tokens), so that a grid fixed in a CUDA graph holds any
// batch's tiles; the kernel leaves them at once.
struct AttnTiles {
    const int32_t* starts = nullptr;
    int64_t count = 0;
    int tile_tokens = 0;
};

// out[t] = softmax(q[t] K^T * scale) V over positions first..pos[t] of slot[t],
// per query head; query head h reads KV head h / (n_heads / n_kv_heads).
// window 0: first = 0; else first = max(0, pos[t] - window + 1).
// q, out: n_tokens x n_heads*head_dim. workspace: attention_workspace_bytes()
// bytes for a batch at least this large, or null (then it never splits).
// Deterministic and batch-invariant: a token's row depends only on its q, its
// slot's cache and its position, never on the other tokens, the kind, the
// split or timing. A token whose slot or pos lies outside the cache gets a
// NaN row. kv.k and kv.v must be 16-byte aligned. tiles: this batch's
// table for attention_tile_tokens() tokens a tile (where that is not 0), or
// none ({}): tiles of consecutive tokens whatever their slots.
// few_units: attention_few_units() of the batch.
void attention(const KvLayer& kv, const float* q, int64_t n_tokens, int n_heads, float scale, int window,
               const int32_t* slot, const int32_t* pos, float* out, float* workspace, AttnBatch kind,
               cudaStream_t stream, AttnTiles tiles, bool few_units);

// Whether a batch's attention is few units of work ((token, KV head,
// segment) triples with positions, counted from the host's copy of the
// positions): at most one per SM. Then a decode token's CTA takes four warps
// (attention_mma_decode.cu), which shortens the chain where the GPU has room
// to spare; with many, CTAs of one warp keep more of the cache's bytes in
// flight (LOG g85). It picks the launch, never a bit.
bool attention_few_units(const int32_t* pos, int64_t n_tokens, int n_kv_heads, int n_ctx);

}  // namespace tern::cuda
