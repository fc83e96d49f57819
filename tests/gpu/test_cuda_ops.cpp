// The element-wise, normalisation, rotary, KV-store and attention kernels of
// backend/cuda/ops.h against their CPU twins (backend/cpu/ops.h and the CPU
// backend's plain loops), on fresh random inputs each run and ragged shapes;
// add_rms_norm and prepare_attention against the GPU kernels they join, run
// one after another.
// Device outputs are poisoned with NaN first, so an element a kernel forgets
// to write fails its comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/ops.h"
#include "base/fp16.h"
#include "gpu_test_util.h"
#include "tests/support/test_seed.h"

namespace tern {
namespace {

using gpu_test::DeviceBuffer;
using gpu_test::sync_ok;

constexpr uint32_t kPoisonBits = 0xffffffffu;  // a float after DeviceBuffer::poison()

class CudaOps : public gpu_test::GpuTest {
protected:
    std::string seed_text() const { return "random seed " + std::to_string(seed_); }

    std::vector<float> normal(size_t n, float mean, float stddev) {
        std::normal_distribution<float> d(mean, stddev);
        std::vector<float> v(n);
        for (float& x : v) x = d(rng_);
        return v;
    }
    float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng_); }
    int uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

    const uint32_t seed_ = tern::test::run_seed();
    std::mt19937 rng_{seed_};
};

// |got - want| <= tol, false for NaN.
bool within(float got, float want, double tol) { return std::fabs(double(got) - double(want)) <= tol; }

double max_abs(const std::vector<float>& v) {
    double m = 0.0;
    for (float x : v) m = std::max(m, std::fabs(double(x)));
    return m;
}

std::string shape(int64_t rows, int64_t cols) { return std::to_string(rows) + " x " + std::to_string(cols); }

// --- rms_norm -----------------------------------------------------------------------

TEST_F(CudaOps, RmsNormMatchesCpu) {
    SCOPED_TRACE(seed_text());
    size_t total = 0, not_identical = 0;
    double worst = 0.0;
    for (int64_t rows : {1, 3, 17, 64}) {
        for (int64_t cols : {64, 576, 4096, 5000}) {  // 5000: past the rows kept in registers
            for (int variant = 0; variant < 3; ++variant) {  // 0: no weight, 1: weight, 2: weight, in place
                SCOPED_TRACE(shape(rows, cols) + " variant " + std::to_string(variant));
                std::vector<float> x = normal(size_t(rows * cols), 0.0f, 1.0f);
                for (int64_t r = 0; r < rows; ++r) {  // rows of very different magnitudes
                    const float scale = std::pow(10.0f, uniform(-3.0f, 3.0f));
                    for (int64_t i = 0; i < cols; ++i) x[size_t(r * cols + i)] *= scale;
                }
                const std::vector<float> w = normal(size_t(cols), 1.0f, 0.5f);
                const float eps = variant == 1 ? 1e-6f : 1e-5f;
                const bool with_w = variant != 0;

                DeviceBuffer<float> dx(x), dw(w), dout(x.size());
                dout.poison();
                float* out = variant == 2 ? dx.get() : dout.get();
                cuda::rms_norm(dx.get(), with_w ? dw.get() : nullptr, eps, out, rows, cols, nullptr);
                ASSERT_NO_FATAL_FAILURE(sync_ok());
                const std::vector<float> got = variant == 2 ? dx.download() : dout.download();

                std::vector<float> want(x.size());
                backend::cpu::rms_norm(x.data(), with_w ? w.data() : nullptr, eps, want.data(), rows, cols);
                for (size_t i = 0; i < want.size(); ++i) {
                    const double rel = std::fabs(double(got[i]) - double(want[i])) /
                                       std::max(std::fabs(double(want[i])), double(FLT_MIN));
                    ASSERT_TRUE(rel <= 1e-6) << "element " << i << ": gpu " << got[i] << " cpu " << want[i];
                    worst = std::max(worst, rel);
                    not_identical += fp32_to_bits(got[i]) != fp32_to_bits(want[i]);
                }
                total += want.size();
            }
        }
    }
    std::printf("rms_norm: %zu of %zu elements differ from the CPU's bits, max relative error %.3g\n", not_identical,
                total, worst);
    // Same operations in the same order: a difference needs the double sums to
    // round to different floats, which is rare.
    EXPECT_LE(not_identical, total / 100);
}

TEST_F(CudaOps, AddRmsNormGivesTheBitsOfRmsNormThenAdd) {
    SCOPED_TRACE(seed_text());
    for (int64_t rows : {1, 3, 17, 64}) {
        for (int64_t cols : {64, 640, 2560, 4096, 5000}) {  // 5000: past the rows kept in registers
            for (bool with_w : {false, true}) {
                SCOPED_TRACE(shape(rows, cols) + (with_w ? " with weight" : " without weight"));
                const std::vector<float> x = normal(size_t(rows * cols), 0.0f, 2.0f);
                std::vector<float> y = normal(size_t(rows * cols), 0.0f, 1.0f);
                for (int64_t r = 0; r < rows; ++r) {  // rows of very different magnitudes
                    const float scale = std::pow(10.0f, uniform(-3.0f, 3.0f));
                    for (int64_t i = 0; i < cols; ++i) y[size_t(r * cols + i)] *= scale;
                }
                const std::vector<float> w = normal(size_t(cols), 1.0f, 0.5f);
                const float eps = 1e-6f;

                DeviceBuffer<float> want_x(x), want_y(y), dw(w);
                cuda::rms_norm(want_y.get(), with_w ? dw.get() : nullptr, eps, want_y.get(), rows, cols, nullptr);
                cuda::add(want_x.get(), want_y.get(), rows * cols, nullptr);

                DeviceBuffer<float> got_x(x), dy(y);
                cuda::add_rms_norm(got_x.get(), dy.get(), with_w ? dw.get() : nullptr, eps, rows, cols, nullptr);
                ASSERT_NO_FATAL_FAILURE(sync_ok());
                const std::vector<float> want = want_x.download(), got = got_x.download();
                for (size_t i = 0; i < want.size(); ++i)
                    ASSERT_EQ(fp32_to_bits(got[i]), fp32_to_bits(want[i]))
                        << "element " << i << ": joined " << got[i] << ", apart " << want[i];
            }
        }
    }
}

// --- rope ------------------------------------------------------------------------

