// Threaded matmul over GGUF weight rows: validate once, quantize the
// activations once, then split (row chunk x token chunk) tiles across OpenMP
// threads. One token: the one-token row kernel per output element. Several:
// the activations are packed once for the multi-token kernels, which return
// for every (row, token) the one-token kernel's bits; so the tiling and the
// batch decide only speed, never bits. A weight the backend registered in the
// interleaved layout (quant/interleave.h) goes to its group kernels instead,
// sixteen rows and up to eight tokens a call, with the same bits.
#include "backend/cpu/matmul.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "backend/cpu/parallel.h"
#include "quant/dot.h"
#include "quant/interleave.h"
#include "quant/quant.h"

namespace tern::backend::cpu {

namespace {

// A tile is up to 32 rows x 32 tokens: 32 rows of a 4096-wide q4_K matrix are
// 72 KiB, which stay in L2 while the tile's tokens pass over them; a thread's
// consecutive tiles share rows. Within a tile the multi-token kernel takes
// eight tokens per call (measured: 8 beats 4 by 8-15%, and tile shapes from
// 16 x 16 to 64 x 64 are within a few percent of each other).
constexpr int64_t kRowsPerTile = 32;
constexpr int64_t kTokensPerTile = 32;
constexpr int64_t kTokensPerCall = quant::kDotMaxTokens;
// Calls with fewer weight-element x token products than this stay on the
// calling thread: waking the team would cost more than the work.
constexpr int64_t kSerialWork = int64_t(1) << 16;

std::string name_of(TensorType t) { return tensor_type_name(uint32_t(t)); }

Result<quant::SimdPath> pick_path(const MatmulOptions& opt) {
    const quant::SimdPath path = opt.path.value_or(quant::simd_path_best());
    if (!quant::simd_path_available(path))
        return Error{std::string("matmul: the ") + quant::simd_path_name(path) +
                     " path is not available on this CPU or build"};
    return path;
}

int thread_count(const MatmulOptions& opt) { return opt.n_threads > 0 ? opt.n_threads : omp_get_max_threads(); }

// Checks the weight view and returns its row stride in bytes.
Result<size_t> check_weight(const Weight& w, const char* what) {
    const std::string where = std::string(what) + ": weight '" + w.name + "' ";
    if (w.rows < 1 || w.cols < 1)
        return Error{where + "has shape " + std::to_string(w.rows) + " x " + std::to_string(w.cols)};
    if (!w.host) return Error{where + "has no data"};
    if (w.layout == WeightLayout::interleaved16) {
        if (quant::interleaved_bytes(w.type, w.rows, w.cols) == 0)
            return Error{where + "(" + name_of(w.type) + ", " + std::to_string(w.cols) +
                         " columns) has no interleaved layout"};
        return size_t(0);
    }
    const size_t packed = quant::row_bytes(w.type, w.cols);
    if (packed == 0)
        return Error{where + "(" + name_of(w.type) + "): " + std::to_string(w.cols) +
                     " columns are not a whole number of blocks, or the type is unsupported"};
    const size_t stride = w.row_bytes ? w.row_bytes : packed;
    if (stride < packed)
        return Error{where + "row stride " + std::to_string(stride) + " is below the row size " +
                     std::to_string(packed)};
    // Kernels read the blocks' 16-bit scales (and f32 rows) in place.
    const size_t align = w.type == TensorType::F32 ? 4 : 2;
    if (reinterpret_cast<uintptr_t>(w.host) % align != 0 || stride % align != 0)
        return Error{where + "data or row stride is not " + std::to_string(align) + "-byte aligned"};
    return stride;
}

Status check_io(const void* in, const void* out, int64_t n_tokens, const char* what) {
    if (n_tokens < 0) return Error{std::string(what) + ": negative token count " + std::to_string(n_tokens)};
    if (n_tokens > 0 && (!in || !out)) return Error{std::string(what) + ": null activation or output pointer"};
    if (reinterpret_cast<uintptr_t>(in) % alignof(float) != 0)
        return Error{std::string(what) + ": activations are not 4-byte aligned"};
    return {};
}

// Calls fn(r0, r1, t0, t1) for every tile, row-chunk major so that a thread's
// consecutive tiles share rows (static schedule: contiguous task ranges).
template <class Fn>
void for_each_tile(int64_t rows, int64_t cols, int64_t n_tokens, int threads, Fn fn) {
    const int64_t row_tiles = (rows + kRowsPerTile - 1) / kRowsPerTile;
    const int64_t tok_tiles = (n_tokens + kTokensPerTile - 1) / kTokensPerTile;
    const int64_t tiles = row_tiles * tok_tiles;
    const bool parallel = threads > 1 && tiles > 1 && rows * cols * n_tokens >= kSerialWork;
    parallel_for(
        tiles, parallel,
        [&](int64_t i) {
            const int64_t r0 = (i / tok_tiles) * kRowsPerTile, t0 = (i % tok_tiles) * kTokensPerTile;
            fn(r0, std::min(r0 + kRowsPerTile, rows), t0, std::min(t0 + kTokensPerTile, n_tokens));
        },
        threads);
}

// Tiles over an interleaved weight: groups of sixteen rows, eight tokens per
// kernel call. (A tile's 32 rows are two whole groups.)
static_assert(kRowsPerTile % quant::kGroupRows == 0);

void group_rows(quant::DotGroupFn dot, const void* w, int64_t rows, int64_t r0, int64_t r1, const quant::block_q8a* xq,
                int n_tokens, int64_t cols, float* out, int64_t out_stride) {
    for (int64_t r = r0; r < r1; r += quant::kGroupRows)
        dot(w, rows, r / quant::kGroupRows, xq, n_tokens, cols, out + r, out_stride);
}

Status matmul_interleaved(const Weight& w, const quant::block_q8a* xq, int64_t n_tokens, float* out,
                          quant::SimdPath path, const MatmulOptions& opt) {
    const quant::DotGroupFn dot = quant::dot_group_kernel(w.type, path);
    if (!dot)
        return Error{"matmul: no interleaved " + name_of(w.type) + " kernel on the " + quant::simd_path_name(path) +
                     " path"};
    const int64_t rows = w.rows, cols = w.cols, nbk = cols / quant::QK8A;
    for_each_tile(rows, cols, n_tokens, thread_count(opt), [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; t += kTokensPerCall) {
            const int nt = int(std::min(kTokensPerCall, t1 - t));
            group_rows(dot, w.host, rows, r0, r1, xq + t * nbk, nt, cols, out + t * rows, rows);
        }
    });
    return {};
}

Status matmul_float(const Weight& w, size_t stride, const float* x, int64_t n_tokens, float* out,
                    const MatmulOptions& opt) {
    auto path = pick_path(opt);
    if (!path.ok()) return path.error();
    const quant::DotFloatFn dot = quant::dot_float_kernel(w.type, *path);
    if (!dot) return Error{"matmul: no float kernel for " + name_of(w.type)};
    const quant::DotFloatTokensFn dot_tokens = quant::dot_float_tokens_kernel(w.type, *path);
    const auto* base = static_cast<const uint8_t*>(w.host);
    const int64_t rows = w.rows, cols = w.cols;
    if (n_tokens == 1 || !dot_tokens) {
        for_each_tile(rows, cols, n_tokens, thread_count(opt), [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
            for (int64_t r = r0; r < r1; ++r) {
                const void* row = base + size_t(r) * stride;
                for (int64_t t = t0; t < t1; ++t) out[t * rows + r] = dot(row, x + t * cols, cols);
            }
        });
        return {};
    }
    for_each_tile(rows, cols, n_tokens, thread_count(opt), [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; t += kTokensPerCall) {
            const int nt = int(std::min(kTokensPerCall, t1 - t));
            for (int64_t r = r0; r < r1; ++r)
                dot_tokens(base + size_t(r) * stride, x + t * cols, cols, nt, cols, out + t * rows + r, rows);
        }
    });
    return {};
}

}  // namespace

