// `tern --version`: the version, how this binary was built, and the GPUs it sees.
#include <string>

#include "backend/gpu.h"
#include "tools/commands.h"

namespace tern::tools {

std::string version_text() {
    std::string s = "tern " TERN_VERSION "\nbuild: " __VERSION__;
#ifdef NDEBUG
    s += ", optimized";
#else
    s += ", debug";
#endif
    if (backend::built_with_cuda()) {
        s += ", CUDA (sm_" + backend::cuda_architectures() + ")";
        auto gpus = backend::list_gpus();
        if (!gpus.ok()) {
            s += "\ngpus: none usable (" + gpus.error().message + ")";
        } else if (gpus->empty()) {
            s += "\ngpus: none found";
        } else {
            for (const backend::GpuInfo& g : *gpus) {
                s += "\ngpu " + std::to_string(g.index) + ": " + g.name + ", compute " +
                     std::to_string(g.cc_major) + "." + std::to_string(g.cc_minor) + ", " +
                     std::to_string(g.sm_count) + " SMs, " +
                     std::to_string(g.total_bytes >> 20) + " MiB";
            }
        }
    } else {
        s += ", CPU only (built without CUDA)";
    }
    return s;
}

}  // namespace tern::tools