TEST_F(CudaOps, RopeMatchesCpu) {
    SCOPED_TRACE(seed_text());
    struct Config {
        int n_heads, head_dim, n_dims;
        bool neox;
        float base, scale;
        bool factors;
        float attn_factor = 1.0f;
    };
    const Config configs[] = {
        {4, 64, 64, false, 10000.0f, 1.0f, false},   // interleaved pairs
        {8, 128, 128, true, 500000.0f, 1.0f, true},  // NeoX pairs, llama3-style frequency factors
        {3, 128, 64, true, 10000.0f, 0.25f, false},  // partial rotary, linear scaling
        {2, 96, 32, false, 1e6f, 1.0f, true},
        {4, 96, 96, true, 10000.0f, 1.0f, true, 1.19f},  // LongRoPE: factors and an attention factor
        {2, 256, 256, true, 1e6f, 1.0f, false},          // Gemma 3's head size
    };
    size_t total = 0, not_identical = 0;
    for (const Config& c : configs) {
        for (int64_t rows : {1, 3, 17, 64}) {
            SCOPED_TRACE("heads " + std::to_string(c.n_heads) + " head_dim " + std::to_string(c.head_dim) +
                         " n_dims " + std::to_string(c.n_dims) + (c.neox ? " neox" : " interleaved") + " rows " +
                         std::to_string(rows));
            const std::vector<float> x = normal(size_t(rows * c.n_heads * c.head_dim), 0.0f, 3.0f);
            std::vector<int32_t> pos(static_cast<size_t>(rows));
            for (int32_t& p : pos) p = uniform_int(0, 40000);
            pos[0] = 0;
            std::vector<float> factors(size_t(c.n_dims / 2));
            for (float& f : factors) f = uniform(1.0f, 8.0f);

            DeviceBuffer<float> dx(x), dfactors(factors);
            DeviceBuffer<int32_t> dpos(pos);
            cuda::RopeArgs args;
            args.n_heads = c.n_heads;
            args.head_dim = c.head_dim;
            args.n_dims = c.n_dims;
            args.neox = c.neox;
            args.freq_base = c.base;
            args.freq_scale = c.scale;
            args.freq_factors = c.factors ? dfactors.get() : nullptr;
            args.attn_factor = c.attn_factor;
            cuda::rope(dx.get(), rows, dpos.get(), args, nullptr);
            ASSERT_NO_FATAL_FAILURE(sync_ok());
            const std::vector<float> got = dx.download();

            std::vector<float> want = x;
            backend::RopeParams rp;
            rp.n_dims = c.n_dims;
            rp.neox = c.neox;
            rp.freq_base = c.base;
            rp.freq_scale = c.scale;
            rp.attn_factor = c.attn_factor;
            backend::cpu::rope(want.data(), rows, c.n_heads, c.head_dim, pos.data(), rp,
                               c.factors ? factors.data() : nullptr);

            const double tol = 1e-6 * max_abs(x);
            for (size_t i = 0; i < want.size(); ++i) {
                ASSERT_TRUE(within(got[i], want[i], tol)) << "element " << i << ": gpu " << got[i] << " cpu " << want[i];
                if (int(i % size_t(c.head_dim)) >= c.n_dims) {  // dims past n_dims are not rotated
                    ASSERT_EQ(fp32_to_bits(got[i]), fp32_to_bits(x[i])) << "element " << i << " changed";
                }
                not_identical += fp32_to_bits(got[i]) != fp32_to_bits(want[i]);
            }
            total += want.size();
        }
    }
    std::printf("rope: %zu of %zu elements differ from the CPU's bits\n", not_identical, total);
}

// --- element-wise ----------------------------------------------------------------

TEST_F(CudaOps, SwigluMatchesCpu) {
    SCOPED_TRACE(seed_text());
    for (int64_t n : {1, 3, 17, 4096, 262157}) {
        SCOPED_TRACE("n " + std::to_string(n));
        std::vector<float> gate(static_cast<size_t>(n));
        for (float& g : gate) g = uniform_int(0, 9) == 0 ? uniform(-80.0f, 80.0f) : uniform(-12.0f, 12.0f);
        gate[size_t(n) / 2] = 0.0f;
        const std::vector<float> up = normal(size_t(n), 0.0f, 2.0f);

        DeviceBuffer<float> dgate(gate), dup(up);
        cuda::swiglu(dgate.get(), dup.get(), n, nullptr);
        ASSERT_NO_FATAL_FAILURE(sync_ok());
        const std::vector<float> got = dgate.download();

        std::vector<float> want = gate;
        backend::cpu::swiglu(want.data(), up.data(), n);
        // expf is within 2 ulp on the GPU, std::exp within 1 on the CPU.
        for (size_t i = 0; i < want.size(); ++i)
            ASSERT_TRUE(within(got[i], want[i], 1e-6 * std::fabs(double(want[i]))))
                << "element " << i << " gate " << gate[i] << ": gpu " << got[i] << " cpu " << want[i];
    }
}

TEST_F(CudaOps, GegluMatchesCpu) {
    SCOPED_TRACE(seed_text());
    for (int64_t n : {1, 3, 17, 4096, 262157}) {
        SCOPED_TRACE("n " + std::to_string(n));
        std::vector<float> gate(static_cast<size_t>(n));
        for (float& g : gate) g = uniform_int(0, 9) == 0 ? uniform(-40.0f, 40.0f) : uniform(-6.0f, 6.0f);
        gate[size_t(n) / 2] = 0.0f;
        const std::vector<float> up = normal(size_t(n), 0.0f, 2.0f);

        DeviceBuffer<float> dgate(gate), dup(up);
        cuda::geglu(dgate.get(), dup.get(), n, nullptr);
        ASSERT_NO_FATAL_FAILURE(sync_ok());
        const std::vector<float> got = dgate.download();

        std::vector<float> want = gate;
        backend::cpu::geglu(want.data(), up.data(), n);
        // tanhf on the GPU and std::tanh differ by an ulp or two; near gelu's zero
        // at large negative g the result is tiny, so the bound is relative to |g * up|.
        for (size_t i = 0; i < want.size(); ++i)
            ASSERT_TRUE(within(got[i], want[i], 1e-6 * (std::fabs(double(want[i])) + std::fabs(double(gate[i]) * up[i]))))
                << "element " << i << " gate " << gate[i] << ": gpu " << got[i] << " cpu " << want[i];
    }
}