bool reads_grouped_acts(TensorType type, const MatmulOptions& opt) {
    return opt.grouped_kquant_acts && quant::dot_grouped_type(type);
}

Status quantize_activations(const float* x, int64_t n_tokens, int64_t cols, quant::block_q8a* xq,
                            const MatmulOptions& opt, bool grouped) {
    if (cols < 1 || cols % quant::QK8A != 0)
        return Error{"quantize_activations: " + std::to_string(cols) + " columns are not a multiple of 32"};
    if (Status s = check_io(x, xq, n_tokens, "quantize_activations"); !s.ok())
        return s;
    if (n_tokens > 0 && reinterpret_cast<uintptr_t>(xq) % alignof(quant::block_q8a) != 0)
        return Error{"quantize_activations: output blocks are not 4-byte aligned"};
    auto path = pick_path(opt);
    if (!path.ok()) return path.error();
    const int64_t nbk = cols / quant::QK8A;
    const bool parallel = n_tokens > 1 && n_tokens * cols >= kSerialWork / 16;
    parallel_for(
        n_tokens, parallel,
        [&](int64_t t) {
            if (grouped)
                quant::quantize_act_row_grouped(x + t * cols, xq + t * nbk, cols);
            else
                quant::quantize_act_row(x + t * cols, xq + t * nbk, cols, *path);
        },
        thread_count(opt));
    return {};
}

