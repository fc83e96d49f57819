// matmul: the integer matmuls of the CUDA backend (backend/cuda/kernels.h) on
// the Llama-2 7B weight shapes, against their CPU twin and the measured floors.
//   quantize_act  f32 activations -> block_q8a planes (per row length and token count;
//                 quantize_act8: one scale per 256 elements, the K-quants' grouping)
//   mmvq          decode matmul, 1..8 tokens: weight-bandwidth bound (% of the copy floor)
//   mmqb          mmq_batch, the K-quants' decode-batch matmul, 1..64 tokens (% of the copy floor)
//   mmq           prefill matmul on int8 tensor cores (% of the int8 floor): on
//                 compute capability 9.0 the K-quants take the wgmma kernel
//   mmqs          the mma.sync kernel mmq falls back to, beside it where they differ
// Weights: random normals quantized by quant::quantize_row (q6_K also padded to
// 224-byte blocks on the device by cuda::pad_q6_K). Every launch configuration
// is validated before it is timed: 64 sampled (row, token) outputs must have
// the bits of quant::dot_row_chunked on the CPU's quant::quantize_act_row
// (K-quants: quantize_act_row_grouped) blocks, which the device's quantize_act
// must reproduce byte for byte.
// Timing: median of 25 launches, rotating over enough weight copies to span
// four times the L2 (and three activation/output sets), so weights come from
// memory as they do in a forward pass. GB/s counts the bytes that must move:
// weights once, quantized activations, f32 outputs. TOPS = 2*rows*cols*tokens/time.
// Last per shape: the crossover, the fewest tokens at which mmq beats mmvq,
// and for the K-quants the same of mmq_batch against mmvq.
//   matmul [--type q4_K,q6_K,q6_K_pad,q8_0,q4_0,q5_K] [--tokens 1,2,4,8,16,...]
//          [--floors FILE] [--seed N] [--quick]
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <strings.h>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "quant/act_quant.h"
#include "quant/dot.h"
#include "quant/quant.h"
#include "sandbox.h"

using namespace tern;
using namespace tern::sandbox;
using cuda::WType;

