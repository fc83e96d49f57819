// Host memory for what a device hands back every step: the logits rows. Once
// a GPU backend has started in the process, new blocks are page-locked, so a
// device's copy into them is one DMA at the bus's rate rather than a copy
// staged through the driver's own buffers and copied again (at 32-64
// sequences those copies were a tenth of a decode step). Before that, and
// without a GPU, they are plain heap memory. Each block records which kind
// it is, so it is freed the way it was made whatever happens in between.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace tern::backend {

// How a GPU backend makes and frees page-locked memory; alloc returns null
// when it cannot (the block is then plain memory).
struct PinnedMemory {
    void* (*alloc)(size_t bytes) = nullptr;
    void (*free)(void* p) = nullptr;
};

// Called by a GPU backend when it starts: blocks made from then on are pinned
// by *m, which must live as long as the process (a static); null stops that.
// Each block keeps the free it needs.
void enable_pinned_host_memory(const PinnedMemory* m);

// bytes of memory aligned for any float vector work (64 bytes); null when
// there is none. host_free(nullptr) does nothing.
void* host_alloc(size_t bytes);
void host_free(void* p) noexcept;
// Whether p (from host_alloc) is page-locked.
bool host_pinned(const void* p) noexcept;

template <class T>
struct HostAllocator {
    using value_type = T;
    HostAllocator() = default;
    template <class U>
    HostAllocator(const HostAllocator<U>&) noexcept {}
    T* allocate(size_t n) {
        if (n > size_t(-1) / sizeof(T)) throw std::bad_array_new_length();
        void* p = host_alloc(n * sizeof(T));
        if (!p) throw std::bad_alloc();
        return static_cast<T*>(p);
    }
    void deallocate(T* p, size_t) noexcept { host_free(p); }
    template <class U>
    bool operator==(const HostAllocator<U>&) const noexcept { return true; }
};

template <class T>
using HostVector = std::vector<T, HostAllocator<T>>;

}  // namespace tern::backend