Status matmul_q8a(const Weight& w, const quant::block_q8a* xq, int64_t n_tokens, float* out,
                  const MatmulOptions& opt) {
    auto stride = check_weight(w, "matmul");
    if (!stride.ok()) return stride.error();
    if (Status s = check_io(xq, out, n_tokens, "matmul"); !s.ok()) return s;
    if (!quant::dot_int_type(w.type))
        return Error{"matmul: weight '" + w.name + "' has type " + name_of(w.type) +
                     ", which has no integer dot product"};
    auto path = pick_path(opt);
    if (!path.ok()) return path.error();
    if (w.layout == WeightLayout::interleaved16) return matmul_interleaved(w, xq, n_tokens, out, *path, opt);
    const quant::DotRowFn dot = quant::dot_row_kernel(w.type, *path);
    if (!dot)
        return Error{"matmul: no " + name_of(w.type) + " kernel on the " + quant::simd_path_name(*path) + " path"};
    const quant::DotTokensFn dot_tokens = quant::dot_tokens_kernel(w.type, *path);
    const auto* base = static_cast<const uint8_t*>(w.host);
    const int64_t rows = w.rows, cols = w.cols, nbk = cols / quant::QK8A;
    const size_t row_stride = *stride;
    if (const quant::DotRowsFn dot_rows = quant::dot_rows_kernel(w.type, *path); n_tokens == 1 && dot_rows) {
        for_each_tile(rows, cols, 1, thread_count(opt), [&](int64_t r0, int64_t r1, int64_t, int64_t) {
            dot_rows(base + size_t(r0) * row_stride, row_stride, r1 - r0, xq, cols, out + r0);
        });
        return {};
    }
    if (n_tokens == 1 || !dot_tokens) {
        for_each_tile(rows, cols, n_tokens, thread_count(opt), [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
            for (int64_t r = r0; r < r1; ++r) {
                const void* row = base + size_t(r) * row_stride;
                for (int64_t t = t0; t < t1; ++t) out[t * rows + r] = dot(row, xq + t * nbk, cols);
            }
        });
        return {};
    }
    // Several tokens: pack the activations once for the multi-token kernels.
    const int64_t packed_stride = quant::act_tokens_stride(cols);
    std::vector<int8_t> qs;
    std::vector<float> d;
    std::vector<int32_t> sums;
    try {
        qs.resize(size_t(n_tokens * packed_stride * quant::QK8A));
        d.resize(size_t(n_tokens * packed_stride));
        sums.resize(size_t(n_tokens * packed_stride));
    } catch (const std::bad_alloc&) {
        return Error{"matmul: out of memory packing the activations of " + std::to_string(n_tokens) + " tokens"};
    }
    quant::pack_act_tokens(xq, n_tokens, cols, qs.data(), d.data(), sums.data());
    const quant::ActTokens packed{qs.data(), d.data(), sums.data(), packed_stride};
    for_each_tile(rows, cols, n_tokens, thread_count(opt), [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; t += kTokensPerCall) {
            const int nt = int(std::min(kTokensPerCall, t1 - t));
            const quant::ActTokens a = packed.from(t);
            for (int64_t r = r0; r < r1; ++r)
                dot_tokens(base + size_t(r) * row_stride, a, nt, cols, out + t * rows + r, rows);
        }
    });
    return {};
}

