// `tern quantize IN OUT TYPE`: rewrites a GGUF model with the weights in a
// smaller type, choosing each tensor's type by the mix of the file type
// (src/quant/mix). Metadata is copied, tensors are converted one at a time by
// all threads and streamed to the output, so memory stays at one tensor.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <omp.h>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf.h"
#include "quant/mix.h"
#include "quant/quant.h"
#include "tools/commands.h"
#include "tools/fail.h"
#include "tools/progress.h"

namespace tern::tools {
namespace {

struct QuantizeOptions {
    std::string input, output, type;
    int threads = 0;
    bool allow_requantize = false;
};

struct TensorPlan {
    const gguf::TensorInfo* source;
    TensorType type;  // in the output
    bool convert() const { return type != source->type(); }
};

bool is_float_type(TensorType t) {
    return t == TensorType::F32 || t == TensorType::F16 || t == TensorType::BF16;
}

std::string join(const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
    return out;
}

// The model-wide facts the mix depends on, read from metadata with the tensor
// names as a fallback for the layer count.
quant::MixModel mix_model_of(const gguf::File& f, quant::FileType ftype) {
    quant::MixModel m;
    m.ftype = ftype;
    m.arch = f.get_string("general.architecture").value_or("");
    int max_layer = -1;
    for (const gguf::TensorInfo& t : f.tensors())
        max_layer = std::max(max_layer, quant::layer_index_from_name(t.name));
    const auto blocks = f.get_int(m.arch + ".block_count");
    m.n_layers = (blocks && *blocks > 0 && *blocks <= 1 << 20) ? int(*blocks) : max_layer + 1;
    auto small_int = [&](const std::string& key) {
        const auto v = f.get_int(key);
        return (v && *v > 0 && *v <= 1 << 20) ? int(*v) : 0;
    };
    m.n_head = small_int(m.arch + ".attention.head_count");
    m.n_head_kv = small_int(m.arch + ".attention.head_count_kv");
    if (m.n_head_kv == 0) m.n_head_kv = m.n_head;
    m.has_output = f.find_tensor("output.weight") != nullptr;
    m.n_expert = small_int(m.arch + ".expert_count");
    return m;
}

// Converts one tensor into `out` with all threads: each row is expanded to
// floats and quantized to the output type.
Status convert_tensor(const TensorPlan& p, int n_threads, uint8_t* out, ProgressBar& bar,
                      std::atomic<uint64_t>& done) {
    const gguf::TensorInfo& t = *p.source;
    const int64_t len = t.ne[0];
    const int64_t rows = len > 0 ? t.n_elements / len : 0;
    const TensorType src_type = t.type();
    const size_t src_row = quant::row_bytes(src_type, len);
    const size_t dst_row = quant::row_bytes(p.type, len);
    if (src_row == 0 || dst_row == 0)
        return Error{"tensor '" + t.name + "': cannot convert rows of " + std::to_string(len) + " from " +
                     tensor_type_name(t.type_id) + " to " + tensor_type_name(uint32_t(p.type))};
    const int64_t rows_per_chunk = std::max<int64_t>(1, 32768 / len);
    std::atomic<bool> failed{false};
    std::string failure;
    std::mutex failure_mutex;
#pragma omp parallel num_threads(n_threads)
    {
        std::vector<float> row(static_cast<size_t>(len));
#pragma omp for schedule(dynamic, rows_per_chunk)
        for (int64_t r = 0; r < rows; ++r) {
            if (failed.load(std::memory_order_relaxed)) continue;
            Status st = quant::dequantize_row(src_type, t.data + size_t(r) * src_row, row.data(), len);
            if (st) st = quant::quantize_row(p.type, row.data(), out + size_t(r) * dst_row, len);
            if (!st) {
                std::lock_guard<std::mutex> lock(failure_mutex);
                if (!failed.exchange(true)) failure = "tensor '" + t.name + "': " + st.message();
                continue;
            }
            // Rows are small; report progress once per chunk's worth of rows.
            if ((r + 1) % rows_per_chunk == 0 || r + 1 == rows) {
                const uint64_t n = uint64_t(r % rows_per_chunk + 1) * src_row;
                bar.update(done.fetch_add(n) + n);
            }
        }
    }
    if (failed.load()) return Error{failure};
    return {};
}

void run_quantize(const QuantizeOptions& opt) {
    const auto ftype = quant::file_type_from_name(opt.type);
    if (!ftype)
        fail("quantize", "unknown type '" + opt.type + "' (choose one of: " +
                             join(quant::writable_file_type_names()) + ")");
    if (opt.threads < 0) fail("quantize", "--threads must be positive");
    const int n_threads =
        opt.threads > 0 ? opt.threads : std::max(1, int(std::thread::hardware_concurrency()));
    std::error_code ec;
    if (std::filesystem::equivalent(opt.input, opt.output, ec))
        fail("quantize", "output " + opt.output + " is the input file; choose another path");

    auto opened = gguf::File::open(opt.input);
    if (!opened) fail("quantize", opened.error().message);
    const gguf::File& f = **opened;
    const quant::MixModel mix = mix_model_of(f, *ftype);

    // Decide every tensor's type, and refuse, before writing anything.
    std::vector<TensorPlan> plan;
    uint64_t total_bytes = 0;
    for (const gguf::TensorInfo& t : f.tensors()) {
        TensorPlan p{&t, quant::choose_tensor_type(mix, t.name, t.ne, int(t.n_dims), t.type())};
        if (p.convert()) {
            if (!tensor_type_supported(t.type_id))
                fail("quantize", "tensor '" + t.name + "' has type " + tensor_type_name(t.type_id) +
                                     ", which tern cannot read");
            if (!is_float_type(t.type()) && !opt.allow_requantize)
                fail("quantize", "tensor '" + t.name + "' is already quantized (" +
                                     tensor_type_name(t.type_id) +
                                     "); quantizing it again loses accuracy, pass --allow-requantize "
                                     "to do it anyway");
        }
        total_bytes += t.n_bytes;
        plan.push_back(p);
    }

    gguf::Writer w(f.alignment());
    for (const gguf::KeyValue& kv : f.metadata()) {
        // The output is one file; the writer records its own alignment.
        if (kv.key.rfind("split.", 0) == 0 || kv.key == "general.alignment") continue;
        w.set(kv.key, kv.value);
    }
    w.set_u32("general.file_type", uint32_t(*ftype));
    w.set_u32("general.quantization_version", 2);
    for (const TensorPlan& p : plan) {
        const gguf::TensorInfo& t = *p.source;
        Status st = w.add_tensor(t.name, p.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims));
        if (!st) fail("quantize", st.message());
    }

