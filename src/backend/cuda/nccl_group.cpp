// NCCL through dlopen: the few entry points tern calls, resolved once from
// libnccl.so.2 (or TERN_NCCL_LIBRARY). nccl.h supplies the types when the
// build found it; a build without it reports so when a group is asked for.
#include "backend/cuda/nccl_group.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <type_traits>

#if TERN_HAVE_NCCL_H
#include <nccl.h>
#endif

namespace tern::backend {

#if TERN_HAVE_NCCL_H
namespace {

struct NcclApi {
    ncclResult_t (*get_version)(int*) = nullptr;
    ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
    ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
    ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t) = nullptr;
    const char* (*error_string)(ncclResult_t) = nullptr;
    std::string load_error;  // empty once loaded
    int version = 0;
};

// Loaded once per process and never closed: NCCL keeps threads of its own.
const NcclApi& nccl() {
    static NcclApi api;
    static std::once_flag once;
    std::call_once(once, [] {
        const char* named = std::getenv("TERN_NCCL_LIBRARY");
        const std::string file = named && *named ? named : "libnccl.so.2";
        void* lib = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char* why = dlerror();
            api.load_error = "cannot load NCCL (" + file + "): " + (why ? why : "unknown error") +
                             ". Tensor parallelism needs NCCL 2.x: install it (for example `pip install "
                             "nvidia-nccl-cu13`) and put its lib folder on LD_LIBRARY_PATH, or set "
                             "TERN_NCCL_LIBRARY to the library file";
            return;
        }
        auto sym = [&](const char* name, auto& fn) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
            if (!fn && api.load_error.empty()) api.load_error = file + " has no symbol " + name;
        };
        sym("ncclGetVersion", api.get_version);
        sym("ncclCommInitAll", api.comm_init_all);
        sym("ncclCommDestroy", api.comm_destroy);
        sym("ncclAllReduce", api.all_reduce);
        sym("ncclGetErrorString", api.error_string);
        if (api.load_error.empty() && api.get_version(&api.version) != ncclSuccess)
            api.load_error = file + ": ncclGetVersion failed";
    });
    return api;
}

std::string nccl_failure(const char* what, ncclResult_t r) {
    return std::string("nccl: ") + what + ": " + nccl().error_string(r);
}

}  // namespace

Result<std::shared_ptr<CommGroup>> NcclGroup::create(const std::vector<int>& devices) {
    if (devices.empty()) return Error{"nccl: a group needs at least one GPU"};
    const NcclApi& api = nccl();
    if (!api.load_error.empty()) return Error{api.load_error};
    int n_visible = 0;
    if (cudaError_t e = cudaGetDeviceCount(&n_visible); e != cudaSuccess)
        return Error{std::string("nccl: no usable GPU: ") + cudaGetErrorString(e)};
    for (size_t i = 0; i < devices.size(); ++i) {
        if (devices[i] < 0 || devices[i] >= n_visible)
            return Error{"tensor parallelism over " + std::to_string(devices.size()) + " GPUs needs GPU " +
                         std::to_string(devices[i]) + ", but " + std::to_string(n_visible) + " are visible"};
        for (size_t j = 0; j < i; ++j)
            if (devices[j] == devices[i])
                return Error{"nccl: GPU " + std::to_string(devices[i]) + " appears twice in the group"};
    }
    // NVLink multicast (NVLS) stays off unless the user says otherwise: on a
    // shared host a fault there can take every GPU out of service, and the
    // all-reduces tern issues are small enough not to need it.
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
    std::vector<ncclComm_t> comms(devices.size(), nullptr);
    if (ncclResult_t r = api.comm_init_all(comms.data(), int(devices.size()), devices.data()); r != ncclSuccess)
        return Error{nccl_failure("creating the communicators", r)};
    std::shared_ptr<NcclGroup> g(new NcclGroup());
    g->devices_ = devices;
    for (ncclComm_t c : comms) g->comms_.push_back(c);
    return std::shared_ptr<CommGroup>(std::move(g));
}

NcclGroup::~NcclGroup() {
    for (void* c : comms_)
        if (c) nccl().comm_destroy(static_cast<ncclComm_t>(c));
}

Status NcclGroup::all_reduce_sum(int rank, float* data, size_t n, cudaStream_t stream) {
    if (rank < 0 || rank >= size()) return Error{"nccl: rank " + std::to_string(rank) + " is not in the group"};
    const ncclResult_t r = nccl().all_reduce(data, data, n, ncclFloat32, ncclSum,
                                             static_cast<ncclComm_t>(comms_[size_t(rank)]), stream);
    if (r != ncclSuccess) return Error{nccl_failure("all-reduce", r)};
    return {};
}

#else  // built without nccl.h

Result<std::shared_ptr<CommGroup>> NcclGroup::create(const std::vector<int>&) {
    return Error{"this build of tern has no NCCL support (nccl.h was not found when it was configured; set "
                 "NCCL_INCLUDE_DIR and rebuild)"};
}
NcclGroup::~NcclGroup() = default;
Status NcclGroup::all_reduce_sum(int, float*, size_t, cudaStream_t) {
    return Error{"this build of tern has no NCCL support"};
}

#endif

Result<std::shared_ptr<CommGroup>> make_nccl_group(const std::vector<int>& devices) {
    return NcclGroup::create(devices);
}

}  // namespace tern::backend
