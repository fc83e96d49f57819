// The all-reduce a tensor-parallel step issues after each row-parallel matmul
// (backend/cuda/nccl_group), over the GPUs of this machine: one thread per
// GPU, as tern runs its ranks. For each size (tokens x n_embd floats) it first
// checks the sum, then times the calls two ways:
//   stream: back-to-back calls on each rank's stream (prefill issues them so);
//   graph:  the same calls captured in one CUDA graph and replayed (decode
//           steps replay their graph, all-reduces included).
// Reported per call: time on rank 0 and the bus bandwidth NCCL's own tests
// quote, 2 (n - 1) / n * bytes / time.
//   allreduce [--ranks N] [--embd 4096] [--tokens 1,8,512,2048] [--calls 64]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/nccl_group.h"
#include "sandbox.h"

namespace tern::sandbox {
namespace {

struct Args {
    int ranks = 0;  // 0: every visible GPU
    int embd = 4096;
    std::vector<int64_t> tokens = {1, 8, 512, 2048};
    int calls = 64;  // one decode step of a 32-layer model issues 64
};

Args parse(int argc, char** argv) {
    Args a;
    for (int i = 1; i < argc; ++i) {
        const std::string k = argv[i];
        if (k == "--ranks") a.ranks = int(parse_count(option_value(argc, argv, i), "--ranks"));
        else if (k == "--embd") a.embd = int(parse_count(option_value(argc, argv, i), "--embd"));
        else if (k == "--tokens") a.tokens = parse_counts(option_value(argc, argv, i), "--tokens");
        else if (k == "--calls") a.calls = int(parse_count(option_value(argc, argv, i), "--calls"));
        else fail("unknown argument " + k);
    }
    return a;
}

// Runs f(rank) on one thread per rank and waits for all.
template <class F>
void on_every_rank(int n, F f) {
    std::vector<std::thread> t;
    for (int r = 0; r < n; ++r) t.emplace_back([&, r] { f(r); });
    for (auto& th : t) th.join();
}

void check(const Status& s, const char* what) {
    if (!s.ok()) fail(std::string(what) + ": " + s.message());
}

}  // namespace
}  // namespace tern::sandbox

int main(int argc, char** argv) {
    using namespace tern;
    using namespace tern::sandbox;
    const Args a = parse(argc, argv);
    int visible = 0;
    SB_CHECK(cudaGetDeviceCount(&visible));
    const int n = a.ranks > 0 ? a.ranks : visible;
    if (n > visible) fail(std::to_string(n) + " ranks asked, " + std::to_string(visible) + " GPUs visible");
    std::vector<int> devices;
    for (int r = 0; r < n; ++r) devices.push_back(r);
    auto made = backend::make_nccl_group(devices);
    if (!made.ok()) fail(made.error().message);
    auto* group = static_cast<backend::NcclGroup*>(made->get());
    std::printf("all-reduce over %d GPU(s), %d calls per timing, n_embd %d\n", n, a.calls, a.embd);
    std::printf("| %7s | %10s | %14s | %12s | %14s | %12s |\n", "tokens", "bytes", "stream us/call", "stream GB/s",
                "graph us/call", "graph GB/s");
    std::printf("|--------:|-----------:|---------------:|-------------:|---------------:|-------------:|\n");

    for (const int64_t tokens : a.tokens) {
        const size_t count = size_t(tokens) * size_t(a.embd);
        float stream_us = 0, graph_us = 0;
        bool right = true;
        on_every_rank(n, [&](int r) {
            SB_CHECK(cudaSetDevice(r));
            cudaStream_t s;
            SB_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            std::vector<float> host(count, float(r + 1));
            DevBuf<float> buf(host);
            // Check: every rank ends with 1 + 2 + ... + n in every element.
            check(group->all_reduce_sum(r, buf.get(), count, s), "all-reduce");
            SB_CHECK(cudaStreamSynchronize(s));
            std::vector<float> got(count);
            SB_CHECK(cudaMemcpy(got.data(), buf.get(), count * sizeof(float), cudaMemcpyDeviceToHost));
            const float want = float(n * (n + 1) / 2);
            for (float v : got)
                if (v != want) right = false;

            cudaEvent_t e0, e1;
            SB_CHECK(cudaEventCreate(&e0));
            SB_CHECK(cudaEventCreate(&e1));
            for (int i = 0; i < 5; ++i) check(group->all_reduce_sum(r, buf.get(), count, s), "all-reduce");
            SB_CHECK(cudaEventRecord(e0, s));
            for (int i = 0; i < a.calls; ++i) check(group->all_reduce_sum(r, buf.get(), count, s), "all-reduce");
            SB_CHECK(cudaEventRecord(e1, s));
            SB_CHECK(cudaEventSynchronize(e1));
            float ms = 0;
            SB_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            if (r == 0) stream_us = ms * 1000.0f / float(a.calls);

            cudaGraph_t graph;
            cudaGraphExec_t exec;
            SB_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < a.calls; ++i) check(group->all_reduce_sum(r, buf.get(), count, s), "all-reduce");
            SB_CHECK(cudaStreamEndCapture(s, &graph));
            SB_CHECK(cudaGraphInstantiate(&exec, graph, 0));
            for (int i = 0; i < 3; ++i) SB_CHECK(cudaGraphLaunch(exec, s));
            SB_CHECK(cudaEventRecord(e0, s));
            const int replays = 10;
            for (int i = 0; i < replays; ++i) SB_CHECK(cudaGraphLaunch(exec, s));
            SB_CHECK(cudaEventRecord(e1, s));
            SB_CHECK(cudaEventSynchronize(e1));
            SB_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            if (r == 0) graph_us = ms * 1000.0f / float(a.calls * replays);
            SB_CHECK(cudaGraphExecDestroy(exec));
            SB_CHECK(cudaGraphDestroy(graph));
            SB_CHECK(cudaEventDestroy(e0));
            SB_CHECK(cudaEventDestroy(e1));
            SB_CHECK(cudaStreamDestroy(s));
        });
        if (!right) fail("all-reduce of " + std::to_string(count) + " floats gave a wrong sum");
        const double bytes = double(count) * sizeof(float);
        const double bus = n > 1 ? 2.0 * (n - 1) / n * bytes : bytes;
        std::printf("| %7lld | %10.0f | %14.1f | %12.1f | %14.1f | %12.1f |\n", (long long)tokens, bytes, stream_us,
                    bus / (stream_us * 1e3), graph_us, bus / (graph_us * 1e3));
    }
    return 0;
}