namespace {

struct TypeCase {
    const char* name;
    WType type;
    bool padded;  // q6_K in 224-byte blocks
};
const TypeCase kTypes[] = {{"q4_K", WType::Q4_K, false}, {"q6_K", WType::Q6_K, false},
                           {"q6_K_pad", WType::Q6_K, true}, {"q8_0", WType::Q8_0, false},
                           {"q4_0", WType::Q4_0, false},    {"q5_K", WType::Q5_K, false}};

struct MatShape {
    const char* name;
    int64_t rows, cols;
};
const MatShape kShapes[] = {
    {"q/k/v/o", 4096, 4096}, {"gate/up", 11008, 4096}, {"down", 4096, 11008}, {"output", 32000, 4096}};

constexpr int kActSets = 3;   // activation and output sets rotated in timing
constexpr int kSamples = 64;  // (row, token) outputs checked per launch configuration
constexpr uint32_t kPoison = 0xFFFFFFFFu;

TensorType tensor_type(WType t) { return TensorType(uint32_t(t)); }

uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// ---- activations: one set per row length --------------------------------------------

struct Acts {
    int64_t cols = 0, n_tokens = 0;
    int group = 1;                        // blocks per scale: cuda::act_group of the weight type
    std::vector<quant::block_q8a> host;  // token t at host[t * cols/32]
    DevBuf<float> x[kActSets];
    DevBuf<int8_t> qs[kActSets];
    DevBuf<float> d[kActSets];
    DevBuf<int32_t> sum[kActSets];
    DevBuf<uint16_t> sum_split[kActSets];  // group 8
    cuda::DevAct view(int s) const {
        return {qs[s].get(), d[s].get(), sum[s].get(), cols / 32, group, group == 8 ? sum_split[s].get() : nullptr};
    }
};

// Random normal activations, quantized on the CPU and by cuda::quantize_act
// into each set with one scale per `group` blocks; every set must hold the
// CPU's bytes.
void make_acts(Acts& a, int64_t cols, int group, int64_t n_tokens, uint64_t seed, cudaStream_t stream) {
    a.cols = cols;
    a.group = group;
    a.n_tokens = n_tokens;
    const int64_t blocks = cols / 32;
    std::vector<float> x(size_t(n_tokens * cols));
    a.host.resize(size_t(n_tokens * blocks));
    parallel_for(n_tokens, [&](int64_t t) {
        SplitMix g(seed, uint64_t(cols) << 32 | uint64_t(t));
        float* row = x.data() + t * cols;
        for (int64_t i = 0; i < cols; ++i) row[i] = g.normal();
        if (group == 8)
            quant::quantize_act_row_grouped(row, a.host.data() + t * blocks, cols);
        else
            quant::quantize_act_row(row, a.host.data() + t * blocks, cols);
    });
    const size_t nb = size_t(n_tokens * blocks);
    std::vector<int8_t> qs(nb * 32);
    std::vector<float> d(nb);
    std::vector<int32_t> sum(nb);
    // The split sums (group 8 only: quantize_act writes them for the K-quants).
    const int64_t split_row = quant::split_sum_count(blocks);
    std::vector<uint16_t> split, want_split;
    if (group == 8) {
        split.resize(size_t(n_tokens * split_row));
        want_split.resize(split.size());
        for (int64_t t = 0; t < n_tokens; ++t)
            quant::split_block_sums(a.host.data() + t * blocks, blocks, want_split.data() + t * split_row);
    }
    for (int s = 0; s < kActSets; ++s) {
        a.x[s] = DevBuf<float>(x);
        a.qs[s] = DevBuf<int8_t>(nb * 32);
        a.d[s] = DevBuf<float>(nb);
        a.sum[s] = DevBuf<int32_t>(nb);
        a.sum_split[s] = DevBuf<uint16_t>(split.size());
        a.qs[s].poison();
        a.d[s].poison();
        a.sum[s].poison();
        a.sum_split[s].poison();
        cuda::quantize_act(a.x[s].get(), cols, n_tokens, cols, a.view(s), stream);
        SB_CHECK(cudaGetLastError());
        SB_CHECK(cudaStreamSynchronize(stream));
        SB_CHECK(cudaMemcpy(qs.data(), a.qs[s].get(), qs.size(), cudaMemcpyDeviceToHost));
        SB_CHECK(cudaMemcpy(d.data(), a.d[s].get(), nb * 4, cudaMemcpyDeviceToHost));
        SB_CHECK(cudaMemcpy(sum.data(), a.sum[s].get(), nb * 4, cudaMemcpyDeviceToHost));
        if (group == 8) {
            SB_CHECK(cudaMemcpy(split.data(), a.sum_split[s].get(), split.size() * 2, cudaMemcpyDeviceToHost));
            if (split != want_split)
                fail("quantize_act: the split sums (cols " + std::to_string(cols) + ") differ from the CPU's");
        }
        for (size_t b = 0; b < nb; ++b) {
            const quant::block_q8a& w = a.host[b];
            if (bits(d[b]) != bits(w.d) || sum[b] != w.sum || std::memcmp(qs.data() + 32 * b, w.qs, 32) != 0)
                fail("quantize_act: block " + std::to_string(b % size_t(blocks)) + " of token " +
                     std::to_string(b / size_t(blocks)) + " (cols " + std::to_string(cols) +
                     ", group " + std::to_string(group) + ") differs from the CPU's");
        }
    }
}

// ---- weights ------------------------------------------------------------------------

// The largest matrix of one type and row length, as quantize_row writes it;
// every shape with that row length uses its first rows.
struct HostWeights {
    int64_t rows = 0, cols = 0;
    size_t row_bytes = 0;
    std::vector<uint8_t> bytes;
    DevBuf<uint8_t> dev;  // the same bytes on the device (the source of every copy)
    const uint8_t* row(int64_t r) const { return bytes.data() + size_t(r) * row_bytes; }
};

void make_weights(HostWeights& w, WType type, int64_t rows, int64_t cols, uint64_t seed) {
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = quant::row_bytes(tensor_type(type), cols);
    w.bytes.assign(size_t(rows) * w.row_bytes, 0);
    std::atomic<bool> ok{true};
    parallel_for(rows, [&](int64_t r) {
        SplitMix g(seed ^ uint64_t(type) << 40, uint64_t(cols) << 32 | uint64_t(r));
        std::vector<float> x(static_cast<size_t>(cols));
        for (float& v : x) v = g.normal();
        if (!quant::quantize_row(tensor_type(type), x.data(), w.bytes.data() + size_t(r) * w.row_bytes, cols).ok())
            ok = false;
    });
    if (!ok) fail("quant::quantize_row failed for cols " + std::to_string(cols));
    w.dev = DevBuf<uint8_t>(w.bytes);
}

// n_sets copies of the first `rows` rows, each 256-byte aligned, in the
// layout the case asks for.
struct WeightSets {
    DevBuf<uint8_t> mem;
    std::vector<cuda::DevWeight> views;
    int64_t bytes = 0;  // one copy
};

void make_weight_sets(WeightSets& ws, const TypeCase& tc, const HostWeights& w, int64_t rows, int64_t l2,
                      cudaStream_t stream) {
    const int64_t blocks = w.cols / int(tensor_type_info(uint32_t(tc.type))->block_elems);
    const int block_stride = tc.padded ? 224 : int(tensor_type_info(uint32_t(tc.type))->block_bytes);
    const int64_t row_stride = blocks * block_stride;
    ws.bytes = rows * row_stride;
    const int64_t set_stride = (ws.bytes + 255) / 256 * 256;
    const int n_sets = rotation_sets(ws.bytes, l2);
    ws.mem = DevBuf<uint8_t>(size_t(n_sets * set_stride));
    ws.views.clear();
    for (int s = 0; s < n_sets; ++s) {
        uint8_t* at = ws.mem.get() + s * set_stride;
        if (tc.padded)
            cuda::pad_q6_K(w.dev.get(), at, rows * blocks, stream);
        else
            SB_CHECK(cudaMemcpyAsync(at, w.dev.get(), size_t(ws.bytes), cudaMemcpyDeviceToDevice, stream));
        ws.views.push_back({tc.type, rows, w.cols, at, block_stride, row_stride});
    }
    SB_CHECK(cudaGetLastError());
    SB_CHECK(cudaStreamSynchronize(stream));
}

// ---- one shape ------------------------------------------------------------------------

enum class Op { mmvq, mmq, mmqb, mmqs };
const char* op_name(Op op) {
    return op == Op::mmvq ? "mmvq" : op == Op::mmq ? "mmq" : op == Op::mmqb ? "mmqb" : "mmqs";
}

struct Bench {
    const TypeCase& tc;
    const MatShape& shape;
    const HostWeights& w;
    const WeightSets& ws;
    const Acts& acts;
    DevBuf<float>* y;  // kActSets outputs of acts.n_tokens x rows
    cudaStream_t stream;
    uint64_t seed;
    int failures = 0;
    std::map<std::pair<int, int64_t>, Timing> timed{};  // by (op, tokens)

