// The NCCL group: one communicator per GPU, all in this process (see
// make_nccl_group in backend.h). NCCL is opened with dlopen when a group is
// made: a single-GPU tern neither links nor needs its 200 MB library.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace tern::backend {

class NcclGroup final : public CommGroup {
public:
    static Result<std::shared_ptr<CommGroup>> create(const std::vector<int>& devices);
    ~NcclGroup() override;

    int size() const override { return int(devices_.size()); }
    std::string kind() const override { return "nccl"; }
    int device_of(int rank) const { return devices_[size_t(rank)]; }

    // Enqueues on `stream` an in-place sum of data[0..n) over the ranks; the
    // ranks' calls pair up in issue order. Graph capture records it.
    Status all_reduce_sum(int rank, float* data, size_t n, cudaStream_t stream);

private:
    NcclGroup() = default;
    std::vector<int> devices_;
    std::vector<void*> comms_;  // ncclComm_t, opaque outside nccl_group.cpp
};

}  // namespace tern::backend
