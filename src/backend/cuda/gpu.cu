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

Result<double> measure_gpu_copy_gbps(int index) {
    constexpr size_t kBytes = size_t(512) << 20;
    if (cudaError_t e = cudaSetDevice(index); e != cudaSuccess) return cuda_error("cudaSetDevice", e);
    void *src = nullptr, *dst = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    auto release = [&] {
        if (start) cudaEventDestroy(start);
        if (stop) cudaEventDestroy(stop);
        if (stream) cudaStreamDestroy(stream);
        if (src) cudaFree(src);
        if (dst) cudaFree(dst);
        cudaGetLastError();  // a failed allocation is not sticky; leave no error behind
    };
    cudaError_t e = cudaMalloc(&src, kBytes);
    if (e == cudaSuccess) e = cudaMalloc(&dst, kBytes);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaEventCreate(&start);
    if (e == cudaSuccess) e = cudaEventCreate(&stop);
    if (e == cudaSuccess) e = cudaMemsetAsync(src, 1, kBytes, stream);
    float best_ms = 0;
    for (int rep = 0; rep < 5 && e == cudaSuccess; ++rep) {
        e = cudaEventRecord(start, stream);
        if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice, stream);
        if (e == cudaSuccess) e = cudaEventRecord(stop, stream);
        if (e == cudaSuccess) e = cudaEventSynchronize(stop);
        float ms = 0;
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, start, stop);
        if (e == cudaSuccess && ms > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;
    }
    release();
    if (e != cudaSuccess) return cuda_error("measuring the copy rate", e);
    if (best_ms <= 0) return Error{"measuring the copy rate: no time elapsed"};
    return 2.0 * double(kBytes) / (double(best_ms) / 1e3) / 1e9;
}

}  // namespace tern::backend