    void launch(Op op, int64_t n, size_t weight_set, int s) {
        const cuda::DevWeight& wv = ws.views[weight_set];
        if (op == Op::mmvq)
            cuda::mmvq(wv, acts.view(s), int(n), y[s].get(), shape.rows, stream);
        else if (op == Op::mmqb)
            cuda::mmq_batch(wv, acts.view(s), int(n), y[s].get(), shape.rows, stream);
        else if (op == Op::mmqs)
            cuda::mmq_mma_sync(wv, acts.view(s), n, y[s].get(), shape.rows, stream);
        else
            cuda::mmq(wv, acts.view(s), n, y[s].get(), shape.rows, stream);
    }

    // One launch (on the last weight copy, so the copies are checked too) into
    // a poisoned output; kSamples outputs against the CPU twin, and one element
    // of the token after the last that must keep its poison.
    bool validate(Op op, int64_t n) {
        y[0].poison();
        launch(op, n, ws.views.size() - 1, 0);
        SB_CHECK(cudaGetLastError());
        SB_CHECK(cudaStreamSynchronize(stream));
        SplitMix g(seed, uint64_t(n) * 2 + uint64_t(op));
        const int64_t blocks = shape.cols / 32;
        for (int i = 0; i < kSamples; ++i) {
            const int64_t r = int64_t(g.next() % uint64_t(shape.rows));
            const int64_t t = int64_t(g.next() % uint64_t(n));
            const float want = quant::dot_row_chunked(tensor_type(tc.type), w.row(r), acts.host.data() + t * blocks,
                                                      shape.cols);
            const float got = read_one(y[0].get() + t * shape.rows + r);
            if (bits(got) != bits(want)) {
                std::printf("  MISMATCH %s %s %s %" PRId64 " tokens: row %" PRId64 " token %" PRId64
                            ": gpu %.9g (0x%08x), cpu %.9g (0x%08x)\n",
                            tc.name, shape.name, op_name(op), n, r, t, double(got), bits(got),
                            double(want), bits(want));
                return false;
            }
        }
        if (n < acts.n_tokens) {
            const int64_t r = int64_t(g.next() % uint64_t(shape.rows));
            if (bits(read_one(y[0].get() + n * shape.rows + r)) != kPoison) {
                std::printf("  MISMATCH %s %s: token %" PRId64 " (past the last) was written\n", tc.name,
                            shape.name, n);
                return false;
            }
        }
        return true;
    }

