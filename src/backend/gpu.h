// What GPUs this build of tern can see. Built without CUDA, the list is empty
// and built_with_cuda() says so; a CUDA build reports the runtime's view,
// or an error naming the failing call (no driver, no device, ...).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "base/result.h"

namespace tern::backend {

struct GpuInfo {
    int index = 0;
    std::string name;
    int cc_major = 0, cc_minor = 0;  // compute capability
    int sm_count = 0;
    size_t total_bytes = 0, free_bytes = 0;
    size_t l2_bytes = 0;
    size_t smem_per_block_optin = 0;  // opt-in shared memory per block
};

bool built_with_cuda();
// Compute capabilities compiled in, e.g. "90"; empty without CUDA.
std::string cuda_architectures();
Result<std::vector<GpuInfo>> list_gpus();

// The device-to-device copy rate of GPU `index` in GB/s, bytes read plus
// bytes written: the best of a few copies of 512 MiB between two buffers of
// its own (the floor a decode step's weight reads are measured against). An
// error names the failing call (no such GPU, not enough free memory).
Result<double> measure_gpu_copy_gbps(int index);

}  // namespace tern::backend
