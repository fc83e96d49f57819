// GPU discovery for builds without the CUDA backend: there are none to find.
#include "backend/gpu.h"

namespace tern::backend {

bool built_with_cuda() { return false; }
std::string cuda_architectures() { return {}; }
Result<std::vector<GpuInfo>> list_gpus() { return std::vector<GpuInfo>{}; }

}  // namespace tern::backend
