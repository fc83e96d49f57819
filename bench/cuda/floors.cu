// floors: the ceilings the other sandbox programs are measured against, taken
// on this GPU rather than read from a data sheet.
//   copy  cudaMemcpyAsync of 2 GiB device to device: bytes read + written / time
//         (what a kernel that streams its weights once can hope for);
//   int8  cuBLAS GEMM 8192^3, int8 inputs, int32 accumulate and output, in the
//         TN form cuBLAS's int8 kernels take: 2*M*N*K / time (mmq's roof);
//   bf16  the same GEMM in bf16 with f32 accumulate, for reference.
// Each result is checked on sampled elements against a CPU computation, then
// timed as the median of 20 launches over three rotating buffer sets. Prints
// a table and "floor.NAME=VALUE" lines; writes the lines to argv[1] as well
// when given (bench/cuda/matmul and attention read them with --floors).
#include <cublas_v2.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "sandbox.h"

using namespace tern::sandbox;

#define SB_CUBLAS(expr)                                                                                     \
    do {                                                                                                    \
        const cublasStatus_t sb_blas_ = (expr);                                                             \
        if (sb_blas_ != CUBLAS_STATUS_SUCCESS) {                                                            \
            std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,                      \
                         cublasGetStatusName(sb_blas_));                                                    \
            std::exit(2);                                                                                   \
        }                                                                                                   \
    } while (0)

namespace {

constexpr int kSets = 3;
constexpr int kFloorReps = 20;
constexpr int kDim = 8192;  // M = N = K

// ---- copy ---------------------------------------------------------------------------

double measure_copy(cudaStream_t stream, double& ms_out) {
    const size_t bytes = size_t(2) << 30;
    // Two buffers: src and dst swap roles each launch (copy i reads buffer i%2),
    // so both directions move 2 GiB, far beyond the L2.
    DevBuf<uint8_t> a(bytes), b(bytes);
    SB_CHECK(cudaMemset(a.get(), 0x5A, bytes));
    SB_CHECK(cudaMemset(b.get(), 0x00, bytes));
    SB_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream));
    SB_CHECK(cudaStreamSynchronize(stream));
    for (size_t at : {size_t(0), bytes / 3, bytes - 1})
        if (read_one(b.get() + at) != 0x5A) fail("device copy: byte " + std::to_string(at) + " was not copied");

    const Timing t = time_launches(
        stream,
        [&](int i) {
            uint8_t* src = i % 2 ? b.get() : a.get();
            uint8_t* dst = i % 2 ? a.get() : b.get();
            SB_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
        },
        kFloorReps);
    if (!t.held) std::fprintf(stderr, "warning: copy launches were not all queued in time\n");
    ms_out = t.median_us / 1000.0;
    return 2.0 * double(bytes) / (t.median_us * 1e-6) / 1e9;
}

// ---- GEMMs ----------------------------------------------------------------------------

// A is stored K x M column-major (lda = K) and used transposed, B is K x N
// column-major (ldb = K): C[i + j*M] = sum_k A[k + i*K] * B[k + j*K]. Every
// value is an int8 in [-127, 127]; the bf16 run uses the same values / 128,
// which bf16 holds exactly.
struct Operands {
    std::vector<int8_t> a, b;
};

Operands make_operands() {
    const size_t n = size_t(kDim) * kDim;
    Operands o{std::vector<int8_t>(n), std::vector<int8_t>(n)};
    parallel_for(kDim, [&](int64_t col) {
        SplitMix g(7, uint64_t(col));
        for (int k = 0; k < kDim; ++k) {
            o.a[size_t(col) * kDim + size_t(k)] = int8_t(int(g.next() % 255) - 127);
            o.b[size_t(col) * kDim + size_t(k)] = int8_t(int(g.next() % 255) - 127);
        }
    });
    return o;
}

int64_t exact_dot(const Operands& o, int i, int j, int64_t* abs_sum) {
    int64_t s = 0, as = 0;
    for (int k = 0; k < kDim; ++k) {
        const int64_t p = int64_t(o.a[size_t(i) * kDim + size_t(k)]) * o.b[size_t(j) * kDim + size_t(k)];
        s += p;
        as += p < 0 ? -p : p;
    }
    if (abs_sum) *abs_sum = as;
    return s;
}

uint16_t bf16_of(int8_t v) {
    const float f = float(v) / 128.0f;  // exact in bf16: at most 7 significant bits
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    return uint16_t(bits >> 16);
}

// Sampled (i, j) pairs checked after the validation launch.
constexpr int kSamples = 16;
std::pair<int, int> sample(int s) {
    SplitMix g(11, uint64_t(s));
    return {int(g.next() % kDim), int(g.next() % kDim)};
}

