#include "backend/host_memory.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace tern::backend {
namespace {

// A block is [header | the caller's bytes]: the header says where the whole
// starts and how to free it (null: std::free), and keeps the caller's bytes
// 64-byte aligned.
constexpr size_t kHeader = 64;
struct Header {
    void* base;
    void (*free)(void*);
};
static_assert(sizeof(Header) <= kHeader);

std::atomic<const PinnedMemory*> g_pinned{nullptr};

Header* header_of(void* p) { return reinterpret_cast<Header*>(static_cast<char*>(p) - kHeader); }

}  // namespace

void enable_pinned_host_memory(const PinnedMemory* m) {
    g_pinned.store(m && m->alloc && m->free ? m : nullptr);
}

void* host_alloc(size_t bytes) {
    if (bytes > size_t(-1) - kHeader) return nullptr;
    const size_t total = bytes + kHeader;
    void* base = nullptr;
    void (*release)(void*) = nullptr;
    if (const PinnedMemory* pin = g_pinned.load()) {
        base = pin->alloc(total);  // page-aligned
        if (base) release = pin->free;
    }
    if (!base) base = std::aligned_alloc(kHeader, (total + kHeader - 1) / kHeader * kHeader);
    if (!base) return nullptr;
    *static_cast<Header*>(base) = Header{base, release};
    return static_cast<char*>(base) + kHeader;
}

void host_free(void* p) noexcept {
    if (!p) return;
    const Header h = *header_of(p);
    if (h.free)
        h.free(h.base);
    else
        std::free(h.base);
}

bool host_pinned(const void* p) noexcept {
    return p && header_of(const_cast<void*>(p))->free != nullptr;
}

}  // namespace tern::backend
