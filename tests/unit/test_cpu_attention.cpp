// The CPU attention's prefill tiles (cpu::attention_tile) against the
// one-token form (cpu::attention_kv_group), and each one's AVX2 schedule
// against its portable form: every token of a tile gets the bits it gets
// alone, over causal ranges and sliding windows, ragged tile sizes, head
// sizes and query groups, scores of a normal and a very wide spread, with the
// tiles reading the cache through shuffled pages (cpu::KvRows) and the
// reference in one run of rows; and the one-token form within a stated
// tolerance of a double-precision softmax. Fresh random inputs each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "base/fp16.h"
#include "tests/support/test_seed.h"

namespace tern {
namespace {

using backend::cpu::AttentionTile;
using backend::cpu::kAttentionTileTokens;
using backend::cpu::KvRows;

// n_pages page places shuffled in a pool of n_pages + 1 (one spare).
std::vector<int32_t> shuffled_table(int n_pages, std::mt19937& rng) {
    std::vector<int32_t> ids(size_t(n_pages) + 1);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.pop_back();
    return ids;
}

// The rows of `rows` (n_pos positions of `width` halves) copied into the
// pages `table` places them in, the spare page NaNs.
std::vector<uint16_t> paged_copy(const std::vector<uint16_t>& rows, int n_pos, size_t width, int page_size,
                                 const std::vector<int32_t>& table) {
    std::vector<uint16_t> pool((table.size() + 1) * size_t(page_size) * width, 0x7e00u);  // f16 NaN
    for (int p = 0; p < n_pos; ++p)
        std::copy_n(rows.begin() + int64_t(size_t(p) * width), width,
                    pool.begin() + int64_t((size_t(table[size_t(p / page_size)]) * size_t(page_size) +
                                            size_t(p % page_size)) * width));
    return pool;
}

TEST(CpuAttention, TileTokensHaveTheirOwnBits) {
    if (!quant::simd_path_available(quant::SimdPath::avx2))
        std::printf("[   NOTE   ] no AVX2 on this CPU: only the portable attention is checked\n");
    std::mt19937 rng(test::run_seed() + 7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    struct Shape { int head_dim, n_q, n_kv_heads, n_pos; };
    // Query groups of 1 to 5 heads (the AVX2 schedule blocks them by four),
    // head sizes with and without a tail past the last eight.
    for (const Shape sh : {Shape{64, 3, 3, 40}, Shape{256, 4, 1, 70}, Shape{80, 1, 2, 17}, Shape{128, 2, 4, 9},
                           Shape{36, 5, 1, 23}}) {
        SCOPED_TRACE("head dim " + std::to_string(sh.head_dim) + ", " + std::to_string(sh.n_q) + " query heads");
        const size_t hd = size_t(sh.head_dim);
        std::vector<uint16_t> k(size_t(sh.n_pos * sh.n_kv_heads) * hd), v(k.size());
        for (auto* kv : {&k, &v})
            for (uint16_t& x : *kv) x = fp32_to_fp16(nd(rng));
        const int kv_head = sh.n_kv_heads - 1;
        const size_t width = size_t(sh.n_kv_heads) * hd;
        const KvRows k_run{k.data(), int64_t(width)}, v_run{v.data(), int64_t(width)};
        const int page_shift = int(rng() % 4);  // pages of 1 to 8 positions
        const int page_size = 1 << page_shift;
        const std::vector<int32_t> table = shuffled_table((sh.n_pos + page_size - 1) / page_size, rng);
        const std::vector<uint16_t> k_pool = paged_copy(k, sh.n_pos, width, page_size, table);
        const std::vector<uint16_t> v_pool = paged_copy(v, sh.n_pos, width, page_size, table);
        const KvRows k_paged{k_pool.data(), int64_t(width), table.data(), page_shift};
        const KvRows v_paged{v_pool.data(), int64_t(width), table.data(), page_shift};
        // Scores of a normal spread, and forty times wider: most weights
        // then underflow, through the exponential's special cases.
        for (const float q_scale : {1.0f, 40.0f}) {
            for (int n_t = 1; n_t <= kAttentionTileTokens; ++n_t)
                for (int window : {0, 5, 23}) {  // 23: a window spanning more than one 16-position block
                    // A run of consecutive positions ending at n_pos - 1, as in a prefill.
                    std::vector<int> first(static_cast<size_t>(n_t)), last(static_cast<size_t>(n_t));
                    for (int t = 0; t < n_t; ++t) {
                        last[size_t(t)] = sh.n_pos - n_t + t;
                        first[size_t(t)] = window > 0 ? std::max(0, last[size_t(t)] - window + 1) : 0;
                    }
                    const int64_t stride = int64_t(sh.n_q) * sh.head_dim + 3;  // rows wider than the group
                    std::vector<float> q(size_t(n_t * stride)), out(q.size(), std::numeric_limits<float>::quiet_NaN());
                    for (float& x : q) x = nd(rng) * q_scale;
                    const AttentionTile tile{q.data(),     stride,      n_t,        sh.n_q,
                                             first.data(), last.data(), out.data(), stride};
                    backend::cpu::attention_tile(tile, k_paged, v_paged, kv_head, sh.head_dim, 0.125f,
                                                 quant::SimdPath::scalar);
                    // The AVX2 schedule: the portable form's bits, the padding untouched.
                    if (quant::simd_path_available(quant::SimdPath::avx2)) {
                        std::vector<float> vec_out(q.size(), std::numeric_limits<float>::quiet_NaN());
                        const AttentionTile vec_tile{q.data(), stride, n_t, sh.n_q, first.data(), last.data(),
                                                     vec_out.data(), stride};
                        backend::cpu::attention_tile(vec_tile, k_paged, v_paged, kv_head, sh.head_dim, 0.125f,
                                                     quant::SimdPath::avx2);
                        for (size_t i = 0; i < out.size(); ++i)
                            ASSERT_TRUE(std::memcmp(&out[i], &vec_out[i], sizeof(float)) == 0)
                                << "AVX2 tile differs at " << i << ": " << vec_out[i] << " vs " << out[i] << ", " << n_t
                                << " tokens, window " << window;
                    }
                    for (int t = 0; t < n_t; ++t) {
                        std::vector<float> alone(size_t(sh.n_q) * hd);
                        const int n_pos = last[size_t(t)] - first[size_t(t)] + 1;
                        backend::cpu::attention_kv_group(q.data() + t * stride, sh.n_q, k_run, v_run, first[size_t(t)],
                                                         n_pos, kv_head, sh.head_dim, 0.125f, alone.data(),
                                                         quant::SimdPath::scalar);
                        ASSERT_EQ(std::memcmp(alone.data(), out.data() + t * stride, alone.size() * sizeof(float)), 0)
                            << "token " << t << " of " << n_t << ", window " << window;
                        if (quant::simd_path_available(quant::SimdPath::avx2)) {  // the one-token form on AVX2
                            std::vector<float> vec_alone(alone.size(), std::numeric_limits<float>::quiet_NaN());
                            backend::cpu::attention_kv_group(q.data() + t * stride, sh.n_q, k_paged, v_paged,
                                                             first[size_t(t)], n_pos, kv_head, sh.head_dim, 0.125f,
                                                             vec_alone.data(), quant::SimdPath::avx2);
                            ASSERT_EQ(std::memcmp(alone.data(), vec_alone.data(), alone.size() * sizeof(float)), 0)
                                << "AVX2 one-token form, token " << t << " of " << n_t << ", window " << window;
                        }
                        // The padding past the group stays untouched.
                        for (int64_t i = int64_t(alone.size()); i < stride; ++i)
                            ASSERT_TRUE(std::isnan(out[size_t(t * stride + i)]));

                        // And the result is the softmax-weighted sum of V (double
                        // precision; at the normal spread, where float scores are
                        // close enough for the stated tolerance).
                        for (int j = 0; j < sh.n_q && q_scale == 1.0f; ++j) {
                            std::vector<double> s;
                            double mx = -INFINITY;
                            for (int p = first[size_t(t)]; p <= last[size_t(t)]; ++p) {
                                double d = 0;
                                for (size_t i = 0; i < hd; ++i)
                                    d += double(q[size_t(t * stride) + size_t(j) * hd + i]) *
                                         fp16_to_fp32(k[(size_t(p * sh.n_kv_heads + kv_head)) * hd + i]);
                                s.push_back(d * 0.125);
                                mx = std::max(mx, s.back());
                            }
                            double sum = 0;
                            for (double& e : s) sum += (e = std::exp(e - mx));
                            for (size_t i = 0; i < hd; ++i) {
                                double want = 0;
                                for (size_t pi = 0; pi < s.size(); ++pi) {
                                    const size_t row = size_t((first[size_t(t)] + int(pi)) * sh.n_kv_heads + kv_head);
                                    want += s[pi] / sum * fp16_to_fp32(v[row * hd + i]);
                                }
                                ASSERT_NEAR(alone[size_t(j) * hd + i], want, 1e-5 + 1e-5 * std::fabs(want));
                            }
                        }
                    }
                }
        }
    }
}

}  // namespace
}  // namespace tern
