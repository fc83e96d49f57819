// GPU discovery through the CUDA runtime: names, compute capability and
// memory of each visible device, for `tern --version` and load-time checks.
#include <cuda_runtime.h>

#include <string>

#include "backend/gpu.h"

namespace tern::backend {
namespace {

Error cuda_error(const char* what, cudaError_t e) {
    return Error{std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"};
}

}  // namespace

bool built_with_cuda() { return true; }

std::string cuda_architectures() { return TERN_CUDA_ARCHS; }

Result<std::vector<GpuInfo>> list_gpus() {
    int n = 0;
    if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
        if (e == cudaErrorNoDevice) return std::vector<GpuInfo>{};
        return cuda_error("cudaGetDeviceCount", e);
    }
    std::vector<GpuInfo> gpus;
    for (int i = 0; i < n; ++i) {
        cudaDeviceProp p{};
        if (cudaError_t e = cudaGetDeviceProperties(&p, i); e != cudaSuccess)
            return cuda_error("cudaGetDeviceProperties", e);
        GpuInfo g;
        g.index = i;
        g.name = p.name;
        g.cc_major = p.major;
        g.cc_minor = p.minor;
        g.sm_count = p.multiProcessorCount;
        g.total_bytes = p.totalGlobalMem;
        g.l2_bytes = size_t(p.l2CacheSize);
        g.smem_per_block_optin = p.sharedMemPerBlockOptin;
        if (cudaSetDevice(i) == cudaSuccess) {
            size_t free_b = 0, total_b = 0;
            if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) g.free_bytes = free_b;
        }
        gpus.push_back(std::move(g));
    }
    return gpus;
}

}  // namespace tern::backend
