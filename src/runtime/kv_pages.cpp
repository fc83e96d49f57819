#include "runtime/kv_pages.h"

namespace tern::runtime {

size_t KvPagePool::KeyHash::operator()(const Key& k) const {
    // FNV-1a over the previous page's generation and the tokens.
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) {
        for (int i = 0; i < 8; ++i) {
            h ^= (v >> (8 * i)) & 0xffu;
            h *= 1099511628211ull;
        }
    };
    mix(k.prev);
    for (int32_t t : k.tokens) mix(uint64_t(uint32_t(t)));
    return size_t(h);
}

KvPagePool::KvPagePool(int n_pages, int page_size)
    : page_size_(page_size),
      holds_(size_t(n_pages), 0),
      generation_(size_t(n_pages), 0),
      idle_at_(size_t(n_pages)),
      key_of_(size_t(n_pages), nullptr) {
    free_.reserve(size_t(n_pages));
    for (int32_t p = n_pages - 1; p >= 0; --p) free_.push_back(p);  // page 0 first
}

std::optional<int32_t> KvPagePool::take() {
    int32_t page;
    if (!free_.empty()) {
        page = free_.back();
        free_.pop_back();
    } else if (!idle_.empty()) {
        page = idle_.front();
        idle_.pop_front();
        forget(page);
    } else {
        return std::nullopt;
    }
    holds_[size_t(page)] = 1;
    generation_[size_t(page)] = next_generation_++;
    return page;
}

void KvPagePool::release(int32_t page) {
    if (--holds_[size_t(page)] > 0) return;
    if (key_of_[size_t(page)]) {
        idle_at_[size_t(page)] = idle_.insert(idle_.end(), page);
    } else {
        free_.push_back(page);
    }
}

std::vector<int32_t> KvPagePool::match(const int32_t* tokens, size_t n_tokens, size_t max_pages) {
    std::vector<int32_t> pages;
    Key key{0, {}};
    const size_t P = size_t(page_size_);
    for (size_t i = 0; i < max_pages && (i + 1) * P <= n_tokens; ++i) {
        key.tokens.assign(tokens + i * P, tokens + (i + 1) * P);
        const auto it = index_.find(key);
        if (it == index_.end()) break;
        const int32_t page = it->second;
        if (holds_[size_t(page)]++ == 0) idle_.erase(idle_at_[size_t(page)]);
        pages.push_back(page);
        key.prev = generation_[size_t(page)];
    }
    return pages;
}

void KvPagePool::keep(int32_t prev, const int32_t* tokens, int32_t page) {
    if (key_of_[size_t(page)]) return;
    // A chain is found from its first page on: after a page that is not
    // kept (its tokens were kept in another), this one could never be found.
    if (prev != kNoPage && !key_of_[size_t(prev)]) return;
    Key key{prev == kNoPage ? 0 : generation_[size_t(prev)], std::vector<int32_t>(tokens, tokens + page_size_)};
    const auto [it, added] = index_.emplace(std::move(key), page);
    if (added) key_of_[size_t(page)] = &it->first;
}

void KvPagePool::forget(int32_t page) {
    index_.erase(index_.find(*key_of_[size_t(page)]));  // by position: the key lives in the node erased
    key_of_[size_t(page)] = nullptr;
}

}  // namespace tern::runtime