    // Validated and timed once per (op, n); later calls reuse the result.
    const Timing& measure(Op op, int64_t n) {
        const auto key = std::make_pair(int(op), n);
        auto it = timed.find(key);
        if (it != timed.end()) return it->second;
        Timing t;
        if (validate(op, n)) {
            t = time_launches(stream, [&](int i) { launch(op, n, size_t(i) % ws.views.size(), i % kActSets); });
        } else {
            ++failures;
            t.median_us = -1.0;
        }
        return timed[key] = t;
    }
};

void print_header() {
    std::printf("%-9s %-8s %12s %-5s %5s %10s %8s %7s %8s %7s %6s\n", "type", "shape", "rows x cols", "op", "tok", "us",
                "GB/s", "TOPS", "%floor", "sets", "%bf16");
}

void print_row(const char* type, const char* shape, int64_t rows, int64_t cols, const char* op, int64_t n,
               const Timing& t, double bytes, double floor, int sets, double floor16 = 0.0) {
    char dims[32];
    std::snprintf(dims, sizeof dims, "%" PRId64 "x%" PRId64, rows, cols);
    if (t.median_us < 0) {
        std::printf("%-9s %-8s %12s %-5s %5" PRId64 "    INVALID (output differs from the CPU twin)\n", type, shape,
                    dims, op, n);
        return;
    }
    const double s = t.median_us * 1e-6;
    const double gbps = bytes / s / 1e9, tops = 2.0 * double(rows) * double(cols) * double(n) / s / 1e12;
    const bool is_mmq = std::strcmp(op, "mmq") == 0 || std::strcmp(op, "mmqs") == 0;
    std::printf("%-9s %-8s %12s %-5s %5" PRId64 " %10.2f %8.1f %7.2f %8s %7d %6s%s\n", type, shape, dims, op, n,
                t.median_us, gbps, tops, percent(is_mmq ? tops : gbps, floor).c_str(), sets,
                is_mmq ? percent(tops, floor16).c_str() : "", t.held ? "" : "  (launches not all queued in time)");
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> type_names;
    std::vector<int64_t> tokens;
    std::string floors_path;
    uint64_t seed = 1;
    bool quick = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--type") type_names = split_list(option_value(argc, argv, i));
        else if (a == "--tokens") tokens = parse_counts(option_value(argc, argv, i), "--tokens");
        else if (a == "--floors") floors_path = option_value(argc, argv, i);
        else if (a == "--seed") seed = std::strtoull(option_value(argc, argv, i).c_str(), nullptr, 10);
        else if (a == "--quick") quick = true;
        else {
            std::fprintf(stderr,
                         "usage: matmul [--type q4_K,q6_K,q6_K_pad,q8_0,q4_0,q5_K] [--tokens 1,8,512] "
                         "[--floors FILE] [--seed N] [--quick]\n");
            return 2;
        }
    }
    std::vector<TypeCase> types;
    if (type_names.empty()) types.assign(std::begin(kTypes), std::end(kTypes));
    for (const std::string& name : type_names) {
        const TypeCase* found = nullptr;
        for (const TypeCase& tc : kTypes)
            if (strcasecmp(tc.name, name.c_str()) == 0) found = &tc;
        if (!found) fail("--type: unknown type " + name + " (q4_K q6_K q6_K_pad q8_0 q4_0 q5_K)");
        types.push_back(*found);
    }
    // --quick: the two shapes of row length 4096 that fit one small weight
    // matrix, fewer token counts; the same checks and timing.
    std::vector<MatShape> shapes(std::begin(kShapes), std::end(kShapes));
    if (quick) shapes = {kShapes[0], kShapes[1]};
    std::vector<int64_t> mmvq_tokens{1, 2, 4, 8}, mmqb_tokens{1, 2, 4, 8, 16, 32, 64},
        mmq_tokens{8, 16, 64, 512, 2048};
    if (quick) {
        mmvq_tokens = {1, 8};
        mmqb_tokens = {8, 64};
        mmq_tokens = {16, 512};
    }
    if (!tokens.empty()) {
        mmvq_tokens.clear();
        mmqb_tokens.clear();
        for (int64_t n : tokens) {
            if (n <= cuda::kMmvqMaxTokens) mmvq_tokens.push_back(n);
            if (n <= cuda::kMmqBatchMaxTokens) mmqb_tokens.push_back(n);
        }
        mmq_tokens = tokens;
    }

