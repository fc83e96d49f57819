// The scheduler's delivery thread: jobs run in the order they were handed
// over, one at a time, off the posting thread; flush() waits for them; the
// destructor runs what is still queued.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "runtime/delivery.h"

namespace {

using tern::runtime::Delivery;

TEST(Delivery, RunsJobsInOrderOneAtATimeOffThePostingThread) {
    std::vector<int> seen;  // touched only by jobs: one at a time, so no lock
    std::atomic<int> running{0};
    std::atomic<bool> overlapped{false}, on_poster{false};
    const std::thread::id poster = std::this_thread::get_id();
    Delivery d;
    d.flush();  // nothing handed over yet: returns at once
    int next = 0;
    for (int round = 0; round < 200; ++round) {
        std::vector<std::function<void()>> jobs;
        for (int i = 0; i < 1 + round % 7; ++i)
            jobs.push_back([&, k = next++] {
                if (running.fetch_add(1) != 0) overlapped = true;
                if (std::this_thread::get_id() == poster) on_poster = true;
                seen.push_back(k);
                running.fetch_sub(1);
            });
        d.post(jobs);
        EXPECT_TRUE(jobs.empty()) << "post takes the jobs";
    }
    d.flush();
    ASSERT_EQ(int(seen.size()), next);
    for (int i = 0; i < next; ++i) ASSERT_EQ(seen[size_t(i)], i);
    EXPECT_FALSE(overlapped);
    EXPECT_FALSE(on_poster);
}

TEST(Delivery, FlushWaitsForASlowJobAndTheDestructorRunsWhatIsLeft) {
    std::atomic<int> done{0};
    {
        Delivery d;
        std::vector<std::function<void()>> jobs;
        jobs.push_back([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            ++done;
        });
        d.post(jobs);
        d.flush();
        EXPECT_EQ(done.load(), 1);
        for (int i = 0; i < 3; ++i) {
            jobs.push_back([&] {
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
                ++done;
            });
            d.post(jobs);
        }
    }
    EXPECT_EQ(done.load(), 4);
}

}  // namespace
