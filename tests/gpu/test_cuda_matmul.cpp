// The matmul kernels of backend/cuda/kernels.h against their CPU twins:
//  - quantize_act gives the bytes of quant::quantize_act_row (group 1) and of
//    quant::quantize_act_row_grouped (group 8) (qs, d, sum), on random normals
//    with outliers and on blocks made to be hard: rounding ties, all-equal
//    values, huge, tiny, subnormal, underflowing, signed-zero and NaN blocks;
//  - mmvq (1, 3, 8 tokens; alone and as parts of one launch), mmq_batch
//    (K-quants, 1 ... 64 tokens) and mmq (1 ... 2048 tokens) give, for every
//    weight type with an integer kernel and both q6_K layouts (raw 210-byte
//    blocks and the 224-byte padding pad_q6_K makes), the bits of
//    quant::dot_row_chunked (the order kernels.h documents; K-quants on
//    grouped activations) for every (row, token), on ragged row counts and
//    legacy rows that end in a partial chunk;
//  - matmul_float (F32, F16, BF16 weights) within a stated float bound of the
//    exact product, a token's bits the same whatever the batch (few-row
//    matrices take another kernel with the same arithmetic; rows whose
//    length is no multiple of 8 take the tiled one).
// Outputs are poisoned before each launch and checked whole: every element
// inside the result must be written, every element outside it (the stride gap,
// the rows past n_tokens) must keep the poison. Fresh random data each run;
// the seed is printed (TERN_TEST_SEED replays it). The CPU references run on
// every core: they, not the GPU, set the time this file takes.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/kernels.h"
#include "base/fp16.h"
#include "gpu_test_util.h"
#include "quant/act_quant.h"
#include "quant/dot.h"
#include "quant/quant.h"
#include "tests/unit/dot_test_util.h"

namespace tern {
namespace {

using cuda::WType;
using dot_testing::bits_of;
using dot_testing::seed;
using gpu_test::DeviceBuffer;
using gpu_test::sync_ok;

constexpr uint32_t kPoisonBits = 0xffffffffu;  // a float after DeviceBuffer::poison()

TensorType tensor_type(WType t) { return TensorType(uint32_t(t)); }
std::string type_name(WType t) { return tensor_type_name(uint32_t(t)); }

}  // namespace
}  // namespace tern

namespace tern::cuda {
// Test names and failure messages show the weight type by name.
static void PrintTo(WType t, std::ostream* os) { *os << tensor_type_name(uint32_t(t)); }
}  // namespace tern::cuda

