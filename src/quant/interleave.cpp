// The interleaved registration layout (interleave.h): writing it, reading a
// row back, and the kernels of the paths without a kernel of their own.
#include "quant/interleave.h"

#include <cstddef>
#include <cstring>
#include <type_traits>
#include <string>
#include <vector>

#include "quant/blocks.h"
#include "quant/dot.h"
#include "quant/quant.h"

namespace tern::quant {

namespace detail {
// dot_group_avx512.cpp: the AVX-512 kernels, nullptr where the build or the
// type has none.
DotGroupFn group_kernel_avx512(TensorType type);
}  // namespace detail

namespace {

// Where one block of one row lies in the GGUF bytes and in a group.
struct Shape {
    int words = 0;         // 4-byte words of quants per block and row
    size_t qs_at = 0;      // offset of the quants in a GGUF block
    size_t qh_at = 0;      // q5_0, q5_1: offset of the 32 high bits (0: none)
    bool has_min = false;  // q4_1, q5_1: the f16 min follows the f16 scale
    bool bias = false;     // q8_0: bytes stored plus 128
    size_t block = 0;      // GGUF block bytes
};

bool shape_of(TensorType type, Shape& s) {
    switch (type) {
        case TensorType::Q4_0: s = {4, offsetof(block_q4_0, qs), 0, false, false, sizeof(block_q4_0)}; return true;
        case TensorType::Q4_1: s = {4, offsetof(block_q4_1, qs), 0, true, false, sizeof(block_q4_1)}; return true;
        case TensorType::Q5_0:
            s = {4, offsetof(block_q5_0, qs), offsetof(block_q5_0, qh), false, false, sizeof(block_q5_0)};
            return true;
        case TensorType::Q5_1:
            s = {4, offsetof(block_q5_1, qs), offsetof(block_q5_1, qh), true, false, sizeof(block_q5_1)};
            return true;
        case TensorType::Q8_0: s = {8, offsetof(block_q8_0, qs), 0, false, true, sizeof(block_q8_0)}; return true;
        default: return false;
    }
}

size_t unit_bytes(const Shape& s) { return size_t(s.words) * 4 * kGroupRows; }

// The high bits of a q5 block, rearranged so that a kernel's step s (elements
// 4s..4s+3, interleave.h) finds the bits of its four bytes as bit s of bytes
// 0..3: byte c, bit s holds element 4s + c's bit.
uint32_t spread_high_bits(uint32_t qh) {
    uint32_t out = 0;
    for (int e = 0; e < 32; ++e) out |= ((qh >> e) & 1u) << ((e % 4) * 8 + e / 4);
    return out;
}
uint32_t gather_high_bits(uint32_t spread) {
    uint32_t qh = 0;
    for (int e = 0; e < 32; ++e) qh |= ((spread >> ((e % 4) * 8 + e / 4)) & 1u) << e;
    return qh;
}

// The place of block b among a group's nb units: lane by lane (b % 8), in
// order of b within a lane.
int64_t unit_of(int64_t nb, int64_t b) {
    const int64_t lane = b % 8;
    int64_t before = 0;
    for (int64_t j = 0; j < lane; ++j) before += (nb - j + 7) / 8;
    return before + b / 8;
}

// Offsets within a group of nb blocks: quants, high bits, scales, mins.
struct Regions {
    size_t qh = 0, d = 0, m = 0, end = 0;
};
Regions regions_of(const Shape& s, int64_t nb) {
    Regions g;
    g.qh = size_t(nb) * unit_bytes(s);
    g.d = g.qh + (s.qh_at ? size_t(nb) * 4 * kGroupRows : 0);
    g.m = g.d + size_t(nb) * 2 * kGroupRows;
    g.end = s.has_min ? g.m + size_t(nb) * 2 * kGroupRows : g.m;
    return g;
}

size_t group_bytes(const Shape& s, int64_t nb) { return (regions_of(s, nb).end + 63) / 64 * 64; }

// Copies row r (0..15) of a group to (kToGroup) or from its GGUF blocks.
template <bool kToGroup>
void move_row(const Shape& s, int64_t nb, std::conditional_t<kToGroup, uint8_t*, const uint8_t*> group, int r,
              std::conditional_t<kToGroup, const uint8_t*, uint8_t*> row) {
    const Regions g = regions_of(s, nb);
    auto move = [&](size_t g_at, size_t row_at, size_t n, uint8_t flip) {
        for (size_t i = 0; i < n; ++i) {
            if constexpr (kToGroup)
                group[g_at + i] = uint8_t(row[row_at + i] ^ flip);
            else
                row[row_at + i] = uint8_t(group[g_at + i] ^ flip);
        }
    };
    for (int64_t b = 0; b < nb; ++b) {
        const size_t u = size_t(unit_of(nb, b));
        const size_t blk = size_t(b) * s.block;
        move(g.d + u * 2 * kGroupRows + size_t(r) * 2, blk, 2, 0);
        if (s.has_min) move(g.m + u * 2 * kGroupRows + size_t(r) * 2, blk + 2, 2, 0);
        for (int w = 0; w < s.words; ++w)
            move(u * unit_bytes(s) + size_t(w) * 4 * kGroupRows + size_t(r) * 4, blk + s.qs_at + size_t(w) * 4, 4,
                 s.bias ? 0x80 : 0);
        if (s.qh_at) {
            const size_t at = g.qh + u * 4 * kGroupRows + size_t(r) * 4;
            uint32_t bits;
            if constexpr (kToGroup) {
                std::memcpy(&bits, row + blk + s.qh_at, 4);
                bits = spread_high_bits(bits);
                std::memcpy(group + at, &bits, 4);
            } else {
                std::memcpy(&bits, group + at, 4);
                bits = gather_high_bits(bits);
                std::memcpy(row + blk + s.qh_at, &bits, 4);
            }
        }
    }
}

Status check(TensorType type, int64_t cols, Shape& s, const char* what) {
    if (!shape_of(type, s))
        return Error{std::string(what) + ": no interleaved layout for " + tensor_type_name(uint32_t(type))};
    if (cols < 32 || cols % 32 != 0)
        return Error{std::string(what) + ": " + std::to_string(cols) + " columns are not a whole number of blocks"};
    return {};
}

// The paths without a kernel over the layout: each row read back, then the
// path's own row kernel on it (the bits every path shares).
template <TensorType kType, SimdPath kPath>
void dot_group_by_rows(const void* group, const block_q8a* a, int n_tokens, int64_t k, float* out, int64_t out_stride,
                       int n_rows) {
    Shape s;
    shape_of(kType, s);
    const int64_t nb = k / 32;
    thread_local std::vector<uint8_t> row;
    row.resize(size_t(nb) * s.block);
    const DotRowFn dot = dot_row_kernel(kType, kPath);
    for (int r = 0; r < n_rows; ++r) {
        move_row<false>(s, nb, static_cast<const uint8_t*>(group), r, row.data());
        for (int t = 0; t < n_tokens; ++t) out[t * out_stride + r] = dot(row.data(), a + t * nb, k);
    }
}

template <SimdPath kPath>
DotGroupFn by_rows(TensorType type) {
    switch (type) {
        case TensorType::Q4_0: return dot_group_by_rows<TensorType::Q4_0, kPath>;
        case TensorType::Q4_1: return dot_group_by_rows<TensorType::Q4_1, kPath>;
        case TensorType::Q5_0: return dot_group_by_rows<TensorType::Q5_0, kPath>;
        case TensorType::Q5_1: return dot_group_by_rows<TensorType::Q5_1, kPath>;
        case TensorType::Q8_0: return dot_group_by_rows<TensorType::Q8_0, kPath>;
        default: return nullptr;
    }
}

}  // namespace

bool interleaved_type(TensorType type) {
    Shape s;
    return shape_of(type, s);
}

size_t interleaved_group_bytes(TensorType type, int64_t cols) {
    Shape s;
    if (!check(type, cols, s, "").ok()) return 0;
    return group_bytes(s, cols / 32);
}

size_t interleaved_bytes(TensorType type, int64_t rows, int64_t cols) {
    if (rows < 1) return 0;
    return size_t((rows + kGroupRows - 1) / kGroupRows) * interleaved_group_bytes(type, cols);
}

Status interleave_rows(TensorType type, const void* src, size_t src_stride, int64_t rows, int64_t cols, void* dst) {
    Shape s;
    if (Status st = check(type, cols, s, "interleave_rows"); !st.ok()) return st;
    if (rows < 1 || !src || !dst) return Error{"interleave_rows: no rows or no data"};
    const int64_t nb = cols / 32;
    if (src_stride < size_t(nb) * s.block)
        return Error{"interleave_rows: row stride " + std::to_string(src_stride) + " is below the row size"};
    const size_t gb = group_bytes(s, nb);
    auto* out = static_cast<uint8_t*>(dst);
    const auto* in = static_cast<const uint8_t*>(src);
    std::vector<uint8_t> zero_row(size_t(nb) * s.block, 0);
    for (int64_t g = 0; g * kGroupRows < rows; ++g) {
        uint8_t* group = out + size_t(g) * gb;
        std::memset(group, 0, gb);
        for (int r = 0; r < kGroupRows; ++r) {
            const int64_t row = g * kGroupRows + r;
            move_row<true>(s, nb, group, r, row < rows ? in + size_t(row) * src_stride : zero_row.data());
        }
    }
    return {};
}

Status deinterleave_row(TensorType type, const void* src, int64_t cols, int64_t r, void* row) {
    Shape s;
    if (Status st = check(type, cols, s, "deinterleave_row"); !st.ok()) return st;
    if (r < 0 || !src || !row) return Error{"deinterleave_row: bad row or no data"};
    const int64_t nb = cols / 32;
    const auto* group = static_cast<const uint8_t*>(src) + size_t(r / kGroupRows) * group_bytes(s, nb);
    move_row<false>(s, nb, group, int(r % kGroupRows), static_cast<uint8_t*>(row));
    return {};
}

DotGroupFn dot_group_kernel(TensorType type, SimdPath path) {
    if (!interleaved_type(type) || !simd_path_available(path)) return nullptr;
    switch (path) {
        case SimdPath::scalar: return by_rows<SimdPath::scalar>(type);
        case SimdPath::avx2: return by_rows<SimdPath::avx2>(type);
        case SimdPath::avx512: return detail::group_kernel_avx512(type);
    }
    return nullptr;
}

}  // namespace tern::quant
