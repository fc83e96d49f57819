#include "backend/cpu/weight_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <string>

namespace tern::backend::cpu {
namespace {

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kChunk = size_t(256) << 20;  // weights are packed into chunks of at least this
constexpr size_t kAlign = 64;
constexpr size_t kCopyPiece = size_t(2) << 20;  // a thread's share of a copy: a huge page

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Bytes copied by every live arena of the process (the ranks of a CPU
// tensor-parallel group each hold one): the budget bounds their sum.
std::atomic<size_t> g_resident{0};

}  // namespace

WeightArena::WeightArena(size_t budget) : budget_(budget) {}

WeightArena::~WeightArena() {
    for (const Chunk& c : chunks_) munmap(c.map, c.map_size);
    g_resident -= copied_;
}

const void* WeightArena::copy(const void* src, size_t n) {
    auto* dst = static_cast<uint8_t*>(reserve(n));
    if (!dst) return nullptr;
    // Every thread copies a share: the copy is the first touch of the huge
    // pages (the kernel clears each) and of the file's pages, work that one
    // thread left at a few hundred MB/s.
    const auto* from = static_cast<const uint8_t*>(src);
    const int64_t pieces = int64_t((n + kCopyPiece - 1) / kCopyPiece);
#pragma omp parallel for schedule(static) if (pieces > 1)
    for (int64_t i = 0; i < pieces; ++i) {
        const size_t at = size_t(i) * kCopyPiece;
        std::memcpy(dst + at, from + at, std::min(kCopyPiece, n - at));
    }
    return dst;
}

void* WeightArena::reserve(size_t n) {
    if (n == 0) return nullptr;
    size_t resident = g_resident.load();
    do {
        if (n > budget_ - std::min(budget_, resident)) return nullptr;
    } while (!g_resident.compare_exchange_weak(resident, resident + n));
    const size_t need = round_up(n, kAlign);
    Chunk* chunk = chunks_.empty() ? nullptr : &chunks_.back();
    if (!chunk || chunk->size - chunk->used < need) {
        // Over-allocated by a huge page so that the chunk can start on one.
        const size_t size = round_up(std::max(need, kChunk), kHugePage);
        void* map = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED) {
            g_resident -= n;
            return nullptr;
        }
        auto* base = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(map), kHugePage));
        madvise(base, size, MADV_HUGEPAGE);  // advice: without it the copy still serves
        chunks_.push_back(Chunk{map, size + kHugePage, base, size, 0});
        chunk = &chunks_.back();
    }
    uint8_t* dst = chunk->base + chunk->used;
    chunk->used += need;
    copied_ += n;
    return dst;
}

size_t WeightArena::available_budget() {
    static const size_t budget = [] {
        std::ifstream meminfo("/proc/meminfo");
        std::string key, unit;
        size_t kib = 0;
        while (meminfo >> key >> kib >> unit)
            if (key == "MemAvailable:") return kib / 4 * 3 * 1024;
        return size_t(0);
    }();
    return budget;
}

}  // namespace tern::backend::cpu
