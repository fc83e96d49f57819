// The host group's all-reduce: a two-phase rendezvous (see host_group.h).
#include "backend/host_group.h"

#include <algorithm>

namespace tern::backend {

HostGroup::HostGroup(int n_ranks) : n_ranks_(n_ranks), partials_(size_t(n_ranks)) {}

std::shared_ptr<CommGroup> make_host_group(int n_ranks) {
    return std::make_shared<HostGroup>(n_ranks < 1 ? 1 : n_ranks);
}

bool HostGroup::arrive_and_wait() {
    std::unique_lock<std::mutex> lk(mu_);
    if (abandoned_) return false;
    const uint64_t gen = generation_;
    if (++arrived_ == n_ranks_) {
        arrived_ = 0;
        ++generation_;
        cv_.notify_all();
        return true;
    }
    cv_.wait(lk, [&] { return generation_ != gen || abandoned_; });
    return generation_ != gen;
}

void HostGroup::abandon(int) {
    std::lock_guard<std::mutex> lk(mu_);
    abandoned_ = true;
    cv_.notify_all();
}

void HostGroup::begin_pass() {
    std::lock_guard<std::mutex> lk(mu_);
    arrived_ = 0;
    abandoned_ = false;
}

// Deposit, wait for all, sum in rank order into the rank's own buffer, wait
// until every rank has read every partial (so none is overwritten early),
// write back.
Status HostGroup::all_reduce_sum(int rank, float* data, size_t n) {
    if (rank < 0 || rank >= n_ranks_) return Error{"host group: rank " + std::to_string(rank) + " is not in the group"};
    Partial& mine = partials_[size_t(rank)];
    mine.data = data;
    mine.n = n;
    const Error stopped{"tensor parallel rank " + std::to_string(rank) + ": stopped because another rank failed"};
    if (!arrive_and_wait()) return stopped;
    for (const Partial& p : partials_)
        if (p.n != n) {
            abandon(rank);
            return Error{"tensor parallel: ranks reduced tensors of different sizes"};
        }
    mine.sum.assign(partials_[0].data, partials_[0].data + n);
    for (size_t r = 1; r < partials_.size(); ++r)
        for (size_t i = 0; i < n; ++i) mine.sum[i] += partials_[r].data[i];
    if (!arrive_and_wait()) return stopped;
    std::copy(mine.sum.begin(), mine.sum.end(), data);
    return {};
}

}  // namespace tern::backend
