// Where each part of an interleaved group lies (interleave.h), for the code
// that writes groups and the kernels that read them. `static inline`: the
// kernel files are compiled with their own instruction-set flags
// (dot_internal.h says why that matters).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gguf/tensor_type.h"

namespace tern::quant::detail {

constexpr int kLayoutRows = 16;

// What a type keeps per block (32 elements) of each row.
struct LayoutKind {
    int words = 0;         // 4-byte words of quants: 4 (nibbles) or 8 (q8_0's bytes)
    int high_words = 0;    // words of high bits: 1 (q5 types: the fifth bit), 2 (q6_K: two bits)
    bool k_quant = false;  // d (and dmin) per 256-element super-block, sub-block scales per block
    bool has_min = false;  // q4_1, q5_1: a min per block; q4_K, q5_K: dmin and a min per block
    int scales = 0;        // K-quants: sub-block scales per block (q4_K, q5_K: 1; q6_K: 2)
};

static constexpr bool layout_kind(TensorType type, LayoutKind& k) {
    switch (type) {
        case TensorType::Q4_0: k = {4, 0, false, false, 0}; return true;
        case TensorType::Q4_1: k = {4, 0, false, true, 0}; return true;
        case TensorType::Q5_0: k = {4, 1, false, false, 0}; return true;
        case TensorType::Q5_1: k = {4, 1, false, true, 0}; return true;
        case TensorType::Q8_0: k = {8, 0, false, false, 0}; return true;
        case TensorType::Q4_K: k = {4, 0, true, true, 1}; return true;
        case TensorType::Q5_K: k = {4, 1, true, true, 1}; return true;
        case TensorType::Q6_K: k = {4, 2, true, false, 2}; return true;
        default: return false;
    }
}

static constexpr LayoutKind layout_of(TensorType type) {
    LayoutKind k;
    layout_kind(type, k);
    return k;
}

// One group's bytes of each part (nb blocks, a multiple of 8 for K-quants).
struct PartBytes {
    size_t qs = 0;  // quanta: nb units of words * 64 bytes
    size_t qh = 0;  // high bits: nb units of high_words * 64 bytes
    size_t d = 0;   // f16 scales: per block, or per super-block (K-quants), 32 bytes each
    size_t m = 0;   // f16 mins (or dmin), as d
    size_t sc = 0;  // K-quants: nb units of scales * 16 bytes
    size_t mn = 0;  // q4_K, q5_K: nb units of 16 bytes
    size_t total() const { return qs + qh + d + m + sc + mn; }
};

static inline PartBytes part_bytes(const LayoutKind& k, int64_t nb) {
    const size_t n = size_t(nb), rows = kLayoutRows;
    const size_t scale_units = k.k_quant ? n / 8 : n;
    PartBytes b;
    b.qs = n * size_t(k.words) * 4 * rows;
    b.qh = n * size_t(k.high_words) * 4 * rows;
    b.d = scale_units * 2 * rows;
    b.m = k.has_min ? scale_units * 2 * rows : 0;
    b.sc = n * size_t(k.scales) * rows;
    b.mn = k.k_quant && k.has_min ? n * rows : 0;
    return b;
}

// A matrix keeps each part in a plane of its own, every group's share of it
// one after another, so that a thread streaming its groups reads a few long
// runs (a hardware prefetcher follows one stream per page; several parts of
// one group side by side in a page defeat it): the offsets of group gi's
// parts in a matrix of n_groups groups.
struct GroupPlanes {
    size_t qs = 0, qh = 0, d = 0, m = 0, sc = 0, mn = 0;
};

static inline GroupPlanes group_planes(const LayoutKind& k, int64_t nb, int64_t n_groups, int64_t gi) {
    const PartBytes b = part_bytes(k, nb);
    const size_t n = size_t(n_groups), i = size_t(gi);
    GroupPlanes p;
    size_t plane = 0;  // where the next plane starts
    auto place = [&](size_t part) {
        const size_t at = plane + i * part;
        plane += n * part;
        return at;
    };
    p.qs = place(b.qs);
    p.qh = place(b.qh);
    p.d = place(b.d);
    p.m = place(b.m);
    p.sc = place(b.sc);
    p.mn = place(b.mn);
    return p;
}

// The matrix's bytes: its planes, rounded up to 64.
static inline size_t matrix_bytes_of(const LayoutKind& k, int64_t nb, int64_t n_groups) {
    return (size_t(n_groups) * part_bytes(k, nb).total() + 63) / 64 * 64;
}

}  // namespace tern::quant::detail