double measure_int8(cublasHandle_t h, cudaStream_t stream, const Operands& o, double& ms_out) {
    const size_t n = size_t(kDim) * kDim;
    std::vector<DevBuf<int8_t>> a, b;
    std::vector<DevBuf<int32_t>> c;
    for (int s = 0; s < kSets; ++s) {
        a.emplace_back(o.a);
        b.emplace_back(o.b);
        c.emplace_back(n);
    }
    const int32_t alpha = 1, beta = 0;
    auto gemm = [&](int i) {
        const int s = i % kSets;
        SB_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, kDim, kDim, kDim, &alpha, a[size_t(s)].get(), CUDA_R_8I,
                               kDim, b[size_t(s)].get(), CUDA_R_8I, kDim, &beta, c[size_t(s)].get(), CUDA_R_32I, kDim,
                               CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
    };
    c[0].poison();
    gemm(0);
    SB_CHECK(cudaStreamSynchronize(stream));
    for (int s = 0; s < kSamples; ++s) {
        const auto [i, j] = sample(s);
        const int64_t want = exact_dot(o, i, j, nullptr);
        const int32_t got = read_one(c[0].get() + size_t(i) + size_t(j) * kDim);
        if (int64_t(got) != want)
            fail("int8 GEMM: C[" + std::to_string(i) + "," + std::to_string(j) + "] = " + std::to_string(got) +
                 ", exact " + std::to_string(want));
    }
    const Timing t = time_launches(stream, gemm, kFloorReps);
    if (!t.held) std::fprintf(stderr, "warning: int8 GEMM launches were not all queued in time\n");
    ms_out = t.median_us / 1000.0;
    return 2.0 * double(kDim) * kDim * kDim / (t.median_us * 1e-6) / 1e12;
}

double measure_bf16(cublasHandle_t h, cudaStream_t stream, const Operands& o, double& ms_out) {
    const size_t n = size_t(kDim) * kDim;
    std::vector<uint16_t> ha(n), hb(n);
    parallel_for(kDim, [&](int64_t col) {
        for (size_t k = 0; k < size_t(kDim); ++k) {
            ha[size_t(col) * kDim + k] = bf16_of(o.a[size_t(col) * kDim + k]);
            hb[size_t(col) * kDim + k] = bf16_of(o.b[size_t(col) * kDim + k]);
        }
    });
    std::vector<DevBuf<uint16_t>> a, b;
    std::vector<DevBuf<float>> c;
    for (int s = 0; s < kSets; ++s) {
        a.emplace_back(ha);
        b.emplace_back(hb);
        c.emplace_back(n);
    }
    const float alpha = 1.0f, beta = 0.0f;
    auto gemm = [&](int i) {
        const int s = i % kSets;
        SB_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, kDim, kDim, kDim, &alpha, a[size_t(s)].get(),
                               CUDA_R_16BF, kDim, b[size_t(s)].get(), CUDA_R_16BF, kDim, &beta, c[size_t(s)].get(),
                               CUDA_R_32F, kDim, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    c[0].poison();
    gemm(0);
    SB_CHECK(cudaStreamSynchronize(stream));
    for (int s = 0; s < kSamples; ++s) {
        const auto [i, j] = sample(s);
        int64_t abs_sum = 0;
        const double want = double(exact_dot(o, i, j, &abs_sum)) / 16384.0;
        const double got = double(read_one(c[0].get() + size_t(i) + size_t(j) * kDim));
        // f32 accumulation over 8192 terms: far inside 1e-4 of the sum of |terms|.
        if (!(std::fabs(got - want) <= 1e-4 * double(abs_sum) / 16384.0))
            fail("bf16 GEMM: C[" + std::to_string(i) + "," + std::to_string(j) + "] = " + std::to_string(got) +
                 ", exact " + std::to_string(want));
    }
    const Timing t = time_launches(stream, gemm, kFloorReps);
    if (!t.held) std::fprintf(stderr, "warning: bf16 GEMM launches were not all queued in time\n");
    ms_out = t.median_us / 1000.0;
    return 2.0 * double(kDim) * kDim * kDim / (t.median_us * 1e-6) / 1e12;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
        std::fprintf(stderr, "usage: floors [OUTPUT_FILE]\n");
        return 2;
    }
    const DeviceInfo dev = device_info();
    print_device(dev);
    cudaStream_t stream;
    SB_CHECK(cudaStreamCreate(&stream));  // blocking: ordered with the synchronous copies and memsets
    cublasHandle_t h;
    SB_CUBLAS(cublasCreate(&h));
    SB_CUBLAS(cublasSetStream(h, stream));

    double copy_ms = 0, int8_ms = 0, bf16_ms = 0;
    const double copy = measure_copy(stream, copy_ms);
    const Operands o = make_operands();
    const double int8 = measure_int8(h, stream, o, int8_ms);
    const double bf16 = measure_bf16(h, stream, o, bf16_ms);

    std::printf("\n%-30s %12s %10s\n", "floor", "rate", "median ms");
    std::printf("%-30s %7.1f GB/s %10.3f\n", "copy   2 GiB device-to-device", copy, copy_ms);
    std::printf("%-30s %7.1f TOPS %10.3f\n", "int8   cuBLAS 8192^3 TN, s32", int8, int8_ms);
    std::printf("%-30s %7.1f TFLOPS %8.3f\n\n", "bf16   cuBLAS 8192^3 TN, f32", bf16, bf16_ms);

    char lines[256];
    std::snprintf(lines, sizeof lines, "floor.copy_GBps=%.1f\nfloor.int8_TOPS=%.1f\nfloor.bf16_TFLOPS=%.1f\n", copy,
                  int8, bf16);
    std::fputs(lines, stdout);
    if (argc == 2) {
        FILE* f = std::fopen(argv[1], "w");
        if (!f || std::fputs(lines, f) < 0 || std::fclose(f) != 0) fail(std::string("cannot write ") + argv[1]);
    }
    SB_CUBLAS(cublasDestroy(h));
    SB_CHECK(cudaStreamDestroy(stream));
    return 0;
}
