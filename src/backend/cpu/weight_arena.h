// Memory for the CPU backend's weight matrices, backed by 2 MiB pages where
// the kernel gives them.
//
// A one-token step streams every weight byte once. Read in place from the
// GGUF mapping, the bytes sit in 4 KiB pages of the page cache, and the
// stream takes a TLB miss every 4 KiB; copied at registration into memory
// advised for transparent huge pages, a 7B-shaped Q4_K_M file decoded
// 40-46% faster on a 2-core Xeon (docs/perf/LOG.md c22). The copy is skipped,
// and the weight read in place, where the process's copies would pass three
// quarters of the memory available when the first arena was made, or where
// memory cannot be had: the mapping can be paged out under pressure, a copy cannot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tern::backend::cpu {

class WeightArena {
public:
    // budget: the most bytes that this and every other live arena of the
    // process may hold copied together; `available_budget()` is the default.
    explicit WeightArena(size_t budget);
    ~WeightArena();
    WeightArena(const WeightArena&) = delete;
    WeightArena& operator=(const WeightArena&) = delete;

    // A 64-byte aligned copy of bytes [src, src + n), or nullptr (over the
    // budget, or no memory to be had): the caller keeps src.
    const void* copy(const void* src, size_t n);

    // n bytes, 64-byte aligned, for the caller to write (a registration layout
    // other than the file's), or nullptr as for copy().
    void* reserve(size_t n);

    size_t copied() const { return copied_; }

    // Three quarters of the memory the system reported available (MemAvailable:
    // free memory and reclaimable caches, the model file's pages among them)
    // the first time it was asked in this process; 0 where it cannot be read.
    static size_t available_budget();

private:
    struct Chunk {
        void* map = nullptr;  // what mmap returned, for munmap
        size_t map_size = 0;
        uint8_t* base = nullptr;  // 2 MiB aligned within the mapping
        size_t size = 0;
        size_t used = 0;
    };
    std::vector<Chunk> chunks_;
    size_t budget_ = 0;
    size_t copied_ = 0;
};

}  // namespace tern::backend::cpu