    const auto start = std::chrono::steady_clock::now();
    if (Status st = w.begin(opt.output); !st) fail("quantize", st.message());
    ProgressBar bar("quantize", total_bytes);
    std::atomic<uint64_t> done{0};
    std::vector<uint8_t> buffer;
    std::map<uint32_t, uint64_t> type_counts;
    size_t n_converted = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
        const TensorPlan& p = plan[i];
        const size_t out_bytes = size_t(w.tensors()[i].n_bytes);
        Status st;
        if (!p.convert()) {
            st = w.write_tensor_data(p.source->data, out_bytes);
            bar.update(done.fetch_add(p.source->n_bytes) + p.source->n_bytes);
        } else {
            buffer.resize(out_bytes);
            st = convert_tensor(p, n_threads, buffer.data(), bar, done);
            if (st) st = w.write_tensor_data(buffer.data(), out_bytes);
            ++n_converted;
        }
        if (!st) fail("quantize", st.message());  // the writer removes the partial file
        ++type_counts[uint32_t(p.type)];
    }
    if (Status st = w.finish(); !st) fail("quantize", st.message());
    bar.finish();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    const uint64_t out_size = std::filesystem::file_size(opt.output, ec);
    std::string types;
    for (const auto& [type, n] : type_counts)
        types += (types.empty() ? "" : ", ") + tensor_type_name(type) + " " + std::to_string(n);
    std::printf("quantized %s -> %s as %s\n", opt.input.c_str(), opt.output.c_str(),
                quant::file_type_name(uint32_t(*ftype)).value_or("?").c_str());
    std::printf("  tensors: %zu (%zu converted): %s\n", plan.size(), n_converted, types.c_str());
    std::printf("  size:    %s -> %s (%.1f%%)\n", format_bytes(f.file_size()).c_str(),
                format_bytes(out_size).c_str(),
                f.file_size() ? 100.0 * double(out_size) / double(f.file_size()) : 0.0);
    std::printf("  time:    %.2f s with %d threads\n", seconds, n_threads);
}

}  // namespace

void add_quantize_command(CLI::App& app) {
    auto opt = std::make_shared<QuantizeOptions>();
    CLI::App* cmd = app.add_subcommand("quantize", "Write a GGUF model with its weights quantized");
    cmd->add_option("input", opt->input, "GGUF model to read (F32/F16/BF16 weights)")->required();
    cmd->add_option("output", opt->output, "GGUF file to write")->required();
    cmd->add_option("type", opt->type,
                    "File type: " + join(quant::writable_file_type_names()) + " (case-insensitive)")
        ->required();
    cmd->add_option("-t,--threads", opt->threads, "Worker threads (default: all hardware threads)");
    cmd->add_flag("--allow-requantize", opt->allow_requantize,
                  "Accept input tensors that are already quantized (loses accuracy)");
    cmd->callback([opt] { run_quantize(*opt); });
}

}  // namespace tern::tools