bool matmul_q8a_one_token(const Q8aTarget* targets, int n, const quant::block_q8a* xq, const MatmulOptions& opt) {
    constexpr int kMaxTargets = 4;
    if (n < 1 || n > kMaxTargets || !xq) return false;
    auto path = pick_path(opt);
    if (!path.ok()) return false;
    struct Part {
        const uint8_t* base;
        size_t stride;  // GGUF rows: row to row
        int64_t rows, cols;
        quant::DotRowsFn dot;         // GGUF rows
        quant::DotGroupFn dot_group;  // interleaved
        float* out;
        int64_t first_tile;  // its row tiles' place in the loop
    };
    Part parts[kMaxTargets];
    int64_t tiles = 0, work = 0;
    for (int i = 0; i < n; ++i) {
        const Weight& w = *targets[i].w;
        auto stride = check_weight(w, "matmul");
        if (!stride.ok() || !quant::dot_int_type(w.type) || !targets[i].out) return false;
        const auto* base = static_cast<const uint8_t*>(w.host);
        if (w.layout == WeightLayout::interleaved16) {
            const quant::DotGroupFn dot = quant::dot_group_kernel(w.type, *path);
            if (!dot) return false;
            parts[i] = Part{base, 0, w.rows, w.cols, nullptr, dot, targets[i].out, tiles};
        } else {
            const quant::DotRowsFn dot = quant::dot_rows_kernel(w.type, *path);
            if (!dot) return false;
            parts[i] = Part{base, *stride, w.rows, w.cols, dot, nullptr, targets[i].out, tiles};
        }
        tiles += (w.rows + kRowsPerTile - 1) / kRowsPerTile;
        work += w.rows * w.cols;
    }
    const int threads = thread_count(opt);
    const bool parallel = threads > 1 && tiles > 1 && work >= kSerialWork;
    parallel_for(
        tiles, parallel,
        [&](int64_t i) {
            int p = n - 1;
            while (i < parts[p].first_tile) --p;
            const Part& t = parts[p];
            // The tile matmul_q8a gives this weight: rows r0..r1 of its own.
            const int64_t r0 = (i - t.first_tile) * kRowsPerTile, r1 = std::min(r0 + kRowsPerTile, t.rows);
            if (t.dot_group)
                group_rows(t.dot_group, t.base, t.rows, r0, r1, xq, 1, t.cols, t.out, t.rows);
            else
                t.dot(t.base + size_t(r0) * t.stride, t.stride, r1 - r0, xq, t.cols, t.out + r0);
        },
        threads);
    return true;
}

Status matmul(const Weight& w, const float* x, int64_t n_tokens, float* out, const MatmulOptions& opt) {
    auto stride = check_weight(w, "matmul");
    if (!stride.ok()) return stride.error();
    if (Status s = check_io(x, out, n_tokens, "matmul"); !s.ok()) return s;
    if (n_tokens == 0) return {};
    if (quant::dot_float_type(w.type)) return matmul_float(w, *stride, x, n_tokens, out, opt);
    if (!quant::dot_int_type(w.type))
        return Error{"matmul: weight '" + w.name + "' has type " + name_of(w.type) + ", which has no dot product"};
    std::vector<quant::block_q8a> xq;
    try {
        xq.resize(size_t(n_tokens * (w.cols / quant::QK8A)));
    } catch (const std::bad_alloc&) {
        return Error{"matmul: out of memory quantizing " + std::to_string(n_tokens) + " x " +
                     std::to_string(w.cols) + " activations"};
    }
    if (Status s = quantize_activations(x, n_tokens, w.cols, xq.data(), opt, reads_grouped_acts(w.type, opt)); !s.ok())
        return s;
    return matmul_q8a(w, xq.data(), n_tokens, out, opt);
}

}  // namespace tern::backend::cpu
