// The interleaved registration layout (interleave.h): writing it, reading a
// row back, and the kernels of the paths without a kernel of their own.
//
// Every type goes through one description of a block, `Fields`: its 32
// quanta as unsigned values (q8_0: its signed bytes as stored), its f16
// scale and min (K-quants: the super-block's d and dmin), and the K-quants'
// sub-block scales and min. A codec per type turns a GGUF segment (one block,
// or a K-quant's 256-element super-block) into fields and back, exactly; the
// layout code places fields in a group and takes them out.
#include "quant/interleave.h"

#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "quant/blocks.h"
#include "quant/dot.h"
#include "quant/interleave_layout.h"
#include "quant/kquant_scales.h"
#include "quant/quant.h"

namespace tern::quant {

namespace detail {
// dot_group_avx512.cpp: the AVX-512 kernels, nullptr where the build or the
// type has none.
DotGroupFn group_kernel_avx512(TensorType type);
}  // namespace detail

namespace {

using detail::LayoutKind;

static_assert(kGroupRows == detail::kLayoutRows);

struct Fields {
    uint8_t q[32] = {};
    uint16_t d = 0, m = 0;
    int8_t sc[2] = {};  // K-quants: the block's scale (q6_K: one per 16 elements)
    uint8_t mn = 0;     // q4_K, q5_K: the block's min
};

// ---- codecs: GGUF segment <-> fields of its blocks ---------------------------

uint16_t u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}
void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// Blocks of 32 elements: d, [m], [qh], qs (q4_0, q4_1, q5_0, q5_1, q8_0).
template <TensorType kType>
struct Legacy {
    static constexpr bool kMin = kType == TensorType::Q4_1 || kType == TensorType::Q5_1;
    static constexpr bool kHigh = kType == TensorType::Q5_0 || kType == TensorType::Q5_1;
    static constexpr size_t kQh = kMin ? 4 : 2;  // after d (and m)
    static constexpr size_t kQs = kQh + (kHigh ? 4 : 0);
    static constexpr size_t kBytes = kType == TensorType::Q8_0 ? 34 : kQs + 16;
    static constexpr int kBlocks = 1;
    static constexpr TensorType kLayout = kType;

    static void decode(const uint8_t* seg, Fields* f) {
        f->d = u16(seg);
        if (kMin) f->m = u16(seg + 2);
        if constexpr (kType == TensorType::Q8_0) {
            std::memcpy(f->q, seg + 2, 32);
            return;
        }
        uint32_t qh = 0;
        if (kHigh) std::memcpy(&qh, seg + kQh, 4);
        for (int i = 0; i < 16; ++i) {
            f->q[i] = uint8_t((seg[kQs + i] & 0xF) | ((qh >> i) & 1) << 4);
            f->q[16 + i] = uint8_t((seg[kQs + i] >> 4) | ((qh >> (16 + i)) & 1) << 4);
        }
    }
    static void encode(const Fields* f, uint8_t* seg) {
        put16(seg, f->d);
        if (kMin) put16(seg + 2, f->m);
        if constexpr (kType == TensorType::Q8_0) {
            std::memcpy(seg + 2, f->q, 32);
            return;
        }
        uint32_t qh = 0;
        for (int i = 0; i < 16; ++i) {
            seg[kQs + i] = uint8_t((f->q[i] & 0xF) | (f->q[16 + i] & 0xF) << 4);
            qh |= uint32_t((f->q[i] >> 4) & 1) << i | uint32_t((f->q[16 + i] >> 4) & 1) << (16 + i);
        }
        if (kHigh) std::memcpy(seg + kQh, &qh, 4);
    }
};

// q4_K and q5_K: d, dmin, 12 bytes of 6-bit scales and mins, [qh], qs.
template <bool kHigh>
struct K4 {
    using Block = std::conditional_t<kHigh, block_q5_K, block_q4_K>;
    static constexpr size_t kBytes = sizeof(Block);
    static constexpr int kBlocks = 8;
    static constexpr TensorType kLayout = kHigh ? TensorType::Q5_K : TensorType::Q4_K;

