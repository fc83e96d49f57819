// The host group: CPU backends of one process exchanging partial sums through
// shared memory (see make_host_group in backend.h).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace tern::backend {

class HostGroup final : public CommGroup {
public:
    explicit HostGroup(int n_ranks);

    int size() const override { return n_ranks_; }
    std::string kind() const override { return "host"; }
    void abandon(int rank) override;
    void begin_pass() override;

    // Leaves in data[0..n) the sum over ranks of every rank's data, added in
    // rank order. Blocks until every rank has called it; an error if the
    // group was abandoned or the ranks' sizes differ.
    Status all_reduce_sum(int rank, float* data, size_t n);

private:
    bool arrive_and_wait();  // false once the pass is abandoned

    const int n_ranks_;
    std::mutex mu_;
    std::condition_variable cv_;
    int arrived_ = 0;
    uint64_t generation_ = 0;
    bool abandoned_ = false;
    struct Partial {
        const float* data = nullptr;
        size_t n = 0;
        std::vector<float> sum;  // the rank's own result, written back after every rank has read
    };
    std::vector<Partial> partials_;  // one per rank, written only by its rank
};

}  // namespace tern::backend
