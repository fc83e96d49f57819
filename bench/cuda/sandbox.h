// Shared pieces of the kernel sandbox (bench/cuda): checked CUDA calls, device
// buffers, the launch timer, the measured floors and small command-line
// helpers. Every sandbox program validates a production launcher against its
// CPU twin first and then times it with this header's time_launches(), so the
// numbers of all programs are taken the same way.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// Exits naming the failing call and the error: a sandbox run is short and
// supervised, so the first failure ends it.
#define SB_CHECK(expr)                                                                                       \
    do {                                                                                                     \
        const cudaError_t sb_status_ = (expr);                                                               \
        if (sb_status_ != cudaSuccess) {                                                                     \
            std::fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #expr,                   \
                         cudaGetErrorName(sb_status_), cudaGetErrorString(sb_status_));                      \
            std::exit(2);                                                                                    \
        }                                                                                                    \
    } while (0)

namespace tern::sandbox {

[[noreturn]] inline void fail(const std::string& what) {
    std::fprintf(stderr, "error: %s\n", what.c_str());
    std::exit(2);
}

// ---- device memory ----------------------------------------------------------------

// n elements of T on the device, freed on destruction.
template <class T>
class DevBuf {
public:
    DevBuf() = default;
    explicit DevBuf(size_t n) : n_(n) {
        if (n) SB_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
    }
    explicit DevBuf(const std::vector<T>& host) : DevBuf(host.size()) { upload(host); }
    ~DevBuf() {
        if (p_) cudaFree(p_);
    }
    DevBuf(DevBuf&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
    DevBuf& operator=(DevBuf&& o) noexcept {
        std::swap(p_, o.p_);
        std::swap(n_, o.n_);
        return *this;
    }
    DevBuf(const DevBuf&) = delete;
    DevBuf& operator=(const DevBuf&) = delete;

    T* get() const { return p_; }
    size_t size() const { return n_; }
    size_t bytes() const { return n_ * sizeof(T); }
    void upload(const std::vector<T>& host) {
        if (host.size() > n_) fail("upload larger than its device buffer");
        if (!host.empty()) SB_CHECK(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    // 0xFF bytes: every f32 becomes a NaN, so an element a kernel forgot to
    // write cannot pass a comparison.
    void poison() {
        if (n_) SB_CHECK(cudaMemset(p_, 0xFF, bytes()));
    }

private:
    T* p_ = nullptr;
    size_t n_ = 0;
};

// One element of device memory, read back.
template <class T>
T read_one(const T* dev) {
    T v;
    SB_CHECK(cudaMemcpy(&v, dev, sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// ---- the device -------------------------------------------------------------------

struct DeviceInfo {
    std::string name;
    int sms = 0;
    int64_t l2_bytes = 0;
    int64_t mem_bytes = 0;
};

inline DeviceInfo device_info() {
    int dev = 0, n = 0;
    SB_CHECK(cudaGetDeviceCount(&n));
    if (n < 1) fail("no CUDA device");
    SB_CHECK(cudaGetDevice(&dev));
    cudaDeviceProp p{};
    SB_CHECK(cudaGetDeviceProperties(&p, dev));
    int l2 = 0;
    SB_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    return {p.name, p.multiProcessorCount, l2, int64_t(p.totalGlobalMem)};
}

inline void print_device(const DeviceInfo& d) {
    std::printf("device: %s, %d SMs, L2 %.0f MiB, memory %.1f GiB\n", d.name.c_str(), d.sms,
                double(d.l2_bytes) / (1 << 20), double(d.mem_bytes) / (1 << 30));
}

// How many copies of a `bytes`-sized input to rotate through so that, together,
// they span four times the L2: each launch then finds its input evicted.
inline int rotation_sets(int64_t bytes, int64_t l2_bytes, int at_least = 3, int at_most = 64) {
    const int64_t want = bytes > 0 ? (4 * l2_bytes + bytes - 1) / bytes : at_least;
    return int(std::clamp<int64_t>(want, at_least, at_most));
}

// ---- timing -----------------------------------------------------------------------

namespace detail {
// Holds the stream until the host sets *release (or timeout_ns passes), so the
// timed launches queued behind it run back to back, whatever the host's
// enqueue rate. *timed_out records a release by timeout.
static __global__ void hold_stream(const volatile int* release, int* timed_out, unsigned long long timeout_ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (*release == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > timeout_ns) {
            *timed_out = 1;
            return;
        }
    }
}
}  // namespace detail

struct Timing {
    double median_us = 0.0;
    double min_us = 0.0;
    bool held = true;  // false: the launches were not all queued before the GPU reached them
};

constexpr int kWarmup = 3;
constexpr int kReps = 25;

// Times launch(i) for `reps` values of i: kWarmup launches first, then `reps`
// launches, each between its own pair of events, queued behind hold_stream so
// that no host gap falls inside an interval. launch(i) must pick its buffers
// by i (rotating sets) and enqueue on `stream` only. Median and minimum in us.
template <class Launch>
Timing time_launches(cudaStream_t stream, Launch&& launch, int reps = kReps) {
    for (int i = 0; i < kWarmup; ++i) launch(i);
    SB_CHECK(cudaGetLastError());
    SB_CHECK(cudaStreamSynchronize(stream));

    int* host_flags = nullptr;  // [0]: release, [1]: timed out
    SB_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_flags), 2 * sizeof(int), cudaHostAllocMapped));
    int* dev_flags = nullptr;
    SB_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_flags), host_flags, 0));
    __atomic_store_n(&host_flags[0], 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&host_flags[1], 0, __ATOMIC_SEQ_CST);