namespace tern {
namespace {

// fn(i) for i in [0, n), spread over every core.
template <class Fn>
void parallel_for(int64_t n, const Fn& fn) {
    const int64_t workers = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
    std::atomic<int64_t> next{0};
    std::vector<std::thread> pool;
    for (int64_t w = 0; w < workers; ++w)
        pool.emplace_back([&] {
            for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
        });
    for (auto& t : pool) t.join();
}

// One generator per (purpose, index), so the data do not depend on which
// thread made them.
std::mt19937 rng_for(uint32_t purpose, int64_t index) {
    std::seed_seq s{seed(), purpose, uint32_t(index), uint32_t(uint64_t(index) >> 32)};
    return std::mt19937(s);
}

// ---- host data ------------------------------------------------------------------

struct HostWeights {
    TensorType type;
    int64_t rows = 0, cols = 0;
    size_t row_bytes = 0;
    std::vector<uint8_t> bytes;  // rows * row_bytes, as in a GGUF file
    const uint8_t* row(int64_t r) const { return bytes.data() + size_t(r) * row_bytes; }
};

// Rows quantized by the reference quantizer from random values whose scale
// varies per block (zero and uniform blocks now and then), so every scale and
// min is one a real file could hold.
HostWeights make_weights(TensorType type, int64_t rows, int64_t cols, uint32_t purpose) {
    HostWeights w{type, rows, cols, quant::row_bytes(type, cols), {}};
    w.bytes.resize(size_t(rows) * w.row_bytes);
    std::atomic<bool> ok{true};
    parallel_for(rows, [&](int64_t r) {
        std::mt19937 rng = rng_for(purpose, r);
        const std::vector<float> x = dot_testing::random_weights(rng, cols);
        if (!quant::quantize_row(type, x.data(), w.bytes.data() + size_t(r) * w.row_bytes, cols).ok()) ok = false;
    });
    EXPECT_TRUE(ok) << "quantize_row failed for " << tensor_type_name(uint32_t(type)) << " cols " << cols;
    return w;
}

// Token t's activations at q[t * cols/32], quantized on the CPU with one
// scale per `group` blocks (cuda::act_group of the weight type).
struct HostActs {
    int64_t n_tokens = 0, cols = 0;
    int group = 1;
    std::vector<quant::block_q8a> q;
    int64_t blocks() const { return cols / 32; }
    const quant::block_q8a* token(int64_t t) const { return q.data() + t * blocks(); }
};

// One token's row quantized as quantize_act does with that group.
void quantize_row_for_group(const float* x, quant::block_q8a* y, int64_t cols, int group) {
    if (group == 8)
        quant::quantize_act_row_grouped(x, y, cols);
    else
        quant::quantize_act_row(x, y, cols);
}

HostActs make_acts(int64_t n_tokens, int64_t cols, int group, uint32_t purpose) {
    HostActs a{n_tokens, cols, group, std::vector<quant::block_q8a>(size_t(n_tokens * cols / 32))};
    parallel_for(n_tokens, [&](int64_t t) {
        std::mt19937 rng = rng_for(purpose, t);
        const std::vector<float> x = dot_testing::random_acts(rng, cols);
        quantize_row_for_group(x.data(), a.q.data() + t * a.blocks(), cols, group);
    });
    return a;
}

// ref[t * rows + r] = dot_row_chunked(row r, token t) for t < n_tokens.
std::vector<float> reference(const HostWeights& w, const HostActs& a, int64_t n_tokens) {
    std::vector<float> ref(size_t(n_tokens * w.rows));
    parallel_for(w.rows, [&](int64_t r) {
        for (int64_t t = 0; t < n_tokens; ++t)
            ref[size_t(t * w.rows + r)] = quant::dot_row_chunked(w.type, w.row(r), a.token(t), w.cols);
    });
    return ref;
}

// ---- device data ----------------------------------------------------------------

struct DeviceActs {
    DeviceBuffer<int8_t> qs;
    DeviceBuffer<float> d;
    DeviceBuffer<int32_t> sum;
    DeviceBuffer<uint16_t> sum_split;
    cuda::DevAct view;
};

// DevAct::sum_split of rows of `blocks` blocks, by the CPU twin.
std::vector<uint16_t> split_sums(const std::vector<quant::block_q8a>& q, int64_t blocks) {
    const int64_t rows = int64_t(q.size()) / blocks, per_row = quant::split_sum_count(blocks);
    std::vector<uint16_t> split(size_t(rows * per_row));
    for (int64_t t = 0; t < rows; ++t)
        quant::split_block_sums(q.data() + t * blocks, blocks, split.data() + t * per_row);
    return split;
}

// The CPU's blocks split into the planes DevAct describes.
DeviceActs upload_acts(const HostActs& a) {
    const size_t n = a.q.size();
    std::vector<int8_t> qs(n * 32);
    std::vector<float> d(n);
    std::vector<int32_t> sum(n);
    for (size_t i = 0; i < n; ++i) {
        std::memcpy(qs.data() + 32 * i, a.q[i].qs, 32);
        d[i] = a.q[i].d;
        sum[i] = a.q[i].sum;
    }
    DeviceActs out{DeviceBuffer<int8_t>(qs), DeviceBuffer<float>(d), DeviceBuffer<int32_t>(sum),
                   DeviceBuffer<uint16_t>(split_sums(a.q, a.blocks())), {}};
    out.view = {out.qs.get(), out.d.get(), out.sum.get(), a.blocks(), a.group, out.sum_split.get()};
    return out;
}

enum class Layout { file, padded_q6_K };

struct DeviceWeights {
    DeviceBuffer<uint8_t> raw, padded;
    cuda::DevWeight view;
};

// Block geometry of a weight type, from the GGUF type table.
int block_elems(WType t) { return int(tensor_type_info(uint32_t(t))->block_elems); }
int block_bytes(WType t) { return int(tensor_type_info(uint32_t(t))->block_bytes); }

// The file's bytes as they are, or (q6_K) padded on the device by pad_q6_K,
// whose copy is checked here too.
void upload_weights(const HostWeights& w, WType type, Layout layout, DeviceWeights& out) {
    const int64_t blocks = w.cols / block_elems(type);
    out.raw = DeviceBuffer<uint8_t>(w.bytes);
    out.view = {type, w.rows, w.cols, out.raw.get(), block_bytes(type), int64_t(w.row_bytes)};
    if (layout == Layout::file) return;
    const int64_t n_blocks = w.rows * blocks;
    out.padded = DeviceBuffer<uint8_t>(size_t(n_blocks * 224));
    out.padded.poison();
    cuda::pad_q6_K(out.raw.get(), out.padded.get(), n_blocks, nullptr);
    sync_ok();
    const std::vector<uint8_t> padded = out.padded.download();
    for (int64_t b = 0; b < n_blocks; ++b)
        ASSERT_EQ(std::memcmp(padded.data() + b * 224, w.bytes.data() + b * 210, 210), 0)
            << "pad_q6_K: block " << b << " is not a copy of the file's block";
    out.view = {type, w.rows, w.cols, out.padded.get(), 224, blocks * 224};
}

// ---- checking a poisoned output -----------------------------------------------------

// y holds (n_tokens + extra) rows of `stride` floats; row t < n_tokens must
// equal want[t * rows ...] bit for bit in its first `rows` elements, and
// everything else must still be poison. Reports the first mismatch with its
// place and values, and how many there were.
void check_output(const std::vector<float>& y, int64_t n_tokens, int64_t rows, int64_t stride,
                  const std::vector<float>& want, const std::string& what) {
    int64_t bad = 0;
    std::string first;
    for (int64_t t = 0; t < int64_t(y.size()) / stride; ++t)
        for (int64_t r = 0; r < stride; ++r) {
            const float got = y[size_t(t * stride + r)];
            const bool inside = t < n_tokens && r < rows;
            const uint32_t expect = inside ? bits_of(want[size_t(t * rows + r)]) : kPoisonBits;
            if (bits_of(got) == expect) continue;
            if (bad++ == 0) {
                char buf[256];
                if (inside)
                    std::snprintf(buf, sizeof buf, "token %lld row %lld: gpu %.9g (0x%08x), cpu %.9g (0x%08x)",
                                  (long long)t, (long long)r, double(got), bits_of(got),
                                  double(want[size_t(t * rows + r)]), expect);
                else
                    std::snprintf(buf, sizeof buf, "token %lld row %lld is outside the result but was written (%.9g)",
                                  (long long)t, (long long)r, double(got));
                first = buf;
            }
        }
    EXPECT_EQ(bad, 0) << what << ": " << bad << " elements differ; first: " << first;
}

// ---- the type table -----------------------------------------------------------------

TEST(CudaKernelTable, IntegerKernelTypesAreTheCpuOnes) {
    const WType all[] = {WType::F32, WType::F16, WType::Q4_0, WType::Q4_1, WType::Q5_0, WType::Q5_1,
                         WType::Q8_0, WType::Q4_K, WType::Q5_K, WType::Q6_K, WType::BF16};
    for (WType t : all) {
        ASSERT_TRUE(tensor_type_info(uint32_t(t)).has_value()) << int(t);
        EXPECT_EQ(cuda::int_type(t), quant::dot_int_type(tensor_type(t))) << type_name(t);
    }
}

// ---- quantize_act -------------------------------------------------------------------

// Blocks that stress the quantizer's edges, chosen per (token, block).
void make_hard_block(float* x, int kind, std::mt19937& rng) {
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exp2(-20, 20);
    const float p2 = std::ldexp(1.0f, exp2(rng));
    switch (kind) {
    case 0:  // amax = 127 * 2^e makes d = 2^e exactly, so x/d = i + 0.5: rounding ties
        for (int i = 0; i < 32; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * (float(i % 31) + 0.5f) * p2;
        x[rng() % 32] = (rng() % 2 ? 127.0f : -127.0f) * p2;
        break;
    case 1:  // all equal
        for (int i = 0; i < 32; ++i) x[i] = x[0];
        break;
    case 2:  // huge, up to the largest float
        for (int i = 0; i < 32; ++i) x[i] = uni(rng) * 3.0e38f;
        x[5] = 3.4028235e38f;
        break;
    case 3:  // tiny: d is subnormal
        for (int i = 0; i < 32; ++i) x[i] = uni(rng) * 1e-37f;
        break;
    case 4:  // subnormal inputs
        for (int i = 0; i < 32; ++i) x[i] = uni(rng) * 1e-40f;
        break;
    case 5:  // amax / 127 underflows to zero
        for (int i = 0; i < 32; ++i) x[i] = (rng() % 3 == 0) ? 1.4e-45f : 0.0f;
        break;
    case 6:  // signed zeros
        for (int i = 0; i < 32; ++i) x[i] = i % 2 ? -0.0f : 0.0f;
        break;
    case 7:  // NaNs: left out of amax, quantized to -127 (docs/cpu-kernels.md)
        x[rng() % 32] = std::numeric_limits<float>::quiet_NaN();
        x[rng() % 32] = -std::numeric_limits<float>::quiet_NaN();
        break;
    default:  // left as random_acts made it
        break;
    }
}

class CudaMatmul : public gpu_test::GpuTest {};

TEST_F(CudaMatmul, QuantizeActGivesTheCpuBytes) {
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (int group : {1, 8})
    for (int64_t rows : {1, 3, 17, 512})
        for (int64_t cols : {64, 576, 4096, 14336})  // 64, 576: a short last group of 8
            for (int64_t gap : {0, 96}) {  // x_stride = cols + gap; the gap holds values that must not be read
                SCOPED_TRACE("group " + std::to_string(group) + ", " + std::to_string(rows) + " x " +
                             std::to_string(cols) + ", x_stride " + std::to_string(cols + gap));
                const int64_t stride = cols + gap, blocks = cols / 32;
                std::vector<float> x(size_t(rows * stride), 1e30f);
                parallel_for(rows, [&](int64_t t) {
                    std::mt19937 rng = rng_for(uint32_t(100 + cols), t);
                    std::vector<float> v = dot_testing::random_acts(rng, cols);
                    for (int64_t b = 0; b < blocks; ++b) make_hard_block(v.data() + 32 * b, int((t * 7 + b) % 12), rng);
                    std::copy(v.begin(), v.end(), x.begin() + t * stride);
                });
                std::vector<quant::block_q8a> want(size_t(rows * blocks));
                for (int64_t t = 0; t < rows; ++t)
                    quantize_row_for_group(x.data() + t * stride, want.data() + t * blocks, cols, group);

                DeviceBuffer<float> dx(x);
                // One token more than asked for: it must stay untouched.
                const size_t n_out = size_t((rows + 1) * blocks);
                DeviceBuffer<int8_t> qs(32 * n_out);
                DeviceBuffer<float> d(n_out);
                DeviceBuffer<int32_t> sum(n_out);
                const int64_t per_row = quant::split_sum_count(blocks);
                DeviceBuffer<uint16_t> split(size_t((rows + 1) * per_row));
                // Two different poisons: an element left unwritten cannot equal both.
                for (unsigned char poison : {0xFF, 0x5A}) {
                    qs.poison(poison);
                    d.poison(poison);
                    sum.poison(poison);
                    split.poison(poison);
                    cuda::quantize_act(dx.get(), stride, rows, cols,
                                      {qs.get(), d.get(), sum.get(), blocks, group, group == 8 ? split.get() : nullptr},
                                      nullptr);
                    sync_ok();
                    const std::vector<int8_t> got_qs = qs.download();
                    const std::vector<float> got_d = d.download();
                    const std::vector<int32_t> got_sum = sum.download();
                    // The split sums (group 8): the first rows' as the CPU's sums give them, the last one's
                    // untouched.
                    const std::vector<uint16_t> got_split = split.download();
                    const std::vector<uint16_t> want_split = split_sums(want, blocks);
                    for (size_t i = 0; i < got_split.size(); ++i) {
                        const uint16_t untouched = uint16_t(poison) * 0x101;
                        const uint16_t expect = group == 8 && i < want_split.size() ? want_split[i] : untouched;
                        ASSERT_EQ(got_split[i], expect) << "split sum " << i % 16 << " of token "
                                                        << int64_t(i) / per_row << " group "
                                                        << int64_t(i) % per_row / 16;
                    }
                    for (size_t i = 0; i < n_out; ++i) {
                        const int64_t t = int64_t(i) / blocks, b = int64_t(i) % blocks;
                        if (t < rows) {
                            const quant::block_q8a& w = want[i];
                            ASSERT_EQ(bits_of(got_d[i]), bits_of(w.d))
                                << "d of token " << t << " block " << b << ": gpu " << got_d[i] << ", cpu " << w.d
                                << " (first x " << x[size_t(t * stride + 32 * b)] << ")";
                            ASSERT_EQ(got_sum[i], w.sum) << "sum of token " << t << " block " << b;
                            for (int e = 0; e < 32; ++e)
                                ASSERT_EQ(int(got_qs[32 * i + size_t(e)]), int(w.qs[e]))
                                    << "qs of token " << t << " block " << b << " element " << e << ": x "
                                    << x[size_t(t * stride + 32 * b + e)] << ", d " << w.d;
                        } else {
                            float pd;
                            std::memset(&pd, poison, 4);
                            int32_t ps;
                            std::memset(&ps, poison, 4);
                            const std::string at = " written past the last token (block " + std::to_string(b) + ")";
                            ASSERT_EQ(bits_of(got_d[i]), bits_of(pd)) << "d" << at;
                            ASSERT_EQ(got_sum[i], ps) << "sum" << at;
                            for (int e = 0; e < 32; ++e)
                                ASSERT_EQ(uint8_t(got_qs[32 * i + size_t(e)]), poison) << "qs" << at;
                        }
                    }
                }
            }
}

// ---- mmvq and mmq ---------------------------------------------------------------------

struct IntCase {
    WType type;
    Layout layout;
};

std::string case_name(const IntCase& c) {
    return type_name(c.type) + (c.layout == Layout::padded_q6_K ? "_padded" : "");
}

void PrintTo(const IntCase& c, std::ostream* os) { *os << case_name(c); }

struct Shape {
    int64_t rows, cols;
    std::vector<int64_t> big_tokens;  // mmq token counts beyond kMmqTokens, for a few shapes only
};

// Row counts that are no multiple of any tile (1, 37, 130) and 4096; row
// lengths 256, 576 (18 blocks: two chunks and a ragged one; legacy types
// only), 512 and 1280 (two and five super-blocks: streamed kernels' rings
// filled in part, exactly, or wrapped once), 4096 and 11008 (43
// super-blocks).
const Shape kShapes[] = {
    {1, 256, {}},        {37, 576, {}},  {130, 4096, {200, 512, 2048}}, {4096, 256, {512}}, {37, 512, {200}},
    {130, 1280, {200}},  {37, 11008, {2048}}, {1, 4096, {}},             {4096, 11008, {}},
};
constexpr int64_t kMmvqTokens[] = {1, 3, 8};
constexpr int64_t kMmqTokens[] = {1, 3, 8, 17, 64, 65};  // one token tile (32-row tiles), then two
// mmq_batch (K-quants): every token tile count, ragged and full, and both
// sides of the streamed kernel's threshold (15, 16).
constexpr int64_t kMmqBatchTokens[] = {1, 2, 7, 8, 9, 15, 16, 23, 31, 32, 33, 40, 47, 56, 63, 64};

// mmq_wgmma and mmq_sync: mmq's two kernels called directly, where the
// wgmma one runs (Hopper), so that both stay tested there and a wgmma call
// that launches nothing (mmq would quietly take the other) fails.
enum class IntKernel { mmvq, mmq_batch, mmq, mmq_wgmma, mmq_sync };
const char* kernel_name(IntKernel k) {
    switch (k) {
        case IntKernel::mmvq: return "mmvq";
        case IntKernel::mmq_batch: return "mmq_batch";
        case IntKernel::mmq: return "mmq";
        case IntKernel::mmq_wgmma: return "mmq_wgmma";
        default: return "mmq_sync";
    }
}

// One launch on a poisoned output with a gap after every token's row
// (y_stride = rows + 3) and two rows past n_tokens; checked against ref.
void run_and_check(IntKernel k, const cuda::DevWeight& w, const cuda::DevAct& a, int64_t n,
                   const std::vector<float>& ref, const std::string& what) {
    const int64_t stride = w.rows + 3;
    DeviceBuffer<float> y(size_t((n + 2) * stride));
    y.poison();
    if (k == IntKernel::mmq)
        cuda::mmq(w, a, n, y.get(), stride, nullptr);
    else if (k == IntKernel::mmq_sync)
        cuda::mmq_mma_sync(w, a, n, y.get(), stride, nullptr);
    else if (k == IntKernel::mmq_wgmma)
        ASSERT_TRUE(cuda::mmq_wgmma(w, a, n, y.get(), stride, nullptr)) << what << ": the wgmma kernel launched nothing";
    else if (k == IntKernel::mmq_batch)
        cuda::mmq_batch(w, a, int(n), y.get(), stride, nullptr);
    else
        cuda::mmvq(w, a, int(n), y.get(), stride, nullptr);
    sync_ok();
    check_output(y.download(), n, w.rows, stride, ref, what);
}

class CudaIntMatmul : public gpu_test::GpuTest, public ::testing::WithParamInterface<IntCase> {};

TEST_P(CudaIntMatmul, EveryOutputHasTheCpuTwinsBits) {
    const IntCase c = GetParam();
    const TensorType tt = tensor_type(c.type);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    ASSERT_TRUE(cuda::int_type(c.type)) << case_name(c);
    const int elems = block_elems(c.type);

    // Activations per row length, as many tokens as the largest call on it needs.
    std::map<int64_t, int64_t> tokens_for_cols;
    for (const Shape& s : kShapes) {
        if (s.cols % elems) continue;
        int64_t n = kMmqTokens[std::size(kMmqTokens) - 1];
        for (int64_t b : s.big_tokens) n = std::max(n, b);
        tokens_for_cols[s.cols] = std::max(tokens_for_cols[s.cols], n);
    }
    std::map<int64_t, HostActs> acts;
    std::map<int64_t, DeviceActs> dev_acts;
    for (const auto& [cols, n] : tokens_for_cols) {
        acts[cols] = make_acts(n, cols, cuda::act_group(c.type), uint32_t(200 + cols));
        dev_acts.emplace(cols, upload_acts(acts[cols]));
    }

    for (const Shape& s : kShapes) {
        if (s.cols % elems) continue;  // K-quants: whole super-blocks only
        const std::string where = case_name(c) + " " + std::to_string(s.rows) + " x " + std::to_string(s.cols);
        SCOPED_TRACE(where);
        const HostWeights w = make_weights(tt, s.rows, s.cols, uint32_t(1000 * int(c.type) + s.rows + s.cols));
        int64_t n_ref = kMmqTokens[std::size(kMmqTokens) - 1];
        for (int64_t b : s.big_tokens) n_ref = std::max(n_ref, b);
        const std::vector<float> ref = reference(w, acts.at(s.cols), n_ref);
        for (float v : ref) ASSERT_TRUE(std::isfinite(v)) << "the CPU twin gave " << v;

        DeviceWeights dw;
        upload_weights(w, c.type, c.layout, dw);
        if (HasFatalFailure()) return;
        const cuda::DevAct& da = dev_acts.at(s.cols).view;
        auto check = [&](IntKernel k, int64_t n) {
            run_and_check(k, dw.view, da, n, ref, where + " " + kernel_name(k) + " " + std::to_string(n) + " tokens");
        };
        for (int64_t n : kMmvqTokens) check(IntKernel::mmvq, n);
        if (cuda::mmq_batch_type(c.type))
            for (int64_t n : kMmqBatchTokens) check(IntKernel::mmq_batch, n);
        std::vector<int64_t> mmq_tokens(std::begin(kMmqTokens), std::end(kMmqTokens));
        mmq_tokens.insert(mmq_tokens.end(), s.big_tokens.begin(), s.big_tokens.end());
        for (int64_t n : mmq_tokens) {
            if (cuda::mmq_wgmma_runs(dw.view, da, n)) {
                check(IntKernel::mmq_wgmma, n);
                check(IntKernel::mmq_sync, n);
            } else {
                check(IntKernel::mmq, n);
            }
        }
        if (HasFatalFailure()) return;
    }
}

// mmq's wgmma kernel is chosen on compute capability 9.0 (unless switched off)
// for the K-quants it serves, and for nothing else: where the device is a
// Hopper and the kernel does not run (its machine code missing, say), the
// mmq tests above would pass on the fallback alone, so this one fails instead.
TEST_F(CudaMatmul, WgmmaKernelRunsWhereTheDeviceIsHopper) {
    int dev = 0, major = 0, minor = 0;
    CUDA_OK(cudaGetDevice(&dev));
    CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    const char* off = std::getenv("TERN_MMQ_WGMMA");
    const bool hopper = major == 9 && minor == 0 && !(off && std::string(off) == "0");
    DeviceBuffer<uint8_t> buf(size_t(1) << 20);
    ASSERT_NE(buf.get(), nullptr);
    cuda::DevAct a;
    a.qs = reinterpret_cast<int8_t*>(buf.get());
    a.d = reinterpret_cast<float*>(buf.get() + (size_t(1) << 19));
    a.sum = reinterpret_cast<int32_t*>(buf.get() + (size_t(3) << 18));
    a.sum_split = reinterpret_cast<uint16_t*>(buf.get() + (size_t(7) << 17));
    a.blocks = 4096 / 32;
    a.group = 8;
    auto weight = [&](WType t, int block_stride) {
        cuda::DevWeight w;
        w.type = t;
        w.rows = 130;
        w.cols = 4096;
        w.data = buf.get();
        w.block_stride = block_stride;
        w.row_stride = int64_t(block_stride) * (4096 / 256);
        return w;
    };
    for (int64_t n : {1, 64, 2048}) {
        EXPECT_EQ(cuda::mmq_wgmma_runs(weight(WType::Q4_K, 144), a, n), hopper) << n << " tokens";
        EXPECT_EQ(cuda::mmq_wgmma_runs(weight(WType::Q5_K, 176), a, n), hopper) << n << " tokens";
        EXPECT_EQ(cuda::mmq_wgmma_runs(weight(WType::Q6_K, 224), a, n), hopper) << n << " tokens";
        EXPECT_FALSE(cuda::mmq_wgmma_runs(weight(WType::Q6_K, 210), a, n)) << "q6_K in the file's layout";
    }
    cuda::DevAct unsplit = a;
    unsplit.sum_split = nullptr;
    EXPECT_FALSE(cuda::mmq_wgmma_runs(weight(WType::Q4_K, 144), unsplit, 512)) << "q4_K without the split sums";
    EXPECT_EQ(cuda::mmq_wgmma_runs(weight(WType::Q6_K, 224), unsplit, 512), hopper) << "q6_K (no mins)";
    cuda::DevAct ungrouped = a;
    ungrouped.group = 1;
    EXPECT_FALSE(cuda::mmq_wgmma_runs(weight(WType::Q4_K, 144), ungrouped, 512)) << "activations of group 1";
    cuda::DevAct legacy = ungrouped;
    cuda::DevWeight q8 = weight(WType::Q8_0, 34);
    q8.row_stride = 34 * (4096 / 32);
    EXPECT_FALSE(cuda::mmq_wgmma_runs(q8, legacy, 512)) << "a legacy type";
}

// The mins' product at its extremes: every scale and min 63, and tokens
// whose block sums are +-4,064 (all values +-127) or +-(4,064 - k) for every
// k in 0..63 (every residue mod 64), one sign across a super-block so that
// the mins' total reaches 63 * 4,064 * 8 (just under 2^21), and random ones:
// the split sums' high and low halves and the f16 products of the wgmma and
// the streamed mmq_batch kernels (exact only while every partial sum is an
// integer the accumulator holds) are pushed to their bounds. Every output
// must keep the CPU twin's bits, on whichever kernel mmq takes, on the wgmma
// kernel itself where it runs, and on mmq_batch.
TEST_F(CudaMatmul, KQuantMinsAtTheirExtremesKeepTheCpuBits) {
    SCOPED_TRACE("seed " + std::to_string(seed()));
    const int64_t rows = 130, cols = 4096, n = 200, blocks = cols / 32;
    HostActs acts{n, cols, 8, std::vector<quant::block_q8a>(size_t(n * blocks))};
    std::mt19937 rng(seed());
    for (int64_t t = 0; t < n; ++t)
        for (int64_t b = 0; b < blocks; ++b) {
            quant::block_q8a& q = acts.q[size_t(t * blocks + b)];
            q.d = 0.0078125f;  // one scale for every group
            const int sign = (b / 8 + t) % 2 ? -1 : 1;  // one sign a super-block
            int drop = t % 4 == 2 ? int(b % 64) : 0;     // sums +-(4,064 - b % 64)
            for (int e = 0; e < 32; ++e) {
                const int less = std::min(drop, 2);
                drop -= less;
                int v = sign * (127 - less);
                if (t % 4 == 3) v = int(rng() % 255) - 127;
                q.qs[e] = int8_t(v);
            }
            q.sum = 0;
            for (int e = 0; e < 32; ++e) q.sum += q.qs[e];
        }
    const DeviceActs dev_acts = upload_acts(acts);
    for (WType type : {WType::Q4_K, WType::Q5_K}) {
        SCOPED_TRACE(type_name(type));
        const TensorType tt = tensor_type(type);
        HostWeights w{tt, rows, cols, quant::row_bytes(tt, cols), {}};
        w.bytes.resize(size_t(rows) * w.row_bytes);
        const int bb = block_bytes(type);
        for (size_t at = 0; at < w.bytes.size(); at += size_t(bb)) {
            uint8_t* blk = w.bytes.data() + at;
            for (int i = 0; i < bb; ++i) blk[i] = uint8_t(rng());
            const uint16_t d = fp32_to_fp16(0.5f), dmin = fp32_to_fp16(1.0f);
            std::memcpy(blk, &d, 2);
            std::memcpy(blk + 2, &dmin, 2);
            std::memset(blk + 4, 0xFF, 12);  // every 6-bit scale and min 63
        }
        const std::vector<float> ref = reference(w, acts, n);
        DeviceWeights dw;
        upload_weights(w, type, Layout::file, dw);
        if (HasFatalFailure()) return;
        for (int64_t tokens : {int64_t(1), int64_t(64), n}) {
            const std::string what = type_name(type) + " " + std::to_string(tokens) + " tokens";
            run_and_check(IntKernel::mmq, dw.view, dev_acts.view, tokens, ref, what + " mmq");
            if (cuda::mmq_wgmma_runs(dw.view, dev_acts.view, tokens))
                run_and_check(IntKernel::mmq_wgmma, dw.view, dev_acts.view, tokens, ref, what + " mmq_wgmma");
        }
        // mmq_batch, whose streamed kernel (16 tokens and more) takes X from the split sums too.
        for (int64_t tokens : {8, 16, 40, 64})
            run_and_check(IntKernel::mmq_batch, dw.view, dev_acts.view, tokens, ref,
                          type_name(type) + " " + std::to_string(tokens) + " tokens mmq_batch");
    }
}

// mmvq_parts: three matrices of one type (ragged row counts, the first CTA
// of each part after a partial one) in one launch; every part's outputs are
// the CPU twin's bits, its padding and the rows past it untouched.
TEST_P(CudaIntMatmul, PartsInOneLaunchKeepTheirBits) {
    const IntCase c = GetParam();
    const TensorType tt = tensor_type(c.type);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    constexpr int kParts = 3;
    const int64_t cols = 4096, rows[kParts] = {130, 37, 4096};
    const int64_t n_max = kMmvqTokens[std::size(kMmvqTokens) - 1];
    const HostActs acts = make_acts(n_max, cols, cuda::act_group(c.type), 4000);
    const DeviceActs dev_acts = upload_acts(acts);
    DeviceWeights dw[kParts];
    std::vector<float> ref[kParts];
    for (int i = 0; i < kParts; ++i) {
        const HostWeights w = make_weights(tt, rows[i], cols, uint32_t(5000 + 10 * int(c.type) + i));
        ref[i] = reference(w, acts, n_max);
        upload_weights(w, c.type, c.layout, dw[i]);
        if (HasFatalFailure()) return;
    }
    for (int64_t n : kMmvqTokens) {
        DeviceBuffer<float> y[kParts];
        cuda::MatmulPart parts[kParts];
        for (int i = 0; i < kParts; ++i) {
            y[i] = DeviceBuffer<float>(size_t((n + 2) * (rows[i] + 3)));
            y[i].poison();
            parts[i] = cuda::MatmulPart{dw[i].view, y[i].get(), rows[i] + 3};
            ASSERT_TRUE(cuda::mmvq_parts_compatible(parts[0].w, parts[i].w));
        }
        cuda::mmvq_parts(parts, kParts, dev_acts.view, int(n), nullptr);
        sync_ok();
        for (int i = 0; i < kParts; ++i)
            check_output(y[i].download(), n, rows[i], rows[i] + 3, ref[i],
                         case_name(c) + " part " + std::to_string(i) + ", " + std::to_string(n) + " tokens");
    }
}

// mmvq_parts with add (matmul_add at decode): each output is the value y
// held plus the product, the bits of the product then the add kernel (an
// IEEE single add, as on the host here); padding and rows past the result
// untouched.
TEST_P(CudaIntMatmul, AddedToYGivesTheBitsOfTheProductThenAdd) {
    const IntCase c = GetParam();
    const TensorType tt = tensor_type(c.type);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    const int64_t cols = 2048, rows = 130, stride = rows + 3;
    const int64_t n_max = kMmvqTokens[std::size(kMmvqTokens) - 1];
    const HostActs acts = make_acts(n_max, cols, cuda::act_group(c.type), 4100);
    const DeviceActs dev_acts = upload_acts(acts);
    const HostWeights w = make_weights(tt, rows, cols, uint32_t(5100 + int(c.type)));
    const std::vector<float> ref = reference(w, acts, n_max);
    DeviceWeights dw;
    upload_weights(w, c.type, c.layout, dw);
    if (HasFatalFailure()) return;
    std::mt19937 rng = rng_for(uint32_t(5200 + int(c.type)), 0);
    std::normal_distribution<float> nd(0.0f, 4.0f);
    for (int64_t n : kMmvqTokens) {
        std::vector<float> y(size_t((n + 2) * stride)), want(size_t(n * rows));
        for (int64_t t = 0; t < n + 2; ++t)
            for (int64_t r = 0; r < stride; ++r) {
                float& v = y[size_t(t * stride + r)];
                if (t < n && r < rows) {
                    v = nd(rng);
                    want[size_t(t * rows + r)] = v + ref[size_t(t * rows + r)];
                } else {
                    std::memcpy(&v, &kPoisonBits, 4);
                }
            }
        DeviceBuffer<float> dy(y);
        const cuda::MatmulPart part{dw.view, dy.get(), stride, /*add=*/true};
        cuda::mmvq_parts(&part, 1, dev_acts.view, int(n), nullptr);
        sync_ok();
        check_output(dy.download(), n, rows, stride, want, case_name(c) + ", " + std::to_string(n) + " tokens");
    }
    // Parts that add beside parts that write launch nothing.
    DeviceBuffer<float> y0(size_t(n_max * stride)), y1(size_t(n_max * stride));
    y0.poison();
    y1.poison();
    const cuda::MatmulPart mixed[2] = {{dw.view, y0.get(), stride, true}, {dw.view, y1.get(), stride, false}};
    cuda::mmvq_parts(mixed, 2, dev_acts.view, int(n_max), nullptr);
    sync_ok();
    for (const DeviceBuffer<float>* b : {&y0, &y1})
        for (float v : b->download()) ASSERT_EQ(bits_of(v), kPoisonBits) << "a mixed launch wrote";
}

INSTANTIATE_TEST_SUITE_P(Types, CudaIntMatmul,
                         ::testing::Values(IntCase{WType::Q4_0, Layout::file}, IntCase{WType::Q4_1, Layout::file},
                                           IntCase{WType::Q5_0, Layout::file}, IntCase{WType::Q5_1, Layout::file},
                                           IntCase{WType::Q8_0, Layout::file}, IntCase{WType::Q4_K, Layout::file},
                                           IntCase{WType::Q5_K, Layout::file}, IntCase{WType::Q6_K, Layout::file},
                                           IntCase{WType::Q6_K, Layout::padded_q6_K}),
                         [](const ::testing::TestParamInfo<IntCase>& i) { return case_name(i.param); });

// ---- matmul_float -------------------------------------------------------------------------

// Element bytes of a weight in its stored form, and the f32 value the kernel
// must use for it (exactly the widened stored value).
std::vector<uint8_t> store_float_row(WType t, std::vector<float>& w) {
    const size_t es = size_t(block_bytes(t));
    std::vector<uint8_t> out(w.size() * es);
    for (size_t i = 0; i < w.size(); ++i) {
        if (t == WType::F32) {
            std::memcpy(out.data() + 4 * i, &w[i], 4);
            continue;
        }
        const uint16_t h = t == WType::F16 ? fp32_to_fp16(w[i]) : fp32_to_bf16(w[i]);
        w[i] = t == WType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
        std::memcpy(out.data() + 2 * i, &h, 2);
    }
    return out;
}

struct FloatShape {
    int64_t rows, cols;
    std::vector<int64_t> tokens;
};

const FloatShape kFloatShapes[] = {
    {1, 256, {1, 3, 8, 17}},          {37, 576, {1, 3, 8, 17, 512}}, {130, 4096, {1, 3, 8, 17, 512}},
    {4096, 256, {1, 3, 8, 17, 512}},  {37, 11008, {1, 8, 17}},       {4096, 4096, {1, 3, 8}},
    {128, 2048, {1, 2, 8, 9, 100, 512}}, {5, 100, {1, 3, 17}},      {37, 264, {1, 3, 8, 17, 100}},
};

class CudaFloatMatmul : public gpu_test::GpuTest, public ::testing::WithParamInterface<WType> {};

// Bound on |gpu - exact| with exact = sum_k w_k x_k (in double, on the f32
// values): 4 * (k/16 + 5) * 2^-24 * sum_k |w_k x_k|. That is four times the
// CPU kernel's worst case (sixteen lanes of k/16 additions and a four-level
// fold, docs/cpu-kernels.md), room for any reasonable reduction tree on the
// GPU; an element read twice, skipped or taken from the wrong row is far
// outside it.
TEST_P(CudaFloatMatmul, WithinTheStatedBoundOfTheExactProduct) {
    const WType type = GetParam();
    SCOPED_TRACE("seed " + std::to_string(seed()) + ", " + type_name(type));
    double worst_ratio = 0.0;
    for (const FloatShape& s : kFloatShapes) {
        const std::string where = std::to_string(s.rows) + " x " + std::to_string(s.cols);
        SCOPED_TRACE(where);
        const int64_t n_max = *std::max_element(s.tokens.begin(), s.tokens.end());
        std::vector<float> w(size_t(s.rows * s.cols));
        std::vector<uint8_t> bytes(w.size() * size_t(block_bytes(type)));
        parallel_for(s.rows, [&](int64_t r) {
            std::mt19937 rng = rng_for(uint32_t(5000 + int(type)), r * 100003 + s.cols);
            std::vector<float> row = dot_testing::random_weights(rng, s.cols);
            const std::vector<uint8_t> stored = store_float_row(type, row);
            std::copy(row.begin(), row.end(), w.begin() + r * s.cols);
            std::copy(stored.begin(), stored.end(), bytes.begin() + int64_t(stored.size()) * r);
        });
        std::vector<float> x(size_t(n_max * s.cols));
        parallel_for(n_max, [&](int64_t t) {
            std::mt19937 rng = rng_for(uint32_t(6000), t * 100003 + s.cols);
            const std::vector<float> v = dot_testing::random_acts(rng, s.cols);
            std::copy(v.begin(), v.end(), x.begin() + t * s.cols);
        });
        std::vector<double> exact(size_t(n_max * s.rows)), bound(exact.size());
        parallel_for(s.rows, [&](int64_t r) {
            for (int64_t t = 0; t < n_max; ++t) {
                double sum = 0, abs_sum = 0;
                for (int64_t k = 0; k < s.cols; ++k) {
                    const double p = double(w[size_t(r * s.cols + k)]) * double(x[size_t(t * s.cols + k)]);
                    sum += p;
                    abs_sum += std::fabs(p);
                }
                exact[size_t(t * s.rows + r)] = sum;
                bound[size_t(t * s.rows + r)] = 4.0 * (double(s.cols) / 16 + 5) * 0x1p-24 * abs_sum;
            }
        });

        DeviceBuffer<uint8_t> dw(bytes);
        DeviceBuffer<float> dx(x);
        const int es = block_bytes(type);
        const cuda::DevWeight view{type, s.rows, s.cols, dw.get(), es, s.cols * es};
        std::vector<float> alone;  // token 0's outputs from the first call: every call gives their bits
        for (int64_t n : s.tokens) {
            SCOPED_TRACE(std::to_string(n) + " tokens");
            DeviceBuffer<float> y(size_t((n + 2) * s.rows));  // two rows past the result must stay untouched
            y.poison();
            cuda::matmul_float(view, dx.get(), n, y.get(), nullptr);
            sync_ok();
            const std::vector<float> got = y.download();
            int64_t bad = 0;
            std::string first;
            for (int64_t t = 0; t < n + 2; ++t)
                for (int64_t r = 0; r < s.rows; ++r) {
                    const float g = got[size_t(t * s.rows + r)];
                    bool fine;
                    if (t < n) {
                        const double e = exact[size_t(t * s.rows + r)], b = bound[size_t(t * s.rows + r)];
                        fine = std::isfinite(g) && std::fabs(double(g) - e) <= b;
                        if (fine && b > 0) worst_ratio = std::max(worst_ratio, std::fabs(double(g) - e) / b);
                    } else {
                        fine = bits_of(g) == kPoisonBits;
                    }
                    if (!fine && bad++ == 0) {
                        char buf[256];
                        std::snprintf(buf, sizeof buf, "token %lld row %lld: gpu %.9g, exact %.9g, bound %.3g%s",
                                      (long long)t, (long long)r, double(g),
                                      t < n ? exact[size_t(t * s.rows + r)] : 0.0,
                                      t < n ? bound[size_t(t * s.rows + r)] : 0.0,
                                      t < n ? "" : " (outside the result: written)");
                        first = buf;
                    }
                }
            EXPECT_EQ(bad, 0) << where << ", " << n << " tokens: " << bad << " elements wrong; first: " << first;
            if (alone.empty()) alone.assign(got.begin(), got.begin() + s.rows);
            EXPECT_EQ(std::memcmp(alone.data(), got.data(), size_t(s.rows) * sizeof(float)), 0)
                << where << ": token 0 among " << n << " tokens has other bits than in the first call";
        }
    }
    std::printf("  %s: worst |gpu - exact| is %.1f%% of the bound\n", type_name(type).c_str(), 100 * worst_ratio);
}

INSTANTIATE_TEST_SUITE_P(Types, CudaFloatMatmul, ::testing::Values(WType::F32, WType::F16, WType::BF16),
                         [](const ::testing::TestParamInfo<WType>& i) { return type_name(i.param); });

}  // namespace
}  // namespace tern