TEST_F(CudaOps, ScaleIsExact) {
    SCOPED_TRACE(seed_text());
    constexpr size_t kGuard = 64;  // elements past n that must stay untouched
    for (int64_t n : {1, 3, 17, 4096, 100003}) {
        SCOPED_TRACE("n " + std::to_string(n));
        const std::vector<float> x = normal(size_t(n) + kGuard, 0.0f, 10.0f);
        const float s = uniform(0.5f, 30.0f);
        DeviceBuffer<float> dx(x);
        cuda::scale(dx.get(), s, n, nullptr);
        ASSERT_NO_FATAL_FAILURE(sync_ok());
        const std::vector<float> got = dx.download();
        std::vector<float> want = x;
        backend::cpu::scale(want.data(), s, n);
        for (size_t i = 0; i < got.size(); ++i)
            ASSERT_EQ(fp32_to_bits(got[i]), fp32_to_bits(want[i])) << "element " << i;
    }
}

TEST_F(CudaOps, AddIsExact) {
    SCOPED_TRACE(seed_text());
    constexpr size_t kGuard = 64;  // elements past n that must stay untouched
    for (int64_t n : {1, 3, 17, 4096, 100003}) {
        SCOPED_TRACE("n " + std::to_string(n));
        const std::vector<float> x = normal(size_t(n) + kGuard, 0.0f, 10.0f);
        const std::vector<float> y = normal(size_t(n) + kGuard, 0.0f, 10.0f);
        DeviceBuffer<float> dx(x), dy(y);
        cuda::add(dx.get(), dy.get(), n, nullptr);
        ASSERT_NO_FATAL_FAILURE(sync_ok());
        const std::vector<float> got = dx.download();
        for (size_t i = 0; i < got.size(); ++i) {
            const float want = i < size_t(n) ? x[i] + y[i] : x[i];
            ASSERT_EQ(fp32_to_bits(got[i]), fp32_to_bits(want)) << "element " << i;
        }
    }
}

TEST_F(CudaOps, AddBiasIsExact) {
    SCOPED_TRACE(seed_text());
    for (int64_t rows : {1, 3, 17, 64}) {
        for (int64_t cols : {64, 576, 4096}) {
            SCOPED_TRACE(shape(rows, cols));
            const std::vector<float> y = normal(size_t(rows * cols), 0.0f, 5.0f);
            const std::vector<float> bias = normal(size_t(cols), 0.0f, 1.0f);
            DeviceBuffer<float> dy(y), dbias(bias);
            cuda::add_bias(dy.get(), dbias.get(), rows, cols, nullptr);
            ASSERT_NO_FATAL_FAILURE(sync_ok());
            const std::vector<float> got = dy.download();
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t c = 0; c < cols; ++c) {
                    const size_t i = size_t(r * cols + c);
                    ASSERT_EQ(fp32_to_bits(got[i]), fp32_to_bits(y[i] + bias[size_t(c)])) << "row " << r << " col " << c;
                }
        }
    }
}

TEST_F(CudaOps, GatherRowsIsExact) {
    SCOPED_TRACE(seed_text());
    constexpr int64_t kSourceRows = 37;
    constexpr size_t kGuard = 64;
    for (int64_t cols : {64, 576, 4096}) {
        for (int64_t n : {1, 5, 64}) {
            SCOPED_TRACE("cols " + std::to_string(cols) + " n " + std::to_string(n));
            const std::vector<float> x = normal(size_t(kSourceRows * cols), 0.0f, 1.0f);
            std::vector<int32_t> rows(static_cast<size_t>(n));
            for (int32_t& r : rows) r = uniform_int(0, kSourceRows - 1);  // repeats allowed
            DeviceBuffer<float> dx(x), dout(size_t(n * cols) + kGuard);
            DeviceBuffer<int32_t> drows(rows);
            dout.poison();
            cuda::gather_rows(dx.get(), cols, drows.get(), n, dout.get(), nullptr);
            ASSERT_NO_FATAL_FAILURE(sync_ok());
            const std::vector<float> got = dout.download();
            for (int64_t i = 0; i < n; ++i)
                ASSERT_EQ(0, std::memcmp(got.data() + i * cols, x.data() + int64_t(rows[size_t(i)]) * cols,
                                         size_t(cols) * sizeof(float)))
                    << "output row " << i << " (source row " << rows[size_t(i)] << ")";
            for (size_t i = size_t(n * cols); i < got.size(); ++i)
                ASSERT_EQ(fp32_to_bits(got[i]), kPoisonBits) << "written past the end at " << i;
        }
    }
}

// --- argmax_rows: the greedy pick ---------------------------------------------------

// Each row's pick is cpu::argmax_first's: rows with ties of the largest
// (earlier and later than the first), +0 beside -0, NaN and infinities
// sprinkled, rows where nothing can be picked; vocabulary widths and ragged
// ones, float4 reads (aligned rows of a multiple of 4) and single ones.
TEST_F(CudaOps, ArgmaxRowsPicksTheCpuTwinsIndex) {
    SCOPED_TRACE(seed_text());
    constexpr float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float specials[] = {nan, -nan, inf, -inf, 0.0f, -0.0f};
    for (int64_t cols : {1, 7, 33, 1024, 32000, 49155, 262144}) {
        for (int64_t rows : {1, 3, 64}) {
            for (int offset : {0, 1}) {  // 1: rows that start off a 16-byte boundary
                SCOPED_TRACE(shape(rows, cols) + " offset " + std::to_string(offset));
                std::vector<float> x = normal(size_t(rows * cols) + size_t(offset), 0.0f, 4.0f);
                for (int64_t r = 0; r < rows; ++r) {
                    float* row = x.data() + offset + r * cols;
                    const int kind = int(r % 5);
                    if (kind >= 1) {  // ties of the largest
                        const int64_t top = backend::cpu::argmax_first(row, cols);
                        for (int k = 0; k < 3; ++k) row[uniform_int(0, int(cols) - 1)] = row[top];
                    }
                    if (kind >= 2)  // specials, sometimes over the largest
                        for (int k = 0; k < 4; ++k) row[uniform_int(0, int(cols) - 1)] = specials[uniform_int(0, 5)];
                    if (kind == 3)  // zeros of both signs are the largest
                        for (int64_t i = 0; i < cols; ++i) row[i] = row[i] > 0 || row[i] != row[i] ? (i % 2 ? 0.0f : -0.0f) : row[i];
                    if (kind == 4 && r % 2)  // nothing can be picked
                        for (int64_t i = 0; i < cols; ++i) row[i] = i % 3 ? -inf : nan;
                }
                DeviceBuffer<float> dx(x);
                DeviceBuffer<int32_t> dout(size_t(rows) + 1);
                dout.poison(0x5A);
                cuda::argmax_rows(dx.get() + offset, rows, cols, dout.get(), nullptr);
                ASSERT_NO_FATAL_FAILURE(sync_ok());
                const std::vector<int32_t> got = dout.download();
                for (int64_t r = 0; r < rows; ++r)
                    ASSERT_EQ(got[size_t(r)], int32_t(backend::cpu::argmax_first(x.data() + offset + r * cols, cols)))
                        << "row " << r;
                ASSERT_EQ(uint32_t(got[size_t(rows)]), 0x5A5A5A5Au) << "written past the last row";
            }
        }
    }
}

