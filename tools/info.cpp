// `tern info FILE`: what a GGUF file holds — architecture, size, file type,
// hyperparameters, tokenizer, every tensor and the bytes per tensor type — as
// text or (--json) as one JSON object for scripts and tests. The file goes
// through the validating reader, so a damaged file yields a message, not a crash.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "quant/mix.h"
#include "tools/commands.h"
#include "tools/fail.h"
#include "tools/progress.h"

namespace tern::tools {
namespace {

using nlohmann::ordered_json;

struct InfoOptions {
    std::string path;
    bool json = false;
    bool metadata = false;
};

// Hyperparameters shown first, in this order, when present under "<arch>.".
constexpr const char* kKnownHparams[] = {
    "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "rope.freq_base", "rope.dimension_count",
    "attention.layer_norm_rms_epsilon", "vocab_size",
};

constexpr size_t kJsonArrayItems = 8;  // long arrays (vocabularies) are summarized

ordered_json value_to_json(const gguf::Value& v) {
    using gguf::ValueType;
    switch (v.type) {
        case ValueType::BOOL: return v.u != 0;
        case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64: return v.u;
        case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64: return v.i;
        case ValueType::F32: return double(float(v.f));
        case ValueType::F64: return v.f;
        case ValueType::STRING: return v.str;
        case ValueType::ARRAY: {
            ordered_json items = ordered_json::array();
            for (size_t k = 0; k < v.items.size() && k < kJsonArrayItems; ++k)
                items.push_back(value_to_json(v.items[k]));
            if (v.items.size() <= kJsonArrayItems) return items;
            return {{"type", "array"}, {"elem_type", gguf::value_type_name(v.elem_type)},
                    {"length", v.items.size()}, {"head", items}};
        }
    }
    return nullptr;
}

struct TypeTotal {
    uint64_t count = 0;
    uint64_t bytes = 0;
};

// Everything `info` reports, gathered once and printed as text or JSON.
struct Summary {
    std::string arch, name;
    uint64_t n_params = 0;
    uint64_t tensor_bytes = 0;
    std::optional<int64_t> file_type;
    std::vector<std::pair<std::string, const gguf::Value*>> hparams;  // key without "<arch>."
    std::string tok_model, tok_pre;
    std::optional<uint64_t> n_tokens, n_merges;
    std::optional<int64_t> bos, eos;
    bool chat_template = false;
    std::map<uint32_t, TypeTotal> totals;  // by type id
};

std::optional<uint64_t> array_length(const gguf::File& f, std::string_view key) {
    const gguf::Value* v = f.find(key);
    if (!v || v->type != gguf::ValueType::ARRAY) return std::nullopt;
    return v->items.size();
}

Summary summarize(const gguf::File& f) {
    Summary s;
    s.arch = f.get_string("general.architecture").value_or("");
    s.name = f.get_string("general.name").value_or("");
    s.file_type = f.get_int("general.file_type");
    if (!s.arch.empty()) {
        const std::string prefix = s.arch + ".";
        for (const char* key : kKnownHparams)
            if (const gguf::Value* v = f.find(prefix + key)) s.hparams.emplace_back(key, v);
        for (const gguf::KeyValue& kv : f.metadata()) {
            if (kv.key.rfind(prefix, 0) != 0) continue;
            const std::string rest = kv.key.substr(prefix.size());
            bool known = false;
            for (const char* key : kKnownHparams) known = known || rest == key;
            if (!known) s.hparams.emplace_back(rest, &kv.value);
        }
    }
    s.tok_model = f.get_string("tokenizer.ggml.model").value_or("");
    s.tok_pre = f.get_string("tokenizer.ggml.pre").value_or("");
    s.n_tokens = array_length(f, "tokenizer.ggml.tokens");
    s.n_merges = array_length(f, "tokenizer.ggml.merges");
    s.bos = f.get_int("tokenizer.ggml.bos_token_id");
    s.eos = f.get_int("tokenizer.ggml.eos_token_id");
    s.chat_template = f.find("tokenizer.chat_template") != nullptr;
    for (const gguf::TensorInfo& t : f.tensors()) {
        s.n_params += uint64_t(t.n_elements);
        s.tensor_bytes += t.n_bytes;
        TypeTotal& tt = s.totals[t.type_id];
        ++tt.count;
        tt.bytes += t.n_bytes;
    }
    return s;
}

std::string file_type_label(const std::optional<int64_t>& id) {
    if (!id) return "not set";
    auto name = (*id >= 0 && *id <= UINT32_MAX) ? quant::file_type_name(uint32_t(*id)) : std::nullopt;
    return (name ? *name : "unknown") + " (" + std::to_string(*id) + ")";
}

double share(uint64_t part, uint64_t whole) { return whole ? double(part) / double(whole) : 0.0; }

ordered_json to_json(const gguf::File& f, const Summary& s, bool with_metadata) {
    ordered_json j;
    j["path"] = f.path();
    j["file_size"] = f.file_size();
    j["gguf_version"] = f.version();
    j["split_count"] = f.split_count();
    j["alignment"] = f.alignment();
    j["architecture"] = s.arch;
    j["name"] = s.name;
    j["parameters"] = s.n_params;
    j["parameters_display"] = format_count(s.n_params);
    if (s.file_type) {
        auto name = (*s.file_type >= 0 && *s.file_type <= UINT32_MAX)
                        ? quant::file_type_name(uint32_t(*s.file_type)) : std::nullopt;
        j["file_type"] = {{"id", *s.file_type}, {"name", name ? ordered_json(*name) : ordered_json()}};
    } else {
        j["file_type"] = nullptr;
    }
    ordered_json hp = ordered_json::object();
    for (const auto& [key, v] : s.hparams) hp[key] = value_to_json(*v);
    j["hparams"] = hp;
    auto opt = [](const auto& o) { return o ? ordered_json(*o) : ordered_json(); };
    j["tokenizer"] = {{"model", s.tok_model}, {"pre", s.tok_pre}, {"vocab_size", opt(s.n_tokens)},
                      {"merges", opt(s.n_merges)}, {"bos_token_id", opt(s.bos)},
                      {"eos_token_id", opt(s.eos)}, {"has_chat_template", s.chat_template}};
    ordered_json tensors = ordered_json::array();
    for (const gguf::TensorInfo& t : f.tensors()) {
        ordered_json shape = ordered_json::array();
        for (uint32_t d = 0; d < t.n_dims; ++d) shape.push_back(t.ne[d]);
        tensors.push_back({{"name", t.name}, {"type", tensor_type_name(t.type_id)}, {"shape", shape},
                           {"elements", t.n_elements}, {"bytes", t.n_bytes}});
    }
    j["tensors"] = tensors;
    ordered_json totals = ordered_json::array();
    for (const auto& [type, tt] : s.totals)
        totals.push_back({{"type", tensor_type_name(type)}, {"count", tt.count}, {"bytes", tt.bytes},
                          {"share", share(tt.bytes, s.tensor_bytes)}});
    j["totals"] = totals;
    if (with_metadata) {
        ordered_json md = ordered_json::object();
        for (const gguf::KeyValue& kv : f.metadata()) md[kv.key] = value_to_json(kv.value);
        j["metadata"] = md;
    }
    return j;
}

void print_text(const gguf::File& f, const Summary& s, bool with_metadata) {
    std::printf("file:            %s\n", f.path().c_str());
    std::printf("size:            %s (%llu bytes), GGUF v%u, %zu split%s\n", format_bytes(f.file_size()).c_str(),
                static_cast<unsigned long long>(f.file_size()), f.version(), f.split_count(),
                f.split_count() == 1 ? "" : "s");
    std::printf("architecture:    %s\n", s.arch.empty() ? "(not set)" : s.arch.c_str());
    std::printf("name:            %s\n", s.name.empty() ? "(not set)" : s.name.c_str());
    std::printf("parameters:      %s (%llu)\n", format_count(s.n_params).c_str(),
                static_cast<unsigned long long>(s.n_params));
    std::printf("file type:       %s\n", file_type_label(s.file_type).c_str());
    if (s.n_params)
        std::printf("bits per weight: %.2f\n", 8.0 * double(s.tensor_bytes) / double(s.n_params));

    if (!s.hparams.empty()) {
        std::printf("\nhyperparameters (%s.*):\n", s.arch.c_str());
        for (const auto& [key, v] : s.hparams)
            std::printf("  %-34s %s\n", key.c_str(), v->to_display().c_str());
    }

    std::printf("\ntokenizer:       %s", s.tok_model.empty() ? "(none)" : s.tok_model.c_str());
    if (!s.tok_pre.empty()) std::printf(", pre-tokenizer %s", s.tok_pre.c_str());
    std::printf("\n");
    if (s.n_tokens) std::printf("vocab size:      %llu\n", static_cast<unsigned long long>(*s.n_tokens));
    if (s.n_merges) std::printf("merges:          %llu\n", static_cast<unsigned long long>(*s.n_merges));
    if (s.bos) std::printf("bos token id:    %lld\n", static_cast<long long>(*s.bos));
    if (s.eos) std::printf("eos token id:    %lld\n", static_cast<long long>(*s.eos));
    std::printf("chat template:   %s\n", s.chat_template ? "yes" : "no");

    std::printf("\ntensors (%zu):\n", f.tensors().size());
    size_t name_width = 4;
    for (const gguf::TensorInfo& t : f.tensors()) name_width = std::max(name_width, t.name.size());
    std::printf("  %-*s  %-7s  %-22s  %14s\n", int(name_width), "name", "type", "shape", "bytes");
    for (const gguf::TensorInfo& t : f.tensors())
        std::printf("  %-*s  %-7s  %-22s  %14llu\n", int(name_width), t.name.c_str(),
                    tensor_type_name(t.type_id).c_str(), t.shape_string().c_str(),
                    static_cast<unsigned long long>(t.n_bytes));

    std::printf("\ntotals by type:\n  %-7s  %6s  %14s  %6s\n", "type", "count", "bytes", "share");
    for (const auto& [type, tt] : s.totals)
        std::printf("  %-7s  %6llu  %14s  %5.1f%%\n", tensor_type_name(type).c_str(),
                    static_cast<unsigned long long>(tt.count), format_bytes(tt.bytes).c_str(),
                    100.0 * share(tt.bytes, s.tensor_bytes));

    if (with_metadata) {
        std::printf("\nmetadata (%zu keys):\n", f.metadata().size());
        for (const gguf::KeyValue& kv : f.metadata())
            std::printf("  %s (%s) = %s\n", kv.key.c_str(), gguf::value_type_name(kv.value.type),
                        kv.value.to_display().c_str());
    }
}

void run_info(const InfoOptions& opt) {
    auto file = gguf::File::open(opt.path);
    if (!file) fail("info", file.error().message);
    const gguf::File& f = **file;
    const Summary s = summarize(f);
    if (opt.json) {
        // Strings from the file may be invalid UTF-8; replace rather than throw.
        const std::string out =
            to_json(f, s, opt.metadata).dump(2, ' ', false, ordered_json::error_handler_t::replace);
        std::printf("%s\n", out.c_str());
    } else {
        print_text(f, s, opt.metadata);
    }
}

}  // namespace

void add_info_command(CLI::App& app) {
    auto opt = std::make_shared<InfoOptions>();
    CLI::App* cmd = app.add_subcommand(
        "info", "Show what a GGUF file holds: architecture, size, hyperparameters, tokenizer, tensors");
    cmd->add_option("file", opt->path, "GGUF model file (the first part of a split model)")->required();
    cmd->add_flag("--json", opt->json, "Print one JSON object instead of text");
    cmd->add_flag("--metadata", opt->metadata, "Also list every metadata key with its value");
    cmd->callback([opt] { run_info(*opt); });
}

}  // namespace tern::tools