    std::vector<cudaEvent_t> ev(size_t(2 * reps));
    for (cudaEvent_t& e : ev) SB_CHECK(cudaEventCreate(&e));
    detail::hold_stream<<<1, 1, 0, stream>>>(dev_flags, dev_flags + 1, 2'000'000'000ull);
    SB_CHECK(cudaGetLastError());
    for (int i = 0; i < reps; ++i) {
        SB_CHECK(cudaEventRecord(ev[size_t(2 * i)], stream));
        launch(kWarmup + i);
        SB_CHECK(cudaEventRecord(ev[size_t(2 * i + 1)], stream));
    }
    SB_CHECK(cudaGetLastError());
    __atomic_store_n(&host_flags[0], 1, __ATOMIC_SEQ_CST);
    SB_CHECK(cudaStreamSynchronize(stream));

    std::vector<double> us(static_cast<size_t>(reps));
    for (int i = 0; i < reps; ++i) {
        float ms = 0.0f;
        SB_CHECK(cudaEventElapsedTime(&ms, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]));
        us[size_t(i)] = 1000.0 * double(ms);
    }
    Timing t;
    t.held = __atomic_load_n(&host_flags[1], __ATOMIC_SEQ_CST) == 0;
    for (cudaEvent_t e : ev) SB_CHECK(cudaEventDestroy(e));
    SB_CHECK(cudaFreeHost(host_flags));
    std::sort(us.begin(), us.end());
    t.median_us = reps % 2 ? us[size_t(reps / 2)] : 0.5 * (us[size_t(reps / 2 - 1)] + us[size_t(reps / 2)]);
    t.min_us = us[0];
    return t;
}

// ---- the measured floors (written by bench/cuda/floors) ------------------------------

struct Floors {
    double copy_GBps = 0.0;  // device-to-device copy, bytes read + written per second
    double int8_TOPS = 0.0;  // cuBLAS int8 GEMM 8192^3
    double bf16_TFLOPS = 0.0;
};

// Reads "floor.NAME=VALUE" lines; an empty path or a missing file gives zeros
// (the percentages are then not printed).
inline Floors read_floors(const std::string& path) {
    Floors f;
    if (path.empty()) return f;
    std::ifstream in(path);
    if (!in) {
        std::fprintf(stderr, "warning: cannot read floors from %s; no %% of floor printed\n", path.c_str());
        return f;
    }
    std::string line;
    while (std::getline(in, line)) {
        const size_t eq = line.find('=');
        if (eq == std::string::npos) continue;
        const std::string key = line.substr(0, eq);
        const double v = std::atof(line.c_str() + eq + 1);
        if (key == "floor.copy_GBps") f.copy_GBps = v;
        if (key == "floor.int8_TOPS") f.int8_TOPS = v;
        if (key == "floor.bf16_TFLOPS") f.bf16_TFLOPS = v;
    }
    return f;
}

// "87.3" for value / floor as a percentage, "-" when the floor is unknown.
inline std::string percent(double value, double floor) {
    if (!(floor > 0.0)) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", 100.0 * value / floor);
    return buf;
}

// ---- host helpers -------------------------------------------------------------------

// fn(i) for i in [0, n), spread over every core (CPU references, input data).
template <class Fn>
void parallel_for(int64_t n, const Fn& fn) {
    const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
    std::atomic<int64_t> next{0};
    std::vector<std::thread> pool;
    for (int64_t w = 0; w < workers; ++w)
        pool.emplace_back([&] {
            for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
        });
    for (std::thread& t : pool) t.join();
}

// "a,b,c" -> {"a", "b", "c"} (empty items dropped).
inline std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= s.size()) {
        const size_t end = std::min(s.find(',', start), s.size());
        if (end > start) out.push_back(s.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

inline std::vector<int64_t> parse_counts(const std::string& s, const char* option) {
    std::vector<int64_t> out;
    for (const std::string& item : split_list(s)) {
        char* end = nullptr;
        const long long v = std::strtoll(item.c_str(), &end, 10);
        if (end == item.c_str() || *end != '\0' || v < 1) fail(std::string(option) + ": not a positive count: " + item);
        out.push_back(v);
    }
    if (out.empty()) fail(std::string(option) + ": empty list");
    return out;
}

// One positive count (an option that takes a single value).
inline int64_t parse_count(const std::string& s, const char* option) {
    const std::vector<int64_t> v = parse_counts(s, option);
    if (v.size() != 1) fail(std::string(option) + ": one count expected, got " + s);
    return v.front();
}

// The value after option argv[i] (advancing i), or a clear exit.
inline std::string option_value(int argc, char** argv, int& i) {
    if (i + 1 >= argc) fail(std::string(argv[i]) + " needs a value");
    return argv[++i];
}

// SplitMix64, for input data: fast enough to fill gigabytes, and one sequence
// per (seed, stream) pair, so threads need not share a generator.
struct SplitMix {
    uint64_t s;
    SplitMix(uint64_t seed, uint64_t stream) : s(seed * 0x9E3779B97F4A7C15ull ^ (stream + 0x632BE59BD9B4E019ull)) {}
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    double uniform() { return double(next() >> 11) * 0x1.0p-53; }  // [0, 1)
    // A standard normal (Box-Muller; 1 - u keeps the log's argument above 0).
    float normal() {
        const double u = 1.0 - uniform(), v = uniform();
        return float(std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v));
    }
};

}  // namespace tern::sandbox