// --- kv_store --------------------------------------------------------------------

// A paged cache of n_slots x n_ctx positions whose pages lie shuffled in a
// pool with spare pages (backend.h): slot s's page i is pool page
// table[s * per_slot + i]. `unmapped` slot pages stay -1.
struct ShuffledPages {
    static constexpr int P = backend::kKvPageSize;
    int n_slots, n_ctx, per_slot, pool;
    std::vector<int32_t> table;
    ShuffledPages(int slots, int ctx, int spare, std::mt19937& rng, int unmapped = 0)
        : n_slots(slots), n_ctx(ctx), per_slot((ctx + P - 1) / P), pool(slots * per_slot + spare) {
        std::vector<int32_t> ids(static_cast<size_t>(pool));
        for (int i = 0; i < pool; ++i) ids[size_t(i)] = i;
        std::shuffle(ids.begin(), ids.end(), rng);
        table.assign(ids.begin(), ids.begin() + int64_t(slots) * per_slot);
        for (int i = 0; i < unmapped; ++i) table[table.size() - 1 - size_t(i)] = -1;
    }
    int32_t page(int s, int p) const { return table[size_t(s) * size_t(per_slot) + size_t(p / P)]; }
    // The pool row of (slot, pos); the page must be mapped.
    size_t row(int s, int p) const { return size_t(page(s, p)) * P + size_t(p % P); }
    size_t rows() const { return size_t(pool) * P; }
    cuda::KvLayer layer(uint16_t* k, uint16_t* v, const int32_t* dev_table, int n_kv_heads, int head_dim) const {
        cuda::KvLayer l;
        l.k = k;
        l.v = v;
        l.pages = dev_table;
        l.n_slots = n_slots;
        l.n_ctx = n_ctx;
        l.n_kv_heads = n_kv_heads;
        l.head_dim = head_dim;
        l.page_size = P;
        l.pages_per_slot = per_slot;
        return l;
    }
};

// (slot, pos) of n distinct cells of a cache of n_slots x n_ctx, in random order.
std::pair<std::vector<int32_t>, std::vector<int32_t>> distinct_cells(int n, int n_slots, int n_ctx, std::mt19937& rng) {
    std::vector<int32_t> cells(size_t(n_slots) * size_t(n_ctx));
    for (size_t i = 0; i < cells.size(); ++i) cells[i] = int32_t(i);
    std::shuffle(cells.begin(), cells.end(), rng);
    std::vector<int32_t> slot, pos;
    for (int t = 0; t < n; ++t) {
        slot.push_back(cells[size_t(t)] / n_ctx);
        pos.push_back(cells[size_t(t)] % n_ctx);
    }
    return {slot, pos};
}

TEST_F(CudaOps, KvStoreRoundsLikeFp32ToFp16) {
    SCOPED_TRACE(seed_text());
    constexpr int kSlots = 3, kCtx = 64;
    // Values across the half range: normal magnitudes from subnormal to past
    // 65504, exact rounding ties, and random finite bit patterns.
    auto value = [&]() -> float {
        switch (uniform_int(0, 2)) {
            case 0: return normal(1, 0.0f, 1.0f)[0] * std::pow(10.0f, uniform(-8.0f, 5.2f));
            case 1: {  // f32 exponents 2^-24 .. 2^15 with the 13 dropped bits exactly one half
                const uint32_t exp = uint32_t(uniform_int(103, 142));
                const uint32_t mant = (uint32_t(rng_()) & 0x7fe000u) | 0x1000u;
                return fp32_from_bits((uint32_t(uniform_int(0, 1)) << 31) | (exp << 23) | mant);
            }
            default: {
                const uint32_t exp = uint32_t(uniform_int(90, 150));
                return fp32_from_bits((uint32_t(uniform_int(0, 1)) << 31) | (exp << 23) | (uint32_t(rng_()) & 0x7fffffu));
            }
        }
    };
    const std::pair<int, int> heads_dims[] = {{4, 64}, {2, 128}, {3, 96}};
    for (const auto& [n_kv, hd] : heads_dims) {
        for (int n_tokens : {1, 5, 40}) {
            SCOPED_TRACE("kv heads " + std::to_string(n_kv) + " head_dim " + std::to_string(hd) + " tokens " +
                         std::to_string(n_tokens));
            const size_t width = size_t(n_kv) * size_t(hd);
            // Distinct cells, plus one token outside the cache that must be dropped.
            auto [slot, pos] = distinct_cells(n_tokens, kSlots, kCtx, rng_);
            slot.push_back(uniform_int(0, 1) ? kSlots : 0);
            pos.push_back(slot.back() == 0 ? kCtx : 0);
            // The pages shuffled in a pool with spares; slot 2's last page
            // unmapped, so a token there (also added) must be dropped too.
            const ShuffledPages pages(kSlots, kCtx, 3, rng_, 1);
            slot.push_back(kSlots - 1);
            pos.push_back(kCtx - 1);
            const size_t rows = slot.size();
            std::vector<float> k(rows * width), v(rows * width);
            for (float& f : k) f = value();
            for (float& f : v) f = value();

            DeviceBuffer<uint16_t> dk(pages.rows() * width), dv(pages.rows() * width);
            dk.poison();
            dv.poison();
            DeviceBuffer<float> dkin(k), dvin(v);
            DeviceBuffer<int32_t> dslot(slot), dpos(pos), dtable(pages.table);
            const cuda::KvLayer layer = pages.layer(dk.get(), dv.get(), dtable.get(), n_kv, hd);
            cuda::kv_store(layer, dkin.get(), dvin.get(), int64_t(rows), dslot.get(), dpos.get(), nullptr);
            ASSERT_NO_FATAL_FAILURE(sync_ok());

            std::vector<uint16_t> want_k(dk.size(), 0xffffu), want_v(dv.size(), 0xffffu);
            for (int t = 0; t < n_tokens; ++t) {
                if (pages.page(slot[size_t(t)], pos[size_t(t)]) < 0) continue;
                const size_t at = pages.row(slot[size_t(t)], pos[size_t(t)]) * width;
                for (size_t i = 0; i < width; ++i) {
                    want_k[at + i] = fp32_to_fp16(k[size_t(t) * width + i]);
                    want_v[at + i] = fp32_to_fp16(v[size_t(t) * width + i]);
                }
            }
            const std::vector<uint16_t> got_k = dk.download(), got_v = dv.download();
            for (size_t i = 0; i < want_k.size(); ++i) {
                ASSERT_EQ(got_k[i], want_k[i]) << "K cache element " << i;
                ASSERT_EQ(got_v[i], want_v[i]) << "V cache element " << i;
            }
        }
    }
}

