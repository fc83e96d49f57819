// The KV pool's pages as the scheduler hands them out (backend.h: a sequence
// reaches its positions through a table of pages). A page is free, held by
// one or more sequences, or kept: a full page of a prompt or a reply,
// indexed by its tokens and the page before it, so that a later sequence
// starting with the same tokens maps the same page instead of computing it
// again (a common system prompt, a conversation's next turn). A kept page
// that no sequence holds is taken back, least recently released first, when
// no page is free.
//
// Only whole pages are shared, and a sequence writes only positions past its
// shared pages, so a kept page's contents never change while it is indexed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace tern::runtime {

class KvPagePool {
public:
    static constexpr int32_t kNoPage = -1;

    KvPagePool(int n_pages, int page_size);

    int page_size() const { return page_size_; }
    int n_pages() const { return int(holds_.size()); }
    // Pages a take() can get now: the free ones and the kept ones nobody holds.
    int available() const { return int(free_.size() + idle_.size()); }
    // Pages some sequence holds.
    int held() const { return n_pages() - available(); }
    // Pages kept for their tokens (held or not).
    int kept() const { return int(index_.size()); }
    // How many sequences hold `page`.
    int holds(int32_t page) const { return holds_[size_t(page)]; }

    // A page for a sequence to write (held once): a free page, else the kept
    // page released longest ago (no longer found by its tokens); none when
    // every page is held.
    std::optional<int32_t> take();
    // One hold less; a page nobody holds becomes free, or idle if kept.
    void release(int32_t page);

    // The kept pages that hold tokens[0 .. n_pages * page_size) in order, for
    // up to max_pages pages (fewer where the chain of kept pages ends), each
    // held once more for the caller.
    std::vector<int32_t> match(const int32_t* tokens, size_t n_tokens, size_t max_pages);

    // Keeps `page` (held, full) as the page holding `tokens` (page_size of
    // them) after `prev` (the sequence's page before it, kNoPage for its
    // first). Nothing changes when those tokens after `prev` are kept already
    // (in this page or another), or when `prev` is not kept.
    void keep(int32_t prev, const int32_t* tokens, int32_t page);

private:
    struct Key {
        uint64_t prev;                // the generation of the page before (0: none)
        std::vector<int32_t> tokens;  // page_size of them
        bool operator==(const Key& o) const { return prev == o.prev && tokens == o.tokens; }
    };
    struct KeyHash {
        size_t operator()(const Key& k) const;
    };
    void forget(int32_t page);  // drops a kept page from the index

    int page_size_;
    std::vector<int> holds_;
    // A page's generation names its contents: a fresh one each take(), so an
    // index entry whose `prev` was taken back never matches again.
    std::vector<uint64_t> generation_;
    uint64_t next_generation_ = 1;
    std::vector<int32_t> free_;
    std::list<int32_t> idle_;  // kept, nobody holds them: released longest ago first
    std::vector<std::list<int32_t>::iterator> idle_at_;
    std::unordered_map<Key, int32_t, KeyHash> index_;
    std::vector<const Key*> key_of_;  // the index entry of a kept page, else null
};

}  // namespace tern::runtime
