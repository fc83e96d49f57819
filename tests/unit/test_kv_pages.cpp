// The KV page pool (runtime/kv_pages.h): pages taken, shared through their
// tokens, kept after release and taken back least recently released first;
// and the forward pass refusing a position whose page is not mapped.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>

#include "model/synth.h"
#include "runtime/engine.h"
#include "runtime/kv_pages.h"
#include "tests/support/test_seed.h"
#include "tests/support/test_shapes.h"

namespace tern::runtime {
namespace {

std::vector<int32_t> tokens(int n, int32_t first) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    std::iota(t.begin(), t.end(), first);
    return t;
}

TEST(KvPagePool, TakesEveryPageOnceThenNone) {
    KvPagePool pool(5, 4);
    std::set<int32_t> seen;
    for (int i = 0; i < 5; ++i) {
        auto p = pool.take();
        ASSERT_TRUE(p);
        EXPECT_TRUE(seen.insert(*p).second) << "page " << *p << " given twice";
        EXPECT_GE(*p, 0);
        EXPECT_LT(*p, 5);
    }
    EXPECT_FALSE(pool.take());
    EXPECT_EQ(pool.available(), 0);
    EXPECT_EQ(pool.held(), 5);
    pool.release(*seen.begin());
    EXPECT_EQ(pool.available(), 1);
    EXPECT_EQ(pool.take(), *seen.begin());
}

TEST(KvPagePool, KeptPagesAreFoundByTheirTokensInOrder) {
    KvPagePool pool(8, 4);
    const std::vector<int32_t> t = tokens(14, 100);  // three full pages and two tokens
    std::vector<int32_t> pages;
    for (int i = 0; i < 3; ++i) pages.push_back(*pool.take());
    for (int i = 0; i < 3; ++i) pool.keep(i ? pages[size_t(i - 1)] : KvPagePool::kNoPage, t.data() + 4 * i, pages[size_t(i)]);
    EXPECT_EQ(pool.kept(), 3);

    // The same start finds the chain, up to max_pages and as far as tokens agree.
    EXPECT_EQ(pool.match(t.data(), t.size(), 10), pages);
    EXPECT_EQ(pool.match(t.data(), t.size(), 2), std::vector<int32_t>(pages.begin(), pages.begin() + 2));
    std::vector<int32_t> other = t;
    other[9] = 7;  // inside the third page
    EXPECT_EQ(pool.match(other.data(), other.size(), 10), std::vector<int32_t>(pages.begin(), pages.begin() + 2));
    other[0] = 7;  // the first page differs: nothing
    EXPECT_TRUE(pool.match(other.data(), other.size(), 10).empty());
    // The same tokens at another place in a sequence are another page.
    EXPECT_TRUE(pool.match(t.data() + 4, t.size() - 4, 10).empty());
    // Too few tokens for a page: none.
    EXPECT_TRUE(pool.match(t.data(), 3, 10).empty());
}

TEST(KvPagePool, HeldPagesStayAndIdleOnesGoBackOldestFirst) {
    KvPagePool pool(3, 2);
    const std::vector<int32_t> a = {1, 2}, b = {3, 4};
    const int32_t pa = *pool.take(), pb = *pool.take(), pc = *pool.take();
    pool.keep(KvPagePool::kNoPage, a.data(), pa);
    pool.keep(KvPagePool::kNoPage, b.data(), pb);
    // Nothing free while all three are held.
    EXPECT_FALSE(pool.take());
    pool.release(pb);  // released first: taken back first
    pool.release(pa);
    EXPECT_EQ(pool.available(), 2);
    // A match holds a kept page again: it is no longer available.
    EXPECT_EQ(pool.match(a.data(), 2, 1), std::vector<int32_t>{pa});
    EXPECT_EQ(pool.available(), 1);
    EXPECT_EQ(pool.take(), pb);  // the idle kept page, forgotten
    EXPECT_TRUE(pool.match(b.data(), 2, 1).empty());
    EXPECT_FALSE(pool.take());
    pool.release(pc);  // never kept: free
    EXPECT_EQ(pool.take(), pc);
}

TEST(KvPagePool, AChainEndsWhereAPageWasTakenBack) {
    KvPagePool pool(2, 2);
    const std::vector<int32_t> t = {1, 2, 3, 4};
    const int32_t p0 = *pool.take(), p1 = *pool.take();
    pool.keep(KvPagePool::kNoPage, t.data(), p0);
    pool.keep(p0, t.data() + 2, p1);
    pool.release(p0);
    pool.release(p1);
    // p0 is taken back and written with other tokens; p1's entry named p0's
    // old contents, so the chain {1, 2, 3, 4} is not found past it.
    EXPECT_EQ(pool.take(), p0);
    const std::vector<int32_t> again = {1, 2};
    pool.keep(KvPagePool::kNoPage, again.data(), p0);
    EXPECT_EQ(pool.match(t.data(), 4, 2), std::vector<int32_t>{p0});
}

TEST(KvPagePool, DuplicateContentsKeepTheFirstPage) {
    KvPagePool pool(4, 2);
    const std::vector<int32_t> t = {5, 6, 7, 8};
    const int32_t a0 = *pool.take(), b0 = *pool.take(), b1 = *pool.take();
    pool.keep(KvPagePool::kNoPage, t.data(), a0);
    pool.keep(KvPagePool::kNoPage, t.data(), b0);  // the same tokens: a0 stays the one found
    pool.keep(b0, t.data() + 2, b1);               // after a page not kept: never findable, not kept
    EXPECT_EQ(pool.kept(), 1);
    EXPECT_EQ(pool.match(t.data(), 4, 2), std::vector<int32_t>{a0});
    pool.release(b0);
    pool.release(b1);
    EXPECT_EQ(pool.available(), 3);  // b0, b1 free; a0 held twice (take and match)
}

// A fuzz of the pool against a model of it: sequences of up to three pages
// of two tokens (from a three-token alphabet, so contents repeat) take, keep,
// match and release pages at random. Every page is free, idle or held, a
// held page is never handed out, and every match returns pages whose
// recorded contents are the requested tokens after the requested chain.
TEST(KvPagePool, RandomUseKeepsTheCounts) {
    const uint64_t seed = test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    constexpr int kPages = 16;
    KvPagePool pool(kPages, 2);
    std::vector<int> holds(kPages, 0);
    // What the model knows of a page: its contents' id (a fresh one each
    // take), and, once kept, the id of the page before it and its tokens.
    struct Content {
        uint64_t id = 0, prev = 0;
        std::vector<int32_t> tokens;
    };
    std::vector<Content> content(kPages);
    uint64_t next_id = 1;
    std::vector<std::vector<int32_t>> seqs;  // each a chain of held pages
    auto pair = [&] { return std::vector<int32_t>{int32_t(rng() % 3), int32_t(rng() % 3)}; };
    for (int step = 0; step < 20000; ++step) {
        const int what = int(rng() % 4);
        if (what == 0 && !seqs.empty()) {  // a sequence grows by a page and keeps it
            std::vector<int32_t>& q = seqs[rng() % seqs.size()];
            if (q.size() >= 3) continue;
            const auto p = pool.take();
            if (!p) {
                EXPECT_EQ(pool.available(), 0);
                continue;
            }
            ASSERT_EQ(holds[size_t(*p)], 0) << "page " << *p << " handed out while held";
            ++holds[size_t(*p)];
            content[size_t(*p)] = {next_id++, q.empty() ? 0 : content[size_t(q.back())].id, pair()};
            pool.keep(q.empty() ? KvPagePool::kNoPage : q.back(), content[size_t(*p)].tokens.data(), *p);
            q.push_back(*p);
        } else if (what == 1 && !seqs.empty()) {  // a sequence ends
            const size_t i = size_t(rng() % seqs.size());
            for (auto it = seqs[i].rbegin(); it != seqs[i].rend(); ++it) {
                --holds[size_t(*it)];
                pool.release(*it);
            }
            seqs.erase(seqs.begin() + int64_t(i));
        } else if (seqs.size() < 6) {  // a sequence starts from what is kept
            std::vector<int32_t> want;
            for (int k = 0; k < 3; ++k) {
                const std::vector<int32_t> t = pair();
                want.insert(want.end(), t.begin(), t.end());
            }
            const std::vector<int32_t> got = pool.match(want.data(), want.size(), 3);
            uint64_t prev = 0;
            for (size_t k = 0; k < got.size(); ++k) {
                const Content& c = content[size_t(got[k])];
                ASSERT_EQ(c.prev, prev) << "page " << got[k] << " matched after the wrong page";
                ASSERT_EQ(c.tokens, std::vector<int32_t>(want.begin() + int64_t(2 * k), want.begin() + int64_t(2 * k + 2)))
                    << "page " << got[k] << " matched for other tokens";
                prev = c.id;
                ++holds[size_t(got[k])];
            }
            seqs.push_back(got);
        }
        int n_held = 0;
        for (int h : holds) n_held += h > 0;
        ASSERT_EQ(pool.held(), n_held);
        for (int p = 0; p < kPages; ++p) ASSERT_EQ(pool.holds(p), holds[size_t(p)]);
    }
}

TEST(KvPages, ForwardRefusesPositionsWithoutAPage) {
    model::SynthOptions o;
    o.shape = *model::synth_preset("tiny");
    o.ftype = quant::FileType::Q8_0;
    o.seed = 3;
    o.n_threads = 2;
    auto written = test::write_temp_model("kv-pages", o);
    ASSERT_TRUE(written.ok()) << written.error().message;
    const std::string path = *written;
    EngineOptions eo;
    eo.threads = 2;
    eo.n_slots = 4;
    eo.n_ctx = 64;
    eo.kv_tokens = 100;  // rounded up to 4 pages of 32: fewer than 4 slots x 2
    auto engine = Engine::open(path, eo);
    ASSERT_TRUE(engine.ok()) << engine.error().message;
    model::Pass& pass = (*engine)->forward();
    EXPECT_EQ(pass.kv_pool_pages(), 4);
    EXPECT_EQ(pass.kv_page_size(), 32);
    model::Batch b;
    b.add(5, 0, 1, true);
    model::Logits logits;
    Status s = pass.run(b, logits);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("has no KV page mapped"), std::string::npos) << s.message();
    ASSERT_TRUE(pass.map_kv_pages(1, {3}).ok());
    EXPECT_TRUE(pass.run(b, logits).ok());
    model::Batch far;
    far.add(5, 40, 1, true);  // the slot's second page is not mapped
    EXPECT_FALSE(pass.run(far, logits).ok());
    const Status outside = pass.map_kv_pages(1, {4});
    ASSERT_FALSE(outside.ok());
    EXPECT_NE(outside.message().find("page 4 is outside the pool of 4"), std::string::npos) << outside.message();
    EXPECT_FALSE(pass.map_kv_pages(1, {0, 1, 2}).ok());  // more than a slot's context
    EXPECT_FALSE(pass.map_kv_pages(4, {0}).ok());        // no such slot
    EXPECT_TRUE(pass.run(b, logits).ok());               // the refused maps changed nothing

    // A pool smaller than one context is refused at open.
    eo.kv_tokens = 20;
    auto small = Engine::open(path, eo);
    ASSERT_FALSE(small.ok());
    EXPECT_NE(small.error().message.find("cannot hold one sequence"), std::string::npos) << small.error().message;
    std::filesystem::remove(path);
}

}  // namespace
}  // namespace tern::runtime
