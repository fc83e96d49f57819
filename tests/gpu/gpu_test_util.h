// Helpers shared by the GPU tests: an assertion on CUDA calls that names the
// failing expression, a device buffer that frees itself, and the GPU presence
// check. These tests run only where a GPU is expected (ctest label gpu), so a
// missing GPU is a failure with a clear message, never a silent skip.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

// ASSERTs that a CUDA call returned cudaSuccess, naming the call and the error.
// Like ASSERT_*, usable only in functions returning void.
#define CUDA_OK(expr)                                                                                       \
    do {                                                                                                    \
        const cudaError_t cuda_ok_status_ = (expr);                                                         \
        ASSERT_EQ(cuda_ok_status_, cudaSuccess)                                                             \
            << #expr << " failed: " << cudaGetErrorName(cuda_ok_status_) << " ("                            \
            << cudaGetErrorString(cuda_ok_status_) << ")";                                                  \
    } while (0)

namespace tern::gpu_test {

// Fails (fatally for the calling function) unless a CUDA device is usable.
inline void require_gpu() {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    ASSERT_EQ(e, cudaSuccess) << "no usable CUDA device (cudaGetDeviceCount: " << cudaGetErrorName(e) << ", "
                              << cudaGetErrorString(e) << "); the gpu-labelled tests need a GPU";
    ASSERT_GT(n, 0) << "no CUDA device present; the gpu-labelled tests need a GPU";
}

// Fixture whose tests fail at SetUp (body not run) when there is no GPU.
class GpuTest : public ::testing::Test {
protected:
    void SetUp() override { require_gpu(); }
};

// Waits for the device and fails on any launch or execution error.
inline void sync_ok() {
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
}

// n elements of T in device memory, freed on destruction. Failures are
// reported through gtest; a buffer whose allocation failed has size 0.
template <class T>
class DeviceBuffer {
    static_assert(std::is_trivially_copyable_v<T>, "device buffers hold plain values");

public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t n) {
        if (n == 0) return;
        const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T));
        if (e != cudaSuccess) {
            ADD_FAILURE() << "cudaMalloc of " << n * sizeof(T) << " bytes failed: " << cudaGetErrorString(e);
            ptr_ = nullptr;
            return;
        }
        size_ = n;
    }
    explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
    ~DeviceBuffer() {
        if (ptr_) cudaFree(ptr_);
    }
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        std::swap(ptr_, o.ptr_);
        std::swap(size_, o.size_);
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    T* get() const { return ptr_; }
    size_t size() const { return size_; }
    size_t bytes() const { return size_ * sizeof(T); }

    // Copies host to the start of the buffer.
    void upload(const std::vector<T>& host) {
        ASSERT_LE(host.size(), size_) << "upload of " << host.size() << " elements into a buffer of " << size_;
        if (host.empty()) return;
        CUDA_OK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }

    // The whole buffer (size() elements; value-initialised if the copy failed).
    std::vector<T> download() const {
        std::vector<T> host(size_);
        if (size_ == 0) return host;
        const cudaError_t e = cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost);
        EXPECT_EQ(e, cudaSuccess) << "download of " << bytes() << " bytes failed: " << cudaGetErrorString(e);
        return host;
    }

    // Fills every byte with `byte`: 0xFF makes every f32 a NaN and every f16 a NaN,
    // so an element a kernel forgot to write cannot pass a comparison.
    void poison(unsigned char byte = 0xFF) {
        if (size_ == 0) return;
        CUDA_OK(cudaMemset(ptr_, byte, bytes()));
    }

private:
    T* ptr_ = nullptr;
    size_t size_ = 0;
};

}  // namespace tern::gpu_test
