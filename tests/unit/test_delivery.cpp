// The scheduler's delivery thread: jobs run in the order they were handed
// over, one at a time, off the posting thread; a hand-over waits for the one
// before; flush() waits for them; the destructor runs what is still queued.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
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

TEST(Delivery, AHandOverWaitsForTheOneBeforeToHaveRun) {
    Delivery d;
    std::promise<void> release;
    std::shared_future<void> gate = release.get_future().share();
    std::vector<std::function<void()>> jobs;
    jobs.push_back([gate] { gate.wait(); });
    d.post(jobs);
    std::atomic<bool> second_posted{false};
    std::thread poster([&] {
        std::vector<std::function<void()>> more;
        more.push_back([] {});
        d.post(more);
        second_posted = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(second_posted.load()) << "the second hand-over went in while the first was still running";
    release.set_value();
    poster.join();
    EXPECT_TRUE(second_posted.load());
    d.flush();
}

}  // namespace
