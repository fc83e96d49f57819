// The requests' callbacks, run on a thread of their own in the order they
// were handed over. The scheduler hands over a step's callbacks at once and
// goes on to the next step, so the text of step N (the server builds and
// queues an event per piece) goes out while step N+1's forward pass runs
// instead of before it starts.
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

    // Queues the jobs behind every earlier one; takes them (jobs is left empty).
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
