// Host memory for the logits (backend/host_memory.h): plain and aligned
// before a GPU backend asks for page-locked blocks; after it asks, new blocks
// come from its allocator and every block, older ones included, goes back
// the way it was made; an allocator that fails leaves plain memory. The
// "page-locked" allocator here is a counting stand-in.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/host_memory.h"
#include "model/forward.h"

namespace tern {
namespace {

using backend::host_alloc;
using backend::host_free;
using backend::host_pinned;

int g_made = 0, g_freed = 0;
void* counting_alloc(size_t bytes) {
    ++g_made;
    return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
}
void counting_free(void* p) {
    ++g_freed;
    std::free(p);
}
void* failing_alloc(size_t) { return nullptr; }
constexpr backend::PinnedMemory kCounting{counting_alloc, counting_free};
constexpr backend::PinnedMemory kFailing{failing_alloc, counting_free};

// Every test leaves the process as it found it: no pinning.
struct HostMemory : ::testing::Test {
    void SetUp() override {
        backend::enable_pinned_host_memory(nullptr);
        g_made = g_freed = 0;
    }
    void TearDown() override { backend::enable_pinned_host_memory(nullptr); }
};

TEST_F(HostMemory, PlainBlocksAreAlignedWritableAndNotPinned) {
    for (size_t bytes : {size_t(0), size_t(1), size_t(63), size_t(4096), size_t(3) << 20}) {
        void* p = host_alloc(bytes);
        ASSERT_NE(p, nullptr) << bytes;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
        EXPECT_FALSE(host_pinned(p));
        std::memset(p, 0xab, bytes);
        host_free(p);
    }
    host_free(nullptr);
    EXPECT_FALSE(host_pinned(nullptr));
    EXPECT_EQ(host_alloc(size_t(-1)), nullptr);  // the header does not fit: refused, not wrapped
    EXPECT_EQ(g_made, 0);
}

TEST_F(HostMemory, BlocksGoBackTheWayTheyWereMade) {
    void* before = host_alloc(1000);
    backend::enable_pinned_host_memory(&kCounting);
    void* after = host_alloc(1000);
    EXPECT_EQ(g_made, 1);
    EXPECT_FALSE(host_pinned(before));
    EXPECT_TRUE(host_pinned(after));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(after) % 64, 0u);
    host_free(before);  // plain: not the pinned free
    EXPECT_EQ(g_freed, 0);
    backend::enable_pinned_host_memory(nullptr);  // pinning off: the pinned block still goes back pinned
    host_free(after);
    EXPECT_EQ(g_freed, 1);
}

TEST_F(HostMemory, AFailingPinnedAllocatorLeavesPlainMemory) {
    backend::enable_pinned_host_memory(&kFailing);
    void* p = host_alloc(4096);
    ASSERT_NE(p, nullptr);
    EXPECT_FALSE(host_pinned(p));
    host_free(p);
    EXPECT_EQ(g_freed, 0);
}

TEST_F(HostMemory, LogitsVectorsGrowAcrossKindsAndKeepTheirValues) {
    model::Logits l(1000);
    for (size_t i = 0; i < l.size(); ++i) l[i] = float(i);
    backend::enable_pinned_host_memory(&kCounting);
    l.resize(100000);  // regrown into a pinned block: the values move with it
    EXPECT_TRUE(host_pinned(l.data()));
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(l[i], float(i));
    const int made = g_made;
    l.resize(10);
    l.resize(100000);  // within capacity: no new block
    EXPECT_EQ(g_made, made);
    l = model::Logits();
    l.shrink_to_fit();
    EXPECT_EQ(g_freed, g_made);
}

}  // namespace
}  // namespace tern