// --- prepare_attention -----------------------------------------------------------

// One launch for q/k norms, rope and kv_store: the bits of those kernels run
// one after another (each held to its CPU twin above), on q, k, the written
// back rows and every cache element, written or left alone.
TEST_F(CudaOps, PrepareAttentionGivesTheBitsOfTheKernelsItJoins) {
    SCOPED_TRACE(seed_text());
    constexpr int kSlots = 3, kCtx = 64;
    struct Config {
        int n_heads, n_kv, head_dim, n_dims;
        bool neox, norms, factors;
    };
    const Config configs[] = {
        {32, 32, 128, 128, false, false, false},  // Llama 2
        {32, 8, 128, 128, true, true, true},      // grouped heads, Qwen3's norms, frequency factors
        {4, 1, 256, 256, true, true, false},      // Gemma 3 270M
        {3, 3, 96, 64, true, false, false},       // partial rotary
        {6, 2, 64, 64, false, true, false},       // 8 heads: a CTA with a head of each kind
        {5, 1, 32, 32, false, false, true},
    };
    for (const Config& c : configs) {
        for (int n_tokens : {1, 5, 40}) {
            SCOPED_TRACE("heads " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv) + " head_dim " +
                         std::to_string(c.head_dim) + " n_dims " + std::to_string(c.n_dims) +
                         (c.neox ? " neox" : " interleaved") + (c.norms ? " norms" : "") + " tokens " +
                         std::to_string(n_tokens));
            // Distinct cells, then a token outside the cache and one on an unmapped page: not stored.
            auto [slot, pos] = distinct_cells(n_tokens, kSlots, kCtx, rng_);
            slot.push_back(kSlots);
            pos.push_back(uniform_int(0, kCtx - 1));
            const ShuffledPages pages(kSlots, kCtx, 2, rng_, 1);
            slot.push_back(kSlots - 1);
            pos.push_back(kCtx - 1);
            const int64_t rows = int64_t(slot.size());
            const size_t qw = size_t(c.n_heads) * size_t(c.head_dim), kw = size_t(c.n_kv) * size_t(c.head_dim);
            const std::vector<float> q = normal(size_t(rows) * qw, 0.0f, 3.0f), k = normal(size_t(rows) * kw, 0.0f, 3.0f),
                                     v = normal(size_t(rows) * kw, 0.0f, 3.0f);
            const std::vector<float> qn = normal(size_t(c.head_dim), 1.0f, 0.5f), kn = normal(size_t(c.head_dim), 1.0f, 0.5f);
            std::vector<float> factors(size_t(c.n_dims / 2));
            for (float& f : factors) f = uniform(1.0f, 8.0f);

            DeviceBuffer<float> dqn(qn), dkn(kn), dfactors(factors), dv(v);
            DeviceBuffer<int32_t> dslot(slot), dpos(pos), dtable(pages.table);
            cuda::RopeArgs args;
            args.head_dim = c.head_dim;
            args.n_dims = c.n_dims;
            args.neox = c.neox;
            args.freq_base = 10000.0f;
            args.freq_factors = c.factors ? dfactors.get() : nullptr;
            const cuda::HeadNorms norms{c.norms ? dqn.get() : nullptr, c.norms ? dkn.get() : nullptr, 1e-6f};

            // The steps apart.
            DeviceBuffer<float> aq(q), ak(k);
            DeviceBuffer<uint16_t> ak_cache(pages.rows() * kw), av_cache(pages.rows() * kw);
            ak_cache.poison();
            av_cache.poison();
            const cuda::KvLayer a_layer = pages.layer(ak_cache.get(), av_cache.get(), dtable.get(), c.n_kv, c.head_dim);
            if (c.norms) {
                cuda::rms_norm(aq.get(), dqn.get(), norms.eps, aq.get(), rows * c.n_heads, c.head_dim, nullptr);
                cuda::rms_norm(ak.get(), dkn.get(), norms.eps, ak.get(), rows * c.n_kv, c.head_dim, nullptr);
            }
            args.n_heads = c.n_heads;
            cuda::rope(aq.get(), rows, dpos.get(), args, nullptr);
            args.n_heads = c.n_kv;
            cuda::rope(ak.get(), rows, dpos.get(), args, nullptr);
            cuda::kv_store(a_layer, ak.get(), dv.get(), rows, dslot.get(), dpos.get(), nullptr);
            ASSERT_NO_FATAL_FAILURE(sync_ok());

            // In one launch.
            DeviceBuffer<float> bq(q), bk(k);
            DeviceBuffer<uint16_t> bk_cache(pages.rows() * kw), bv_cache(pages.rows() * kw);
            bk_cache.poison();
            bv_cache.poison();
            const cuda::KvLayer b_layer = pages.layer(bk_cache.get(), bv_cache.get(), dtable.get(), c.n_kv, c.head_dim);
            ASSERT_TRUE(cuda::prepare_attention_supported(c.head_dim, args));
            cuda::prepare_attention(b_layer, bq.get(), bk.get(), dv.get(), rows, c.n_heads, norms, args, dslot.get(),
                                    dpos.get(), nullptr);
            ASSERT_NO_FATAL_FAILURE(sync_ok());

            const std::vector<float> want_q = aq.download(), got_q = bq.download();
            const std::vector<float> want_k = ak.download(), got_k = bk.download();
            for (size_t i = 0; i < want_q.size(); ++i)
                ASSERT_EQ(fp32_to_bits(got_q[i]), fp32_to_bits(want_q[i])) << "q element " << i;
            for (size_t i = 0; i < want_k.size(); ++i)
                ASSERT_EQ(fp32_to_bits(got_k[i]), fp32_to_bits(want_k[i])) << "k element " << i;
            const std::vector<uint16_t> wk = ak_cache.download(), gk = bk_cache.download();
            const std::vector<uint16_t> wv = av_cache.download(), gv = bv_cache.download();
            size_t written = 0;
            for (size_t i = 0; i < wk.size(); ++i) {
                ASSERT_EQ(gk[i], wk[i]) << "K cache element " << i;
                ASSERT_EQ(gv[i], wv[i]) << "V cache element " << i;
                written += wk[i] != 0xffffu;
            }
            size_t mapped = 0;  // tokens with a mapped cache cell (slot 2's last page is not)
            for (int t = 0; t < n_tokens; ++t) mapped += pages.page(slot[size_t(t)], pos[size_t(t)]) >= 0;
            EXPECT_EQ(written, mapped * kw);  // and nothing for the two tokens outside the cache
        }
    }
    // Shapes it does not take: the backend runs the kernels apart for them.
    cuda::RopeArgs r;
    r.head_dim = 288;
    r.n_dims = 288;
    EXPECT_FALSE(cuda::prepare_attention_supported(288, r));
    r.head_dim = 128;
    r.n_dims = 130;
    EXPECT_FALSE(cuda::prepare_attention_supported(128, r));
    r.n_dims = 128;
    EXPECT_FALSE(cuda::prepare_attention_supported(100, r));
}

