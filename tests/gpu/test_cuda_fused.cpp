// The fused launches of the decode path against the launches they replace:
// the producers of matmul inputs (rms_norm_quantize, swiglu_quantize) against
// the producer then quantize_act, and one mmvq_batch launch over q/k/v-like
// matrices against one mmvq per matrix. Same bytes, on fresh random inputs,
// poisoned outputs, ragged shapes.
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/ops.h"
#include "quant/quant.h"
#include "tests/gpu/gpu_test_util.h"

namespace tern {
namespace {

using gpu_test::DeviceBuffer;

struct Planes {
    DeviceBuffer<int8_t> qs;
    DeviceBuffer<float> d;
    DeviceBuffer<int32_t> sum;
    cuda::DevAct act;
    Planes(int64_t rows, int64_t cols)
        : qs(size_t(rows * cols)), d(size_t(rows * cols / 32)), sum(size_t(rows * cols / 32)) {
        qs.poison(0x5A);
        d.poison(0xFF);
        sum.poison(0x77);
        act = cuda::DevAct{qs.get(), d.get(), sum.get(), cols / 32};
    }
};

template <class T>
void expect_same(const std::vector<T>& a, const std::vector<T>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(T)), 0) << what << " differ";
}

class CudaFused : public gpu_test::GpuTest {};

TEST_F(CudaFused, RmsNormQuantizeEqualsRmsNormThenQuantize) {
    std::random_device rd;
    const uint32_t seed = rd();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 576}, {3, 4096}, {17, 64}, {64, 4096}}) {
        std::vector<float> x(static_cast<size_t>(rows * cols)), w(static_cast<size_t>(cols));
        for (float& v : x) v = nd(rng);
        for (float& v : w) v = nd(rng);
        DeviceBuffer<float> dx(x), dw(w), ref(x.size()), out(x.size());
        ref.poison();
        out.poison();
        Planes a(rows, cols), b(rows, cols);
        cuda::rms_norm(dx.get(), dw.get(), 1e-5f, ref.get(), rows, cols, nullptr);
        cuda::quantize_act(ref.get(), cols, rows, cols, a.act, nullptr);
        cuda::rms_norm_quantize(dx.get(), dw.get(), 1e-5f, out.get(), rows, cols, b.act, nullptr);
        CUDA_OK(cudaGetLastError());
        gpu_test::sync_ok();
        expect_same(ref.download(), out.download(), "normalized rows");
        expect_same(a.qs.download(), b.qs.download(), "quantized values");
        expect_same(a.d.download(), b.d.download(), "block scales");
        expect_same(a.sum.download(), b.sum.download(), "block sums");
    }
}

TEST_F(CudaFused, SwigluQuantizeEqualsSwigluThenQuantize) {
    std::random_device rd;
    const uint32_t seed = rd();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 3.0f);
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1536}, {5, 11008}, {33, 96}}) {
        std::vector<float> g(static_cast<size_t>(rows * cols)), u(static_cast<size_t>(rows * cols));
        for (float& v : g) v = nd(rng);
        for (float& v : u) v = nd(rng);
        DeviceBuffer<float> g1(g), g2(g), du(u);
        Planes a(rows, cols), b(rows, cols);
        cuda::swiglu(g1.get(), du.get(), rows * cols, nullptr);
        cuda::quantize_act(g1.get(), cols, rows, cols, a.act, nullptr);
        cuda::swiglu_quantize(g2.get(), du.get(), rows, cols, b.act, nullptr);
        CUDA_OK(cudaGetLastError());
        gpu_test::sync_ok();
        expect_same(g1.download(), g2.download(), "swiglu outputs");
        expect_same(a.qs.download(), b.qs.download(), "quantized values");
        expect_same(a.d.download(), b.d.download(), "block scales");
        expect_same(a.sum.download(), b.sum.download(), "block sums");
    }
}

TEST_F(CudaFused, MmvqBatchGivesEveryMatrixItsOwnBits) {
    std::random_device rd;
    const uint32_t seed = rd();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t cols = 2048;
    const int64_t rows[3] = {96, 37, 130};  // ragged, not multiples of the CTA's rows
    for (TensorType type : {TensorType::Q4_K, TensorType::Q8_0}) {
        SCOPED_TRACE(tensor_type_name(uint32_t(type)));
        const size_t rb = quant::row_bytes(type, cols);
        std::vector<DeviceBuffer<uint8_t>> wbuf;
        cuda::DevWeight w[3];
        for (int m = 0; m < 3; ++m) {
            std::vector<float> f(static_cast<size_t>(cols));
            std::vector<uint8_t> bytes(rb * size_t(rows[m]));
            for (int64_t r = 0; r < rows[m]; ++r) {
                for (float& v : f) v = nd(rng);
                ASSERT_TRUE(quant::quantize_row(type, f.data(), bytes.data() + size_t(r) * rb, cols).ok());
            }
            wbuf.emplace_back(bytes);
            w[m].type = cuda::WType(int(type));
            w[m].rows = rows[m];
            w[m].cols = cols;
            w[m].data = wbuf.back().get();
            w[m].block_stride = cuda::file_block_bytes(w[m].type);
            w[m].row_stride = int64_t(rb);
        }
        for (int n : {1, 3, 8}) {
            std::vector<float> x(static_cast<size_t>(n * cols));
            for (float& v : x) v = nd(rng);
            DeviceBuffer<float> dx(x);
            Planes a(n, cols);
            cuda::quantize_act(dx.get(), cols, n, cols, a.act, nullptr);
            std::vector<DeviceBuffer<float>> alone, together;
            for (int m = 0; m < 3; ++m) {
                alone.emplace_back(size_t(n * rows[m]));
                together.emplace_back(size_t(n * rows[m]));
                alone.back().poison();
                together.back().poison(0xEE);
                cuda::mmvq(w[m], a.act, n, alone.back().get(), rows[m], nullptr);
            }
            const cuda::DevWeight* ws[3] = {&w[0], &w[1], &w[2]};
            float* ys[3] = {together[0].get(), together[1].get(), together[2].get()};
            const int64_t st[3] = {rows[0], rows[1], rows[2]};
            cuda::mmvq_batch(ws, ys, st, 3, a.act, n, nullptr);
            CUDA_OK(cudaGetLastError());
            gpu_test::sync_ok();
            for (int m = 0; m < 3; ++m) {
                SCOPED_TRACE("matrix " + std::to_string(m) + ", tokens " + std::to_string(n));
                expect_same(alone[size_t(m)].download(), together[size_t(m)].download(), "outputs");
            }
        }
    }
}

}  // namespace
}  // namespace tern