    static void decode(const uint8_t* seg, Fields* f) {
        Block w;
        std::memcpy(&w, seg, sizeof w);
        for (int j = 0; j < 8; ++j) {
            uint8_t sc, mn;
            unpack_scale_min_k4(j, w.scales, &sc, &mn);
            f[j].d = w.d;
            f[j].m = w.dmin;
            f[j].sc[0] = int8_t(sc);
            f[j].mn = mn;
            for (int l = 0; l < 32; ++l) {
                int q = (w.qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xF;
                if constexpr (kHigh) q |= ((w.qh[l] >> j) & 1) << 4;
                f[j].q[l] = uint8_t(q);
            }
        }
    }
    static void encode(const Fields* f, uint8_t* seg) {
        Block w{};
        w.d = f[0].d;
        w.dmin = f[0].m;
        uint8_t ls[8], lm[8];
        for (int j = 0; j < 8; ++j) {
            ls[j] = uint8_t(f[j].sc[0]);
            lm[j] = f[j].mn;
            for (int l = 0; l < 32; ++l) {
                w.qs[32 * (j / 2) + l] = uint8_t(w.qs[32 * (j / 2) + l] | (f[j].q[l] & 0xF) << (4 * (j % 2)));
                if constexpr (kHigh) w.qh[l] = uint8_t(w.qh[l] | ((f[j].q[l] >> 4) & 1) << j);
            }
        }
        pack_scales_mins_k4(ls, lm, w.scales);
        std::memcpy(seg, &w, sizeof w);
    }
};

// q6_K: ql, qh, 16 int8 scales, d.
struct K6 {
    static constexpr size_t kBytes = sizeof(block_q6_K);
    static constexpr int kBlocks = 8;
    static constexpr TensorType kLayout = TensorType::Q6_K;

    // Element l of block j: low nibble at ql[64h + 32(quarter & 1) + l]
    // (high nibble for quarters 2 and 3), two high bits at qh[32h + l].
    static void decode(const uint8_t* seg, Fields* f) {
        block_q6_K w;
        std::memcpy(&w, seg, sizeof w);
        for (int j = 0; j < 8; ++j) {
            const int h = j / 4, quarter = j % 4;
            const uint8_t* ql = w.ql + 64 * h + 32 * (quarter & 1);
            f[j].d = w.d;
            f[j].sc[0] = w.scales[2 * j];
            f[j].sc[1] = w.scales[2 * j + 1];
            for (int l = 0; l < 32; ++l) {
                const int low = quarter < 2 ? (ql[l] & 0xF) : (ql[l] >> 4);
                const int high = (w.qh[32 * h + l] >> (2 * quarter)) & 3;
                f[j].q[l] = uint8_t(low | high << 4);
            }
        }
    }
    static void encode(const Fields* f, uint8_t* seg) {
        block_q6_K w{};
        w.d = f[0].d;
        for (int j = 0; j < 8; ++j) {
            const int h = j / 4, quarter = j % 4;
            uint8_t* ql = w.ql + 64 * h + 32 * (quarter & 1);
            w.scales[2 * j] = f[j].sc[0];
            w.scales[2 * j + 1] = f[j].sc[1];
            for (int l = 0; l < 32; ++l) {
                ql[l] = uint8_t(ql[l] | (f[j].q[l] & 0xF) << (quarter < 2 ? 0 : 4));
                w.qh[32 * h + l] = uint8_t(w.qh[32 * h + l] | ((f[j].q[l] >> 4) & 3) << (2 * quarter));
            }
        }
        std::memcpy(seg, &w, sizeof w);
    }
};

// ---- the layout: fields <-> a row of a group ---------------------------------

// The place of block b among a group's nb units: lane by lane (b % 8), in
// order of b within a lane.
int64_t unit_of(int64_t nb, int64_t b) {
    const int64_t lane = b % 8;
    int64_t before = 0;
    for (int64_t j = 0; j < lane; ++j) before += (nb - j + 7) / 8;
    return before + b / 8;
}

// High bits of one block, rearranged for the kernels, whose step s takes
// elements 4s..4s+3 (byte c: element 4s + c). q5 types, one word: byte c,
// bit s holds bit 4 of element 4s + c (s = 0..7). q6_K, two words: word h,
// byte c, bits 2s'..2s'+1 hold bits 4..5 of element 16h + 4s' + c (s' = 0..3).
//
// Written with word arithmetic (a bit per element at a time was three
// quarters of the time of laying out a q6_K matrix): bit_plane gathers one
// bit of each of the 32 elements into a mask, every_fourth picks elements
// c, c + 4, c + 8, ... out of it.

// Bit e = bit `bit` of q[e].
uint32_t bit_plane(const uint8_t* q, int bit) {
    uint32_t m = 0;
    for (int i = 0; i < 4; ++i) {
        uint64_t y;
        std::memcpy(&y, q + 8 * i, 8);
        const uint64_t b = (y >> bit) & 0x0101010101010101ull;           // one bit per byte
        m |= uint32_t((b * 0x0102040810204080ull) >> 56) << (8 * i);  // the eight bits side by side
    }
    return m;
}

// Bits 0, 4, 8, ... (n of them, n = 4 or 8) of x, side by side.
template <int n>
uint32_t every_fourth(uint32_t x) {
    x &= n == 8 ? 0x11111111u : 0x1111u;
    x = (x | x >> 3) & 0x03030303u;
    x = (x | x >> 6) & 0x000F000Fu;
    return n == 8 ? (x | x >> 12) & 0xFFu : x & 0xFu;
}

// Bit i of x (i < 4) to bit 2i.
uint32_t to_even_bits(uint32_t x) {
    x = (x | x << 2) & 0x33u;
    return (x | x << 1) & 0x55u;
}

template <int kHighWords>
void spread_high(const uint8_t* q, uint32_t* words) {
    words[0] = words[1] = 0;
    if constexpr (kHighWords == 1) {
        const uint32_t m = bit_plane(q, 4);
        for (int c = 0; c < 4; ++c) words[0] |= every_fourth<8>(m >> c) << (8 * c);
    } else {
        const uint32_t m4 = bit_plane(q, 4), m5 = bit_plane(q, 5);
        for (int h = 0; h < 2; ++h)
            for (int c = 0; c < 4; ++c) {
                const int at = 16 * h + c;
                words[h] |= (to_even_bits(every_fourth<4>(m4 >> at)) | to_even_bits(every_fourth<4>(m5 >> at)) << 1)
                            << (8 * c);
            }
    }
}
template <int kHighWords>
void gather_high(const uint32_t* words, uint8_t* q) {
    for (int e = 0; e < 32; ++e) {
        const int s = e / 4, c = e % 4;
        const uint32_t bits = kHighWords == 1 ? (words[0] >> (8 * c + s)) & 1 : (words[s / 4] >> (8 * c + 2 * (s % 4))) & 3;
        q[e] = uint8_t(q[e] | bits << 4);
    }
}

// A matrix's shape in the layout and the unit of each block, worked out once
// per call.
struct Place {
    LayoutKind k;
    int64_t nb = 0, n_groups = 0;
    std::vector<int64_t> unit;

