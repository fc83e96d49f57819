// The requests' callbacks, run on a thread of their own in the order they
// were handed over. The scheduler hands over a step's callbacks at once and
// goes on to the next step, so the text of step N (the server builds and
// queues an event per piece) goes out while step N+1's forward pass runs
// instead of before it starts. One hand-over at a time: post() waits for the
// one before to have run, so a slow consumer holds the scheduler back by a
// step at most (its text is never far behind, a client gone is noticed a
// step later) rather than letting work pile up.
//
// A callback must not wait for the scheduler to stop (shutdown() waits for
// the callbacks).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tern::runtime {

class Delivery {
public:
    Delivery();
    ~Delivery();  // runs what was handed over, then stops
    Delivery(const Delivery&) = delete;
    Delivery& operator=(const Delivery&) = delete;

    // Waits until the jobs handed over before have run, then queues these;
    // takes them (jobs is left empty). Nothing to hand over: returns at once.
    void post(std::vector<std::function<void()>>& jobs);
    // Returns when every job posted before the call has run.
    void flush();

private:
    void loop();

    std::mutex mu_;
    std::condition_variable wake_, idle_;
    std::vector<std::function<void()>> queued_;
    uint64_t posted_ = 0, done_ = 0;  // jobs handed over and run, ever
    bool stopping_ = false;
    std::thread thread_;
};

}  // namespace tern::runtime