    const DeviceInfo dev = device_info();
    print_device(dev);
    const Floors floors = read_floors(floors_path);
    std::printf("floors: copy %.1f GB/s, int8 %.1f TOPS%s; seed %" PRIu64 "\n", floors.copy_GBps, floors.int8_TOPS,
                floors_path.empty() ? " (none given: --floors FILE)" : "", seed);
    cudaStream_t stream;
    SB_CHECK(cudaStreamCreate(&stream));  // blocking: ordered with the synchronous copies and memsets

    // Activations per row length, enough tokens for the largest call.
    int64_t n_max = cuda::kMmvqMaxTokens;
    for (int64_t n : mmq_tokens) n_max = std::max(n_max, n);
    std::map<int64_t, int64_t> max_rows;  // per row length
    for (const MatShape& s : shapes) max_rows[s.cols] = std::max(max_rows[s.cols], s.rows);
    std::map<std::pair<int64_t, int>, Acts> acts;  // per row length and group
    for (const auto& [cols, rows] : max_rows)
        for (const TypeCase& tc : types) {
            Acts& a = acts[{cols, cuda::act_group(tc.type)}];
            if (a.cols == 0) make_acts(a, cols, cuda::act_group(tc.type), n_max, seed, stream);
        }

    // quantize_act: f32 read, block_q8a planes written (40 bytes per 32 elements).
    std::printf("\n%-13s %6s %5s %10s %8s %8s %5s\n", "op", "cols", "tok", "us", "GB/s", "%copy", "sets");
    std::vector<int64_t> act_tokens = mmvq_tokens;
    act_tokens.insert(act_tokens.end(), mmq_tokens.begin(), mmq_tokens.end());
    std::sort(act_tokens.begin(), act_tokens.end());
    act_tokens.erase(std::unique(act_tokens.begin(), act_tokens.end()), act_tokens.end());
    for (auto& [key, a] : acts)
        for (int64_t n : act_tokens) {
            Acts& aa = a;
            const int64_t c = key.first;
            const Timing t = time_launches(stream, [&](int i) {
                const int s = i % kActSets;
                cuda::quantize_act(aa.x[s].get(), c, n, c, aa.view(s), stream);
            });
            const double bytes = double(n) * double(c) * 4.0 + double(n) * double(c / 32) * 40.0;
            const double gbps = bytes / (t.median_us * 1e-6) / 1e9;
            std::printf("%-13s %6" PRId64 " %5" PRId64 " %10.2f %8.1f %8s %5d%s\n",
                        key.second == 8 ? "quantize_act8" : "quantize_act", c, n, t.median_us,
                        gbps, percent(gbps, floors.copy_GBps).c_str(), kActSets,
                        t.held ? "" : "  (launches not all queued in time)");
        }

