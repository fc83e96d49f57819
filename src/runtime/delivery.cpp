#include "runtime/delivery.h"

namespace tern::runtime {

Delivery::Delivery() : thread_([this] { loop(); }) {}

Delivery::~Delivery() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
}

void Delivery::post(std::vector<std::function<void()>>& jobs) {
    if (jobs.empty()) return;
    {
        std::unique_lock<std::mutex> lock(mu_);
        idle_.wait(lock, [this] { return done_ == posted_; });
        posted_ += jobs.size();
        queued_.swap(jobs);
    }
    jobs.clear();
    wake_.notify_one();
}

void Delivery::flush() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = posted_;
    idle_.wait(lock, [&] { return done_ >= target; });
}

void Delivery::loop() {
    std::vector<std::function<void()>> running;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        wake_.wait(lock, [this] { return stopping_ || !queued_.empty(); });
        if (queued_.empty()) return;  // stopping, and nothing left
        running.swap(queued_);
        lock.unlock();
        for (auto& job : running) job();
        const size_t n = running.size();
        running.clear();
        lock.lock();
        done_ += n;
        idle_.notify_all();
    }
}

}  // namespace tern::runtime
