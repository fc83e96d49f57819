// GPU discovery for builds without the CUDA backend: there are none to find.
#include "backend/backend.h"
#include "backend/gpu.h"

namespace tern::backend {

bool built_with_cuda() { return false; }
std::string cuda_architectures() { return {}; }
Result<std::vector<GpuInfo>> list_gpus() { return std::vector<GpuInfo>{}; }
Result<double> measure_gpu_copy_gbps(int) { return Error{"this build of tern has no CUDA backend"}; }

Result<std::unique_ptr<Backend>> make_cuda_backend(int, std::shared_ptr<CommGroup>, int) {
    return Error{"this build of tern has no CUDA backend (configure with -DTERN_CUDA=ON on a machine with the CUDA toolkit)"};
}

Result<std::shared_ptr<CommGroup>> make_nccl_group(const std::vector<int>&) {
    return Error{"this build of tern has no CUDA backend, so no tensor parallelism over GPUs (configure with "
                 "-DTERN_CUDA=ON; --backend cpu --tp N runs the ranks on the CPU)"};
}

}  // namespace tern::backend