    Place(const LayoutKind& kind, int64_t n_blocks, int64_t rows)
        : k(kind), nb(n_blocks), n_groups((rows + kGroupRows - 1) / kGroupRows), unit(size_t(n_blocks)) {
        for (int64_t b = 0; b < nb; ++b) unit[size_t(b)] = unit_of(nb, b);
    }
    detail::GroupPlanes planes(int64_t g) const { return detail::group_planes(k, nb, n_groups, g); }
};

// Copies block b of row r (0..15) of a group, whose parts lie at p in the
// matrix w, between its fields and the layout.
template <bool kToLayout, TensorType kType>
void move_block(const detail::GroupPlanes& p, int64_t u, int64_t b,
                std::conditional_t<kToLayout, uint8_t*, const uint8_t*> w, int r,
                std::conditional_t<kToLayout, const Fields&, Fields&> f) {
    // The type's shape as constants, so that the loops below unroll.
    constexpr LayoutKind k = detail::layout_of(kType);
    const size_t rows = kGroupRows, unit = size_t(u);
    const size_t scale_unit = k.k_quant ? size_t(b / 8) : unit;
    auto bytes = [&](size_t at, auto* field, size_t n) {
        if constexpr (kToLayout)
            std::memcpy(w + at, field, n);
        else
            std::memcpy(field, w + at, n);
    };
    // Quanta: q8_0's bytes plus 128; else the low nibbles of elements i and 16 + i in byte i.
    uint8_t qs[32];
    if constexpr (kToLayout) {
        if constexpr (k.words == 8)
            for (int i = 0; i < 32; ++i) qs[i] = uint8_t(f.q[i] ^ 0x80);
        else
            for (int i = 0; i < 16; ++i) qs[i] = uint8_t((f.q[i] & 0xF) | (f.q[16 + i] & 0xF) << 4);
    }
    for (int i = 0; i < k.words; ++i) bytes(p.qs + (unit * size_t(k.words) + size_t(i)) * 4 * rows + size_t(r) * 4, qs + 4 * i, 4);
    if constexpr (!kToLayout) {
        if constexpr (k.words == 8) {
            for (int i = 0; i < 32; ++i) f.q[i] = uint8_t(qs[i] ^ 0x80);
        } else {
            for (int i = 0; i < 16; ++i) {
                f.q[i] = qs[i] & 0xF;
                f.q[16 + i] = qs[i] >> 4;
            }
        }
    }
    if constexpr (k.high_words > 0) {
        uint32_t words[2];
        if constexpr (kToLayout) spread_high<k.high_words>(f.q, words);
        for (int h = 0; h < k.high_words; ++h)
            bytes(p.qh + (unit * size_t(k.high_words) + size_t(h)) * 4 * rows + size_t(r) * 4, &words[h], 4);
        if constexpr (!kToLayout) gather_high<k.high_words>(words, f.q);
    }
    bytes(p.d + scale_unit * 2 * rows + size_t(r) * 2, &f.d, 2);
    if (k.has_min) bytes(p.m + scale_unit * 2 * rows + size_t(r) * 2, &f.m, 2);
    for (int i = 0; i < k.scales; ++i) bytes(p.sc + (unit * size_t(k.scales) + size_t(i)) * rows + size_t(r), &f.sc[i], 1);
    if (k.k_quant && k.has_min) bytes(p.mn + unit * rows + size_t(r), &f.mn, 1);
}

// Row r of group g to and from its GGUF bytes, a segment at a time.
template <class Codec>
struct Rows {
    static void write(const Place& p, uint8_t* w, int64_t g, int r, const uint8_t* row) {
        const detail::GroupPlanes planes = p.planes(g);
        Fields f[Codec::kBlocks];
        for (int64_t b0 = 0; b0 < p.nb; b0 += Codec::kBlocks) {
            Codec::decode(row + size_t(b0 / Codec::kBlocks) * Codec::kBytes, f);
            for (int j = 0; j < Codec::kBlocks; ++j)
                move_block<true, Codec::kLayout>(planes, p.unit[size_t(b0 + j)], b0 + j, w, r, f[j]);
        }
    }
    static void read(const Place& p, const uint8_t* w, int64_t g, int r, uint8_t* row) {
        const detail::GroupPlanes planes = p.planes(g);
        Fields f[Codec::kBlocks];
        for (int64_t b0 = 0; b0 < p.nb; b0 += Codec::kBlocks) {
            for (int j = 0; j < Codec::kBlocks; ++j)
                move_block<false, Codec::kLayout>(planes, p.unit[size_t(b0 + j)], b0 + j, w, r, f[j]);
            Codec::encode(f, row + size_t(b0 / Codec::kBlocks) * Codec::kBytes);
        }
    }
};

template <class Fn>
bool with_rows(TensorType type, Fn&& fn) {
    switch (type) {
        case TensorType::Q4_0: fn(Rows<Legacy<TensorType::Q4_0>>{}); return true;
        case TensorType::Q4_1: fn(Rows<Legacy<TensorType::Q4_1>>{}); return true;
        case TensorType::Q5_0: fn(Rows<Legacy<TensorType::Q5_0>>{}); return true;
        case TensorType::Q5_1: fn(Rows<Legacy<TensorType::Q5_1>>{}); return true;
        case TensorType::Q8_0: fn(Rows<Legacy<TensorType::Q8_0>>{}); return true;
        case TensorType::Q4_K: fn(Rows<K4<false>>{}); return true;
        case TensorType::Q5_K: fn(Rows<K4<true>>{}); return true;
        case TensorType::Q6_K: fn(Rows<K6>{}); return true;
        default: return false;
    }
}

void read_row(TensorType type, const Place& p, const uint8_t* w, int64_t row, uint8_t* out) {
    with_rows(type, [&](auto rows_of) { rows_of.read(p, w, row / kGroupRows, int(row % kGroupRows), out); });
}

Status check(TensorType type, int64_t cols, LayoutKind& k, const char* what) {
    if (!detail::layout_kind(type, k))
        return Error{std::string(what) + ": no interleaved layout for " + tensor_type_name(uint32_t(type))};
    const int64_t block = k.k_quant ? 256 : 32;
    if (cols < block || cols % block != 0)
        return Error{std::string(what) + ": " + std::to_string(cols) + " columns are not a whole number of " +
                     std::to_string(block) + "-element blocks"};
    return {};
}

// The paths without a kernel over the layout: each row read back, then the
// path's own row kernel on it (the bits every path shares).
template <TensorType kType, SimdPath kPath>
void dot_group_by_rows(const void* w, int64_t rows, int64_t g, const block_q8a* a, int n_tokens, int64_t k,
                       float* out, int64_t out_stride) {
    const int64_t nb = k / 32;
    LayoutKind kind;
    detail::layout_kind(kType, kind);
    const Place place(kind, nb, rows);
    std::vector<uint8_t> row(row_bytes(kType, k));
    const DotRowFn dot = dot_row_kernel(kType, kPath);
    for (int64_t r = 0; r < kGroupRows && g * kGroupRows + r < rows; ++r) {
        read_row(kType, place, static_cast<const uint8_t*>(w), g * kGroupRows + r, row.data());
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
        case TensorType::Q4_K: return dot_group_by_rows<TensorType::Q4_K, kPath>;
        case TensorType::Q5_K: return dot_group_by_rows<TensorType::Q5_K, kPath>;
        case TensorType::Q6_K: return dot_group_by_rows<TensorType::Q6_K, kPath>;
        default: return nullptr;
    }
}

}  // namespace

bool interleaved_type(TensorType type) {
    LayoutKind k;
    return detail::layout_kind(type, k);
}

size_t interleaved_bytes(TensorType type, int64_t rows, int64_t cols) {
    LayoutKind k;
    if (rows < 1 || !check(type, cols, k, "").ok()) return 0;
    return detail::matrix_bytes_of(k, cols / 32, (rows + kGroupRows - 1) / kGroupRows);
}

Status interleave_groups(TensorType type, const void* src, size_t src_stride, int64_t rows, int64_t cols, void* dst,
                         int64_t g0, int64_t g1) {
    LayoutKind k;
    if (Status st = check(type, cols, k, "interleave_groups"); !st.ok()) return st;
    if (rows < 1 || !src || !dst) return Error{"interleave_groups: no rows or no data"};
    const int64_t n_groups = (rows + kGroupRows - 1) / kGroupRows;
    if (g0 < 0 || g1 > n_groups || g0 > g1)
        return Error{"interleave_groups: groups [" + std::to_string(g0) + ", " + std::to_string(g1) + ") of " +
                     std::to_string(n_groups)};
    const size_t rb = row_bytes(type, cols);
    if (src_stride < rb)
        return Error{"interleave_groups: row stride " + std::to_string(src_stride) + " is below the row size"};
    const Place place(k, cols / 32, rows);
    auto* out = static_cast<uint8_t*>(dst);
    const auto* in = static_cast<const uint8_t*>(src);
    const std::vector<uint8_t> zero_row(rb, 0);
    for (int64_t g = g0; g < g1; ++g) {
        for (int r = 0; r < kGroupRows; ++r) {
            const int64_t row = g * kGroupRows + r;
            const uint8_t* from = row < rows ? in + size_t(row) * src_stride : zero_row.data();
            with_rows(type, [&](auto rows_of) { rows_of.write(place, out, g, r, from); });
        }
    }
    // The bytes past the last plane, up to the 64-byte total.
    if (g1 == n_groups) {
        const size_t used = size_t(n_groups) * detail::part_bytes(k, cols / 32).total();
        std::memset(out + used, 0, detail::matrix_bytes_of(k, cols / 32, n_groups) - used);
    }
    return {};
}

Status interleave_rows(TensorType type, const void* src, size_t src_stride, int64_t rows, int64_t cols, void* dst) {
    return interleave_groups(type, src, src_stride, rows, cols, dst, 0, (rows + kGroupRows - 1) / kGroupRows);
}

Status deinterleave_row(TensorType type, const void* src, int64_t rows, int64_t cols, int64_t r, void* row) {
    LayoutKind k;
    if (Status st = check(type, cols, k, "deinterleave_row"); !st.ok()) return st;
    if (r < 0 || r >= rows || !src || !row)
        return Error{"deinterleave_row: row " + std::to_string(r) + " of " + std::to_string(rows) + ", or no data"};
    read_row(type, Place(k, cols / 32, rows), static_cast<const uint8_t*>(src), r, static_cast<uint8_t*>(row));
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
