// attention: cuda::attention (backend/cuda/ops.h) over the f16 KV cache, head
// dim 128, 32 query heads with 32 KV heads (Llama-2 7B) and with 8 (GQA, as
// Llama-3 8B), in the two regimes a forward pass has:
//   decode   one token at context 128, 1024 and 4096 (position ctx-1; the cache
//            holds exactly ctx positions), split-KV where attention_splits says;
//   prefill  512 and 2048 tokens of one sequence at positions 0..n-1 (causal).
// Validated first on a few (token, KV head) pairs against the CPU twin,
// backend::cpu::attention_kv_group: every output of the group within 2e-5 of
// the largest |output| of that group. Timed as the median of 25 launches that
// rotate over enough KV slots to span four times the L2 (the slot array picks
// the copy) and three q/out sets. TFLOPS counts 4*head_dim*n_pos per (token,
// head) (q.k and p.v, a multiply and an add each); GB/s counts K and V of every
// position read once plus q and out.
//   attention [--floors FILE] [--seed N] [--quick]
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/ops.h"
#include "base/fp16.h"
#include "sandbox.h"

using namespace tern;
using namespace tern::sandbox;

namespace {

constexpr int kHeadDim = 128;
constexpr int kSets = 3;          // q and out sets rotated in timing
constexpr int kMaxSlots = 1024;   // KV copies at most (small contexts need many to leave the L2)

struct Heads {
    int n_heads, n_kv_heads;
};

struct Case {
    const char* kind;  // "decode" or "prefill"
    int64_t n_tokens;
    int ctx;           // positions in the cache (= the last token's position + 1)
};

struct CaseResult {
    Timing t;
    bool valid = false;
    bool split = false;
    int slots = 0;
    double flops = 0, bytes = 0;
};

CaseResult run_case(const Heads& h, const Case& c, int64_t l2, uint64_t seed, cudaStream_t stream) {
    CaseResult res;
    const int group = h.n_heads / h.n_kv_heads;
    const size_t hd = kHeadDim;
    const size_t pos_stride = size_t(h.n_kv_heads) * hd;
    const size_t slot_stride = size_t(c.ctx) * pos_stride;  // halves per slot, K or V
    const size_t row = size_t(h.n_heads) * hd;              // q / out floats per token
    const float scale = 1.0f / std::sqrt(float(kHeadDim));
    if (!cuda::attention_supported(h.n_heads, h.n_kv_heads, kHeadDim)) fail("attention_supported refuses the shape");

    // Slot 0 on the host; every other slot is a device copy of it.
    std::vector<uint16_t> k(slot_stride), v(slot_stride);
    parallel_for(c.ctx, [&](int64_t p) {
        SplitMix g(seed, uint64_t(p));
        for (size_t i = 0; i < pos_stride; ++i) {
            k[size_t(p) * pos_stride + i] = fp32_to_fp16(g.normal());
            v[size_t(p) * pos_stride + i] = fp32_to_fp16(g.normal());
        }
    });
    const int64_t kv_bytes = int64_t(2 * slot_stride * sizeof(uint16_t));
    res.slots = rotation_sets(kv_bytes, l2, kSets, kMaxSlots);
    DevBuf<uint16_t> dk(size_t(res.slots) * slot_stride), dv(size_t(res.slots) * slot_stride);
    SB_CHECK(cudaMemcpy(dk.get(), k.data(), slot_stride * 2, cudaMemcpyHostToDevice));
    SB_CHECK(cudaMemcpy(dv.get(), v.data(), slot_stride * 2, cudaMemcpyHostToDevice));
    for (int s = 1; s < res.slots; ++s) {
        SB_CHECK(cudaMemcpyAsync(dk.get() + size_t(s) * slot_stride, dk.get(), slot_stride * 2,
                                 cudaMemcpyDeviceToDevice, stream));
        SB_CHECK(cudaMemcpyAsync(dv.get() + size_t(s) * slot_stride, dv.get(), slot_stride * 2,
                                 cudaMemcpyDeviceToDevice, stream));
    }
    // Each slot's pages in order (ctx is a multiple of the page size): the
    // paged cache laid out as one run of positions per slot.
    const int per_slot = c.ctx / backend::kKvPageSize;
    std::vector<int32_t> table(size_t(res.slots) * size_t(per_slot));
    for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
    DevBuf<int32_t> dtable(table);
    cuda::KvLayer layer;
    layer.k = dk.get();
    layer.v = dv.get();
    layer.pages = dtable.get();
    layer.n_slots = res.slots;
    layer.n_ctx = c.ctx;
    layer.n_kv_heads = h.n_kv_heads;
    layer.head_dim = kHeadDim;
    layer.page_size = backend::kKvPageSize;
    layer.pages_per_slot = per_slot;

    // Token t at position ctx - n_tokens + t: decode's one token at ctx-1,
    // prefill's tokens at 0..n-1. slots[s] holds n_tokens copies of s.
    std::vector<int32_t> pos(size_t(c.n_tokens));
    for (int64_t t = 0; t < c.n_tokens; ++t) pos[size_t(t)] = int32_t(c.ctx - c.n_tokens + t);
    DevBuf<int32_t> dpos(pos), dslots(size_t(res.slots) * size_t(c.n_tokens));
    {
        std::vector<int32_t> all(dslots.size());
        for (size_t i = 0; i < all.size(); ++i) all[i] = int32_t(i / size_t(c.n_tokens));
        dslots.upload(all);
    }
    std::vector<float> q(size_t(c.n_tokens) * row);
    parallel_for(c.n_tokens, [&](int64_t t) {
        SplitMix g(seed ^ 0x51ull, uint64_t(t));
        for (size_t i = 0; i < row; ++i) q[size_t(t) * row + i] = g.normal();
    });
    DevBuf<float> dq[kSets], dout[kSets];
    for (int s = 0; s < kSets; ++s) {
        dq[s] = DevBuf<float>(q);
        dout[s] = DevBuf<float>(q.size());
    }
    DevBuf<float> workspace(cuda::attention_workspace_bytes(c.n_tokens, h.n_heads, kHeadDim, c.ctx) / sizeof(float));
    // One decode token, or one sequence's prefill.
    const cuda::AttnBatch kind = c.n_tokens == 1 ? cuda::AttnBatch::Decode : cuda::AttnBatch::Prefill;
    res.split = workspace.size() > 0 && cuda::attention_splits(c.n_tokens, h.n_heads, kHeadDim, c.ctx, kind);

    // The launch the backend picks for this batch (attention_few_units: four-warp decode CTAs where it is few units).
    const bool few = cuda::attention_few_units(pos.data(), c.n_tokens, h.n_kv_heads, c.ctx);
    auto launch = [&](int slot, int s) {
        const int32_t* slot_of_tokens = dslots.get() + size_t(slot) * size_t(c.n_tokens);
        cuda::attention(layer, dq[s].get(), c.n_tokens, h.n_heads, scale, /*window=*/0, slot_of_tokens, dpos.get(), dout[s].get(),
                        workspace.get(), kind, stream, {}, few);
    };

    // Validation on the last KV copy: the first and last tokens, and a few
    // between, each with one KV head's group of query heads.
    dout[0].poison();
    launch(res.slots - 1, 0);
    SB_CHECK(cudaGetLastError());
    SB_CHECK(cudaStreamSynchronize(stream));
    res.valid = true;
    SplitMix g(seed ^ 0xA7ull, uint64_t(c.n_tokens * 7 + c.ctx));
    const int64_t tokens_checked[] = {0, c.n_tokens - 1, int64_t(g.next() % uint64_t(c.n_tokens)),
                                      int64_t(g.next() % uint64_t(c.n_tokens))};
    std::vector<float> want(size_t(group) * hd), got(want.size());
    for (int64_t t : tokens_checked) {
        const int kvh = int(g.next() % uint64_t(h.n_kv_heads));
        const size_t first = size_t(t) * row + size_t(kvh) * size_t(group) * hd;
        const backend::cpu::KvRows k_rows{k.data(), int64_t(pos_stride)}, v_rows{v.data(), int64_t(pos_stride)};
        backend::cpu::attention_kv_group(q.data() + first, group, k_rows, v_rows, 0, pos[size_t(t)] + 1, kvh, kHeadDim,
                                         scale, want.data());
        SB_CHECK(cudaMemcpy(got.data(), dout[0].get() + first, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
        float max_abs = 0.0f;
        for (float w : want) max_abs = std::max(max_abs, std::fabs(w));
        for (size_t i = 0; i < want.size(); ++i)
            if (!(std::fabs(got[i] - want[i]) <= 2e-5f * max_abs)) {
                std::printf("  MISMATCH heads %d/%d %s %" PRId64 " tokens ctx %d: token %" PRId64
                            " head %zu dim %zu: gpu %.9g cpu %.9g (tolerance %.3g)\n",
                            h.n_heads, h.n_kv_heads, c.kind, c.n_tokens, c.ctx, t,
                            size_t(kvh) * size_t(group) + i / hd, i % hd, double(got[i]), double(want[i]),
                            double(2e-5f * max_abs));
                res.valid = false;
                break;
            }
    }

    res.t = time_launches(stream, [&](int i) { launch(i % res.slots, i % kSets); });
    double pos_sum = 0;  // n_pos summed over tokens
    for (int32_t p : pos) pos_sum += double(p) + 1.0;
    res.flops = 4.0 * kHeadDim * pos_sum * h.n_heads;
    res.bytes = double(kv_bytes) + 2.0 * double(q.size()) * sizeof(float);
    return res;
}

}  // namespace

int main(int argc, char** argv) {
    std::string floors_path;
    uint64_t seed = 1;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--floors") floors_path = option_value(argc, argv, i);
        else if (a == "--seed") seed = std::strtoull(option_value(argc, argv, i).c_str(), nullptr, 10);
        else if (a == "--quick") quick = true;
        else {
            std::fprintf(stderr, "usage: attention [--floors FILE] [--seed N] [--quick]\n");
            return 2;
        }
    }
    const DeviceInfo dev = device_info();
    print_device(dev);
    const Floors floors = read_floors(floors_path);
    std::printf("floors: copy %.1f GB/s%s; seed %" PRIu64 "\n", floors.copy_GBps,
                floors_path.empty() ? " (none given: --floors FILE)" : "", seed);
    cudaStream_t stream;
    SB_CHECK(cudaStreamCreate(&stream));  // blocking: ordered with the synchronous copies and memsets

    const Heads heads[] = {{32, 32}, {32, 8}};
    std::vector<Case> cases = {{"decode", 1, 128}, {"decode", 1, 1024}, {"decode", 1, 4096},
                               {"prefill", 512, 512}, {"prefill", 2048, 2048}};
    if (quick) cases = {{"decode", 1, 1024}, {"prefill", 512, 512}};

    std::printf("\n%-6s %-8s %6s %6s %-6s %10s %8s %8s %7s %6s\n", "heads", "kind", "tokens", "ctx", "path", "us",
                "TFLOPS", "GB/s", "%copy", "slots");
    int failures = 0;
    for (const Heads& h : heads)
        for (const Case& c : cases) {
            const CaseResult r = run_case(h, c, dev.l2_bytes, seed, stream);
            failures += r.valid ? 0 : 1;
            const double s = r.t.median_us * 1e-6;
            const double gbps = r.bytes / s / 1e9;
            char hs[16];
            std::snprintf(hs, sizeof hs, "%d/%d", h.n_heads, h.n_kv_heads);
            std::printf("%-6s %-8s %6" PRId64 " %6d %-6s %10.2f %8.2f %8.1f %7s %6d%s%s\n", hs, c.kind, c.n_tokens,
                        c.ctx, r.split ? "split" : "direct", r.t.median_us, r.flops / s / 1e12, gbps,
                        percent(gbps, floors.copy_GBps).c_str(), r.slots, r.valid ? "" : "  INVALID",
                        r.t.held ? "" : "  (launches not all queued in time)");
        }
    if (failures) std::printf("\n%d cases differ from the CPU twin\n", failures);
    SB_CHECK(cudaStreamDestroy(stream));
    return failures ? 1 : 0;
}