// --- attention -------------------------------------------------------------------

TEST_F(CudaOps, AttentionSupportedShapes) {
    EXPECT_TRUE(cuda::attention_supported(9, 3, 128));
    EXPECT_TRUE(cuda::attention_supported(32, 8, 256));
    EXPECT_TRUE(cuda::attention_supported(71, 1, 32));
    EXPECT_FALSE(cuda::attention_supported(8, 3, 64));   // heads not a multiple of KV heads
    EXPECT_FALSE(cuda::attention_supported(8, 8, 80));   // not a multiple of 32
    EXPECT_FALSE(cuda::attention_supported(8, 8, 288));  // past 256
    EXPECT_FALSE(cuda::attention_supported(8, 0, 64));
}

TEST_F(CudaOps, AttentionFewUnitsCountsTokensTimesHeadsTimesSegments) {
    int dev = 0, sms = 0;
    CUDA_OK(cudaGetDevice(&dev));
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    constexpr int kCtx = 1536;  // segments of 128
    ASSERT_EQ(cuda::attention_segment_length(kCtx), 128);
    // A unit a token at position 0 with one KV head: as many as the SMs are few.
    std::vector<int32_t> pos(size_t(sms) + 1, 0);
    EXPECT_TRUE(cuda::attention_few_units(pos.data(), sms, 1, kCtx));
    EXPECT_FALSE(cuda::attention_few_units(pos.data(), sms + 1, 1, kCtx));
    // Position 128k - 1 is k segments; position 128k starts segment k + 1.
    const int heads = (sms + 11) / 12;  // 12 segments of heads units: at least the SMs
    const int32_t last = kCtx - 1;
    EXPECT_EQ(cuda::attention_few_units(&last, 1, heads, kCtx), 12 * heads <= sms);
    const int32_t one_segment[] = {127};
    EXPECT_TRUE(cuda::attention_few_units(one_segment, 1, sms, kCtx));
    const int32_t two_segments[] = {128};
    EXPECT_FALSE(cuda::attention_few_units(two_segments, 1, sms, kCtx));
    // A position outside the cache (its row is NaN) counts one unit a head:
    // neither none nor a segment's worth.
    const int32_t outside[] = {kCtx, -1};
    EXPECT_TRUE(cuda::attention_few_units(outside, 2, sms / 2, kCtx));
    EXPECT_FALSE(cuda::attention_few_units(outside, 2, sms / 2 + 1, kCtx));
}

