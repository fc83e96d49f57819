// Which launch features the current device runs, and its SM count (launch.cuh).
#include <cstdlib>
#include <cstring>

#include "backend/cuda/launch.cuh"

namespace tern::cuda {
namespace {

// Compiled like every kernel of the library, so its code version is theirs.
__global__ void probe_kernel() {}

}  // namespace

bool ask_once_per_device(PerDeviceAnswers& answers, bool (*probe)(int device)) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    const bool slot = dev >= 0 && dev < PerDeviceAnswers::kDevices;
    if (slot)
        if (const int k = answers.known[dev].load(std::memory_order_relaxed); k != 0) return k == 1;
    const bool yes = probe(dev);
    if (slot) answers.known[dev].store(yes ? 1 : 2, std::memory_order_relaxed);
    return yes;
}

bool sm90_code_runs_here() {
    static PerDeviceAnswers answers;
    // ptxVersion is the virtual architecture the code was compiled for (what
    // __CUDA_ARCH__ said); binaryVersion the machine code the device runs.
    return ask_once_per_device(answers, [](int) {
        cudaFuncAttributes fa{};
        return cudaFuncGetAttributes(&fa, probe_kernel) == cudaSuccess && fa.ptxVersion >= 90 &&
               fa.binaryVersion >= 90;
    });
}

int current_sm_count() {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
    return sms;
}

bool switched_off(const char* name) {
    const char* v = std::getenv(name);
    return v && std::strcmp(v, "0") == 0;
}

bool switched_on(const char* name) {
    const char* v = std::getenv(name);
    return v && std::strcmp(v, "1") == 0;
}

bool pdl_enabled() {
    static const bool allowed = !switched_off("TERN_CUDA_PDL");
    return allowed && sm90_code_runs_here();
}

bool early_reads_on() {
    static const bool on = !switched_off("TERN_CUDA_EARLY_READS");
    return on;
}

}  // namespace tern::cuda