    std::printf("\n%%floor: mmvq and mmqb against the copy floor (GB/s), mmq and mmqs against the int8 floor "
                "(TOPS); %%bf16: mmq and mmqs against the 16-bit float tensor rate; sets: weight copies rotated\n");
    print_header();
    int failures = 0;
    std::vector<std::string> crossovers;
    std::map<int64_t, HostWeights> weights;  // per row length, of weights_type
    const TypeCase* weights_type = nullptr;
    for (const TypeCase& tc : types) {
        // q6_K and q6_K_pad side by side share their weights: quantized once.
        if (!weights_type || weights_type->type != tc.type) {
            weights.clear();
            for (const auto& [cols, rows] : max_rows) make_weights(weights[cols], tc.type, rows, cols, seed);
        }
        weights_type = &tc;
        for (const MatShape& shape : shapes) {
            const HostWeights& w = weights.at(shape.cols);
            WeightSets ws;
            make_weight_sets(ws, tc, w, shape.rows, dev.l2_bytes, stream);
            DevBuf<float> y[kActSets];
            for (DevBuf<float>& b : y) b = DevBuf<float>(size_t(n_max * shape.rows));
            Bench b{tc, shape, w, ws, acts.at({shape.cols, cuda::act_group(tc.type)}), y, stream, seed ^ uint64_t(shape.rows * 131 + shape.cols)};
            const int sets = int(ws.views.size());
            auto row = [&](Op op, int64_t n) {
                const Timing& t = b.measure(op, n);
                const double bytes = double(ws.bytes) + double(n) * double(shape.cols / 32) * 40.0 +
                                     double(n) * double(shape.rows) * 4.0;
                const bool tensor = op == Op::mmq || op == Op::mmqs;
                print_row(tc.name, shape.name, shape.rows, shape.cols, op_name(op), n, t, bytes,
                          tensor ? floors.int8_TOPS : floors.copy_GBps, sets, tensor ? floors.bf16_TFLOPS : 0.0);
            };
            const bool batch = cuda::mmq_batch_type(tc.type);
            for (int64_t n : mmvq_tokens) row(Op::mmvq, n);
            if (batch)
                for (int64_t n : mmqb_tokens) row(Op::mmqb, n);
            for (int64_t n : mmq_tokens) {
                row(Op::mmq, n);
                if (cuda::mmq_wgmma_runs(ws.views[0], acts.at({shape.cols, cuda::act_group(tc.type)}).view(0), n))
                    row(Op::mmqs, n);
            }

            // Crossovers: each kernel against mmvq at 1..8 tokens.
            auto crossover = [&](Op other) {
                const std::string name = op_name(other);
                int64_t cross = 0;
                std::string sweep;
                for (int64_t n = 1; n <= cuda::kMmvqMaxTokens; ++n) {
                    const double v = b.measure(Op::mmvq, n).median_us, q = b.measure(other, n).median_us;
                    char buf[48];
                    std::snprintf(buf, sizeof buf, " %" PRId64 ":%.1f/%.1f", n, v, q);
                    sweep += buf;
                    if (cross == 0 && v > 0 && q > 0 && q < v) cross = n;
                }
                crossovers.push_back(std::string(tc.name) + " " + shape.name + ": " +
                                     (cross ? name + " faster from " + std::to_string(cross) + " tokens"
                                            : "mmvq faster through " + std::to_string(cuda::kMmvqMaxTokens) +
                                                  " tokens") +
                                     "  [tok:mmvq/" + name + " us" + sweep + "]");
            };
            crossover(Op::mmq);
            if (batch) crossover(Op::mmqb);
            failures += b.failures;
        }
    }
    std::printf("\ncrossovers (mmq or mmqb beats mmvq)\n");
    for (const std::string& l : crossovers) std::printf("  %s\n", l.c_str());
    if (failures) std::printf("\n%d launch configurations differ from the CPU twin\n", failures);
    SB_CHECK(cudaStreamDestroy(stream));
    return failures ? 1 : 0;
}