TEST_F(CudaOps, AttentionMatchesCpu) {
    SCOPED_TRACE(seed_text());
    constexpr int kSlots = 3, kCtx = 1536;  // 12 segments
    constexpr int kSegment = 128;           // segment length at this context
    struct Config {
        int n_heads, n_kv_heads, head_dim;
    };
    // GQA ratios 1, 3, 4, 2, 10 (two CTAs per KV head, the second part idle;
    // one and two KV heads), 2, 4 (Gemma 3 270M's heads), 2, 8 (Qwen3-MoE's)
    // and 16 (a decode warp's rows all live). Head dims 128 under a window
    // and 256 decode on the four-warp kernel. Launches told of few units of
    // work run the four-warp tensor-core kernel (attention_mma_decode.cu) for
    // tokens whose rows fit one warp, while the prefill batches' tiles run
    // attention_mma.cu's: the same bits either way.
    const Config configs[] = {{8, 8, 64},  {9, 3, 128}, {32, 8, 128}, {12, 6, 96},  {10, 1, 64},  {20, 2, 64},
                              {4, 2, 256}, {4, 1, 256}, {2, 1, 32},  {16, 2, 128}, {32, 2, 128}};
    // Batches of (slot, pos): one decode token deep in the context; tokens of
    // several sequences on segment boundaries, plus one outside the cache (NaN
    // row); a prefill-like batch mixing two sequences and a decode token (tiles
    // of one slot share staged K/V, tiles across the seam read their own); one
    // sequence's prefill with a token outside the cache in its midst; a decode
    // step of 64 sequences (slots taking turns) at random depths; a server
    // step with decoding tokens around a prompt. Each also with tiles by runs
    // of one slot (attention_tiles), as the backend launches prefill.
    std::vector<std::vector<std::pair<int32_t, int32_t>>> batches(6);
    batches[0] = {{int32_t(uniform_int(0, kSlots - 1)), int32_t(uniform_int(1000, kCtx - 1))}};
    batches[1] = {{0, 0},   {1, kSegment - 1}, {2, kSegment}, {0, 2 * kSegment - 1}, {1, 2 * kSegment},
                  {2, kCtx - 1}, {1, kCtx}};
    for (int32_t p = 700; p < 740; ++p) batches[2].push_back({0, p});
    for (int32_t p = 0; p < 30; ++p) batches[2].push_back({2, p});
    batches[2].push_back({1, 1400});
    for (int32_t p = 90; p < 127; ++p) batches[3].push_back({1, p == 95 ? kCtx : p});
    for (int32_t i = 0; i < 64; ++i) batches[4].push_back({i % kSlots, int32_t(uniform_int(0, kCtx - 1))});
    // A server step: decoding tokens of two sequences, then a prompt of 70
    // tokens (two tiles), then another decoding token.
    batches[5] = {{0, 900}, {1, 33}};
    for (int32_t p = 200; p < 270; ++p) batches[5].push_back({2, p});
    batches[5].push_back({0, 1200});
    constexpr int64_t kMaxBatch = 73;
    constexpr size_t kGuard = 64;

    for (const Config& c : configs) {
        SCOPED_TRACE("heads " + std::to_string(c.n_heads) + " kv heads " + std::to_string(c.n_kv_heads) +
                     " head_dim " + std::to_string(c.head_dim));
        ASSERT_TRUE(cuda::attention_supported(c.n_heads, c.n_kv_heads, c.head_dim));
        EXPECT_TRUE(cuda::attention_splits(1, c.n_heads, c.head_dim, kCtx, cuda::AttnBatch::Decode))
            << "a decode token should split the context";
        EXPECT_EQ(cuda::attention_segment_length(kCtx), kSegment);
        const int group = c.n_heads / c.n_kv_heads;
        const size_t hd = size_t(c.head_dim);
        const size_t pos_stride = size_t(c.n_kv_heads) * hd;
        const size_t slot_stride = size_t(kCtx) * pos_stride;

        std::vector<uint16_t> k(kSlots * slot_stride), v(kSlots * slot_stride);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (uint16_t& h : k) h = fp32_to_fp16(nd(rng_));
        for (uint16_t& h : v) h = fp32_to_fp16(nd(rng_));
        // On the device the rows lie in shuffled pages of a pool with spare
        // (poisoned) pages; the CPU twin reads each slot's rows in order.
        const ShuffledPages pages(kSlots, kCtx, 5, rng_);
        DeviceBuffer<uint16_t> dk(pages.rows() * pos_stride), dv(pages.rows() * pos_stride);
        {
            std::vector<uint16_t> pk(dk.size(), 0x7e00u), pv(dv.size(), 0x7e00u);  // f16 NaN in spare pages
            for (int s = 0; s < kSlots; ++s)
                for (int p = 0; p < kCtx; ++p) {
                    const size_t from = size_t(s) * slot_stride + size_t(p) * pos_stride, to = pages.row(s, p) * pos_stride;
                    std::copy(k.begin() + int64_t(from), k.begin() + int64_t(from + pos_stride), pk.begin() + int64_t(to));
                    std::copy(v.begin() + int64_t(from), v.begin() + int64_t(from + pos_stride), pv.begin() + int64_t(to));
                }
            dk.upload(pk);
            dv.upload(pv);
        }
        DeviceBuffer<int32_t> dtable(pages.table);
        const cuda::KvLayer layer = pages.layer(dk.get(), dv.get(), dtable.get(), c.n_kv_heads, c.head_dim);
        const size_t ws_floats = cuda::attention_workspace_bytes(kMaxBatch, c.n_heads, c.head_dim, kCtx) / sizeof(float);
        DeviceBuffer<float> workspace(ws_floats);

        // Every batch with all of each token's context, then with a sliding
        // window of 200 (not a multiple of the chunk or the segment).
        for (size_t bw = 0; bw < 2 * batches.size(); ++bw) {
            const size_t b = bw % batches.size();
            const int window = bw < batches.size() ? 0 : 200;
            const auto& batch = batches[b];
            const int64_t n_tokens = int64_t(batch.size());
            const bool splits = cuda::attention_splits(n_tokens, c.n_heads, c.head_dim, kCtx, cuda::AttnBatch::Prefill);
            SCOPED_TRACE("batch " + std::to_string(b) + (splits ? " (split)" : " (direct)") + " window " +
                         std::to_string(window));
            std::vector<int32_t> slot, pos;
            for (const auto& [s, p] : batch) {
                slot.push_back(s);
                pos.push_back(p);
            }
            const size_t row = size_t(c.n_heads) * hd;  // floats per token
            const std::vector<float> q = normal(size_t(n_tokens) * row, 0.0f, 1.0f);
            const float scale = 1.0f / std::sqrt(float(c.head_dim));
            DeviceBuffer<float> dq(q);
            DeviceBuffer<int32_t> dslot(slot), dpos(pos);

            // Tokens [first, first + n) of the batch. Workspace null forces the
            // direct path; with it, the kind and the size pick split or direct.
            // few: as attention_few_units would say of a small batch (four-warp
            // decode CTAs where a token's rows fit one warp).
            auto run = [&](int64_t first, int64_t n, bool allow_split, cuda::AttnBatch kind,
                           std::vector<float>& result, cuda::AttnTiles tiles = {}, bool few = false) {
                DeviceBuffer<float> dout(size_t(n) * row + kGuard);
                dout.poison();
                workspace.poison();
                cuda::attention(layer, dq.get() + first * int64_t(row), n, c.n_heads, scale, window, dslot.get() + first,
                                dpos.get() + first, dout.get(), allow_split ? workspace.get() : nullptr, kind, nullptr,
                                tiles, few);
                ASSERT_NO_FATAL_FAILURE(sync_ok());
                result = dout.download();
                for (size_t i = size_t(n) * row; i < result.size(); ++i)
                    ASSERT_EQ(fp32_to_bits(result[i]), kPoisonBits) << "written past the end at " << i;
                result.resize(size_t(n) * row);
            };
            std::vector<float> got, again;
            ASSERT_NO_FATAL_FAILURE(run(0, n_tokens, true, cuda::AttnBatch::Prefill, got));
            ASSERT_NO_FATAL_FAILURE(run(0, n_tokens, true, cuda::AttnBatch::Prefill, again));
            EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(float))) << "not deterministic";

            // Batch invariance: every launch of the same batch, and each token
            // alone, gives the same bits (NaN rows compared as bits too).
            auto same_bits = [&](const std::vector<float>& other, size_t offset, const std::string& what) {
                for (size_t i = 0; i < other.size(); ++i)
                    ASSERT_EQ(fp32_to_bits(got[offset + i]), fp32_to_bits(other[i]))
                        << what << ": token " << (offset + i) / row << " pos " << pos[(offset + i) / row]
                        << " element " << (offset + i) % row;
            };
            for (const bool allow_split : {true, false})
                for (const cuda::AttnBatch kind : {cuda::AttnBatch::Prefill, cuda::AttnBatch::Decode})
                    for (const bool few : {false, true}) {
                        std::vector<float> other;
                        ASSERT_NO_FATAL_FAILURE(run(0, n_tokens, allow_split, kind, other, {}, few));
                        ASSERT_NO_FATAL_FAILURE(same_bits(
                            other, 0, std::string(allow_split ? "workspace" : "no workspace") +
                                          (kind == cuda::AttnBatch::Decode ? ", decode" : ", prefill") +
                                          (few ? ", few units" : "")));
                    }
            // Tiles by runs of one slot (what the backend passes): the same bits.
            for (const bool allow_split : {true, false}) {
                const int tile_tokens = cuda::attention_tile_tokens(c.n_heads, c.n_kv_heads, c.head_dim, kCtx, window,
                                                                    n_tokens, cuda::AttnBatch::Prefill, allow_split);
                if (tile_tokens == 0) continue;
                std::vector<int32_t> starts(size_t(n_tokens) + 1, -1);
                const int64_t n_tiles = cuda::attention_tiles(slot.data(), n_tokens, tile_tokens, starts.data());
                // Each tile: one slot, at most tile_tokens tokens, a new one at each change of slot.
                ASSERT_GE(n_tiles, 1);
                ASSERT_EQ(starts[0], 0);
                ASSERT_EQ(starts[size_t(n_tiles)], n_tokens);
                for (int64_t i = 0; i < n_tiles; ++i) {
                    ASSERT_LT(starts[size_t(i)], starts[size_t(i) + 1]);
                    ASSERT_LE(starts[size_t(i) + 1] - starts[size_t(i)], tile_tokens);
                    for (int32_t t = starts[size_t(i)] + 1; t < starts[size_t(i) + 1]; ++t)
                        ASSERT_EQ(slot[size_t(t)], slot[size_t(t) - 1]) << "tile " << i << " holds two slots";
                    const int32_t b = starts[size_t(i)];
                    if (i > 0 && slot[size_t(b)] == slot[size_t(b) - 1]) {
                        ASSERT_EQ(b - starts[size_t(i) - 1], tile_tokens) << "tile " << i - 1 << " cut short";
                    }
                }
                starts.resize(size_t(n_tiles) + 1);
                DeviceBuffer<int32_t> dstarts(starts);
                std::vector<float> other;
                ASSERT_NO_FATAL_FAILURE(run(0, n_tokens, allow_split, cuda::AttnBatch::Prefill, other,
                                            cuda::AttnTiles{dstarts.get(), n_tiles, tile_tokens}));
                ASSERT_NO_FATAL_FAILURE(same_bits(other, 0, "tiles by runs"));
                // A graph's table: a tile per token, those past the step's own
                // empty (starting at n_tokens): the same bits, nothing written past.
                std::vector<int32_t> padded = starts;
                padded.resize(size_t(n_tokens) + 1, int32_t(n_tokens));
                DeviceBuffer<int32_t> dpadded(padded);
                ASSERT_NO_FATAL_FAILURE(run(0, n_tokens, allow_split, cuda::AttnBatch::Prefill, other,
                                            cuda::AttnTiles{dpadded.get(), n_tokens, tile_tokens}));
                ASSERT_NO_FATAL_FAILURE(same_bits(other, 0, "tiles by runs, padded to a tile per token"));
                // The kernel reads the table: without its last tile, that
                // tile's rows stay as poisoned and the others keep their bits.
                const int64_t kept = n_tiles - 1;
                if (kept == 0) continue;
                ASSERT_NO_FATAL_FAILURE(run(0, n_tokens, allow_split, cuda::AttnBatch::Prefill, other,
                                            cuda::AttnTiles{dstarts.get(), kept, tile_tokens}));
                const size_t cut = size_t(starts[size_t(kept)]) * row;
                for (size_t i = cut; i < other.size(); ++i)
                    ASSERT_EQ(fp32_to_bits(other[i]), kPoisonBits) << "a tile not in the table was computed, " << i;
                other.resize(cut);
                ASSERT_NO_FATAL_FAILURE(same_bits(other, 0, "tiles by runs, the last left out"));
            }
            for (int64_t t = 0; t < n_tokens; ++t)
                for (const bool few : {false, true}) {
                    std::vector<float> alone;
                    ASSERT_NO_FATAL_FAILURE(run(t, 1, true, cuda::AttnBatch::Decode, alone, {}, few));
                    ASSERT_NO_FATAL_FAILURE(same_bits(alone, size_t(t) * row, few ? "alone, few units" : "alone"));
                }

            std::vector<float> want(size_t(n_tokens) * row, 0.0f);
#pragma omp parallel for schedule(dynamic, 1)
            for (int64_t i = 0; i < n_tokens * c.n_kv_heads; ++i) {
                const size_t t = size_t(i / c.n_kv_heads);
                const int kvh = int(i % c.n_kv_heads);
                if (pos[t] >= kCtx) continue;
                const size_t first = t * row + size_t(kvh) * size_t(group) * hd;  // first query head of the group
                const int from = window > 0 ? std::max(0, pos[t] - window + 1) : 0;
                const size_t at = size_t(slot[t]) * slot_stride;
                const backend::cpu::KvRows k_rows{k.data() + at, int64_t(pos_stride)};
                const backend::cpu::KvRows v_rows{v.data() + at, int64_t(pos_stride)};
                backend::cpu::attention_kv_group(q.data() + first, group, k_rows, v_rows, from, pos[t] + 1 - from, kvh,
                                                 c.head_dim, scale, want.data() + first);
            }

            const double tol = 2e-5 * max_abs(want);
            for (size_t t = 0; t < size_t(n_tokens); ++t) {
                for (size_t i = t * row; i < (t + 1) * row; ++i) {
                    if (pos[t] >= kCtx) {
                        ASSERT_TRUE(std::isnan(got[i])) << "token outside the cache, " << i;
                        continue;
                    }
                    ASSERT_TRUE(within(got[i], want[i], tol))
                        << "token " << t << " pos " << pos[t] << " element " << i - t * row << ": gpu " << got[i]
                        << " cpu " << want[i];
                }
            }
        }
    }
}

}  // namespace
}  // namespace tern
