// The page tables of a paged KV cache (backend.h, KvCacheShape): which pool
// page holds each slot's positions, kept on the host by every backend (the
// CUDA backend copies it to the device when it changed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/result.h"

namespace tern::backend {

class KvPageTable {
public:
    // A table for `shape`: when its pool holds every slot's context, slot s
    // mapped to pages s * pages_per_slot onwards; else nothing mapped.
    void init(const KvCacheShape& shape) {
        shape_ = shape;
        const int per = shape.pages_per_slot();
        table_.assign(size_t(shape.n_slots) * size_t(per), kUnmapped);
        if (shape.n_pages == 0)
            for (size_t i = 0; i < table_.size(); ++i) table_[i] = int32_t(i);
        changed_ = true;
    }

    // Backend::map_kv_pages: every page inside the pool, at most pages_per_slot of them.
    Status map(int slot, const std::vector<int32_t>& pages) {
        const int per = shape_.pages_per_slot();
        if (slot < 0 || slot >= shape_.n_slots)
            return Error{"kv pages: slot " + std::to_string(slot) + " does not exist"};
        if (int64_t(pages.size()) > per)
            return Error{"kv pages: " + std::to_string(pages.size()) + " pages for a slot of " + std::to_string(per)};
        for (int32_t p : pages)
            if (p < 0 || p >= shape_.pool_pages())
                return Error{"kv pages: page " + std::to_string(p) + " is outside the pool of " +
                             std::to_string(shape_.pool_pages())};
        int32_t* row = table_.data() + size_t(slot) * size_t(per);
        for (int i = 0; i < per; ++i) row[i] = i < int(pages.size()) ? pages[size_t(i)] : kUnmapped;
        changed_ = true;
        return {};
    }

    // The pool page holding (slot, pos), or kUnmapped (also for a slot or
    // position outside the cache).
    int32_t page(int slot, int pos) const {
        if (slot < 0 || slot >= shape_.n_slots || pos < 0 || pos >= shape_.n_ctx) return kUnmapped;
        return slot_pages(slot)[pos / shape_.page_size];
    }
    const int32_t* slot_pages(int slot) const {
        return table_.data() + size_t(slot) * size_t(shape_.pages_per_slot());
    }
    const std::vector<int32_t>& entries() const { return table_; }  // [slot][page of the slot]

    // Whether the table changed since the last call (the device copy is stale).
    bool take_changed() {
        const bool c = changed_;
        changed_ = false;
        return c;
    }

    static constexpr int32_t kUnmapped = -1;

private:
    KvCacheShape shape_;
    std::vector<int32_t> table_;
    bool changed_ = false;
};

}  // namespace tern::backend
