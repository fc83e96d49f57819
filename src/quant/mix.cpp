// The per-tensor type policy behind each file type. The rules are the ones
// GGUF quantizers have converged on: the output projection gets q6_K, attn_v and
// ffn_down of some layers get a type with more bits, and a row length that is
// not a whole number of K-quant super-blocks falls back to a 32-element type.
#include "quant/mix.h"

#include <cctype>
#include <charconv>

namespace tern::quant {
namespace {

struct FileTypeName {
    uint32_t id;
    const char* name;
    bool writable;
};

// Every general.file_type number in use; the IQ and ternary types are here so
// `tern info` can name them, though tern cannot produce them.
constexpr FileTypeName kFileTypes[] = {
    {0, "F32", true},      {1, "F16", true},        {2, "Q4_0", true},    {3, "Q4_1", true},
    {4, "Q4_1_SOME_F16", false},                    {7, "Q8_0", true},    {8, "Q5_0", true},
    {9, "Q5_1", true},     {10, "Q2_K", true},      {11, "Q3_K_S", true}, {12, "Q3_K_M", true},
    {13, "Q3_K_L", true},  {14, "Q4_K_S", true},    {15, "Q4_K_M", true}, {16, "Q5_K_S", true},
    {17, "Q5_K_M", true},  {18, "Q6_K", true},      {19, "IQ2_XXS", false},
    {20, "IQ2_XS", false}, {21, "Q2_K_S", false},   {22, "IQ3_XS", false},
    {23, "IQ3_XXS", false}, {24, "IQ1_S", false},   {25, "IQ4_NL", false},
    {26, "IQ3_S", false},  {27, "IQ3_M", false},    {28, "IQ2_S", false}, {29, "IQ2_M", false},
    {30, "IQ4_XS", false}, {31, "IQ1_M", false},    {32, "BF16", true},   {36, "TQ1_0", false},
    {37, "TQ2_0", false},  {38, "MXFP4_MOE", false},
};

bool equals_ignoring_case(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(a[i])) !=
            std::tolower(static_cast<unsigned char>(b[i])))
            return false;
    return true;
}

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

bool ends_with(std::string_view s, std::string_view tail) {
    return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

int64_t block_elems(TensorType t) {
    auto info = tensor_type_info(uint32_t(t));
    return info ? int64_t(info->block_elems) : 1;
}

// Float file types convert every weight matrix to one type; the quantized ones
// apply the per-tensor rules below.
bool file_type_has_mix(FileType f) {
    switch (f) {
        case FileType::ALL_F32: case FileType::F16: case FileType::BF16: return false;
        default: return true;
    }
}

// Checkpoints whose attn_v is shared by eight query heads (Llama-2/3 70B,
// Qwen2 72B): attn_v is small there, so it is cheap to give it more bits.
bool is_70b_class(const MixModel& m) {
    if (m.n_layers != 80) return false;
    if (m.arch == "llama") return m.n_head > 0 && m.n_head_kv > 0 && m.n_head != m.n_head_kv;
    return m.arch == "qwen2";
}

int grouped_query_ratio(const MixModel& m) {
    return (m.n_head > 0 && m.n_head_kv > 0) ? m.n_head / m.n_head_kv : 1;
}

TensorType output_type(const MixModel& m, TensorType base, int64_t row_len) {
    if (m.arch == "falcon" || row_len % block_elems(base) != 0) return TensorType::Q8_0;
    if (base == TensorType::Q8_0) return base;
    return TensorType::Q6_K;
}

TensorType attn_v_type(const MixModel& m, TensorType t, int i_layer) {
    const FileType f = m.ftype;
    if (f == FileType::Q2_K) t = grouped_query_ratio(m) >= 4 ? TensorType::Q4_K : TensorType::Q3_K;
    else if (f == FileType::Q3_K_M) t = i_layer < 2 ? TensorType::Q5_K : TensorType::Q4_K;
    else if (f == FileType::Q3_K_L) t = TensorType::Q5_K;
    else if ((f == FileType::Q4_K_M || f == FileType::Q5_K_M) && use_more_bits(i_layer, m.n_layers))
        t = TensorType::Q6_K;
    else if (f == FileType::Q4_K_S && i_layer < 4) t = TensorType::Q5_K;
    if (is_70b_class(m) && (t == TensorType::Q3_K || t == TensorType::Q4_K)) t = TensorType::Q5_K;
    return t;
}

TensorType ffn_down_type(const MixModel& m, TensorType t, int i_layer) {
    const FileType f = m.ftype;
    const int n = m.n_layers;
    const bool falcon = m.arch == "falcon";
    if (f == FileType::Q2_K) return TensorType::Q3_K;
    if (f == FileType::Q3_K_M) {
        if (i_layer < n / 16) return TensorType::Q5_K;
        return (!falcon || use_more_bits(i_layer, n)) ? TensorType::Q4_K : TensorType::Q3_K;
    }
    if (f == FileType::Q3_K_L) return falcon ? TensorType::Q4_K : TensorType::Q5_K;
    if (f == FileType::Q4_K_M) {
        if (falcon) {
            if (i_layer < n / 16) return TensorType::Q6_K;
            return use_more_bits(i_layer, n) ? TensorType::Q5_K : TensorType::Q4_K;
        }
        return use_more_bits(i_layer, n) ? TensorType::Q6_K : t;
    }
    if (f == FileType::Q5_K_M && use_more_bits(i_layer, n)) return TensorType::Q6_K;
    if (f == FileType::Q4_K_S && !falcon && i_layer < n / 8) return TensorType::Q5_K;
    return t;
}

TensorType attn_output_type(const MixModel& m, TensorType t) {
    const FileType f = m.ftype;
    if (m.arch == "falcon") return f == FileType::Q3_K_L ? TensorType::Q4_K : t;
    if (m.n_expert == 8)
        return (f == FileType::Q2_K || f == FileType::Q3_K_S || f == FileType::Q3_K_M || f == FileType::Q4_K_S ||
                f == FileType::Q4_K_M)
                   ? TensorType::Q5_K
                   : t;
    if (f == FileType::Q2_K) return TensorType::Q3_K;
    if (f == FileType::Q3_K_M) return TensorType::Q4_K;
    if (f == FileType::Q3_K_L) return TensorType::Q5_K;
    return t;
}

TensorType attn_qkv_type(const MixModel& m, TensorType t) {
    const FileType f = m.ftype;
    if (f == FileType::Q3_K_M || f == FileType::Q3_K_L) return TensorType::Q4_K;
    if (f == FileType::Q4_K_M) return TensorType::Q5_K;
    if (f == FileType::Q5_K_M) return TensorType::Q6_K;
    return t;
}

// A row that is not a whole number of blocks of `t` gets a type with smaller
// blocks. GGUF quantizers send q2_K/q3_K to iq4_nl, which tern does not
// implement; q4_0 has the same block size and bits per weight.
TensorType fit_row_length(TensorType t, int64_t row_len) {
    if (row_len % block_elems(t) == 0) return t;
    switch (t) {
        case TensorType::Q2_K: case TensorType::Q3_K: t = TensorType::Q4_0; break;
        case TensorType::Q4_K: t = TensorType::Q5_0; break;
        case TensorType::Q5_K: t = TensorType::Q5_1; break;
        case TensorType::Q6_K: t = TensorType::Q8_0; break;
        default: break;  // the 32-element types go straight to f16
    }
    if (row_len % block_elems(t) != 0) t = TensorType::F16;
    return t;
}

}  // namespace

std::optional<std::string> file_type_name(uint32_t id) {
    for (const FileTypeName& e : kFileTypes)
        if (e.id == id) return std::string(e.name);
    return std::nullopt;
}

std::optional<FileType> file_type_from_name(std::string_view name) {
    for (const FileTypeName& e : kFileTypes)
        if (e.writable && equals_ignoring_case(name, e.name)) return FileType(e.id);
    return std::nullopt;
}

std::vector<std::string> writable_file_type_names() {
    std::vector<std::string> names;
    for (const FileTypeName& e : kFileTypes)
        if (e.writable) names.emplace_back(e.name);
    return names;
}

TensorType file_type_base_type(FileType ftype) {
    switch (ftype) {
        case FileType::ALL_F32: return TensorType::F32;
        case FileType::F16: return TensorType::F16;
        case FileType::BF16: return TensorType::BF16;
        case FileType::Q4_0: return TensorType::Q4_0;
        case FileType::Q4_1: return TensorType::Q4_1;
        case FileType::Q5_0: return TensorType::Q5_0;
        case FileType::Q5_1: return TensorType::Q5_1;
        case FileType::Q8_0: return TensorType::Q8_0;
        case FileType::Q2_K: return TensorType::Q2_K;
        case FileType::Q3_K_S: case FileType::Q3_K_M: case FileType::Q3_K_L: return TensorType::Q3_K;
        case FileType::Q4_K_S: case FileType::Q4_K_M: return TensorType::Q4_K;
        case FileType::Q5_K_S: case FileType::Q5_K_M: return TensorType::Q5_K;
        case FileType::Q6_K: return TensorType::Q6_K;
    }
    return TensorType::F16;
}

bool is_quantizable(std::string_view name, int n_dims) {
    if (n_dims < 2 || !ends_with(name, ".weight")) return false;
    // Norm scales, the MoE router and positional tables are small and sensitive.
    for (std::string_view keep : {"_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d.weight",
                                  "attn_rel_b.weight"})
        if (contains(name, keep)) return false;
    return name != "position_embd.weight" && name != "token_types.weight";
}

int layer_index_from_name(std::string_view name) {
    constexpr std::string_view prefix = "blk.";
    if (name.substr(0, prefix.size()) != prefix) return -1;
    const char* first = name.data() + prefix.size();
    const char* last = name.data() + name.size();
    int layer = -1;
    auto [end, ec] = std::from_chars(first, last, layer);
    if (ec != std::errc() || end == first || end == last || *end != '.' || layer < 0) return -1;
    return layer;
}

bool use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

TensorType choose_tensor_type(const MixModel& model, std::string_view name, const int64_t* ne,
                              int n_dims, TensorType source_type) {
    if (!is_quantizable(name, n_dims)) return source_type;
    const TensorType base = file_type_base_type(model.ftype);
    if (!file_type_has_mix(model.ftype)) return base;

    const int64_t row_len = ne[0];
    const int layer = layer_index_from_name(name);
    TensorType t = base;
    if (name == "output.weight" || (!model.has_output && name == "token_embd.weight")) {
        t = output_type(model, base, row_len);
    } else if (model.n_expert == 8 && (contains(name, "attn_v.weight") || contains(name, "attn_k.weight"))) {
        // Eight-expert models (Mixtral): their attention is a small share of the file, so it gets q8_0.
        t = TensorType::Q8_0;
    } else if (contains(name, "attn_v.weight")) {
        t = attn_v_type(model, base, layer);
    } else if (contains(name, "ffn_down")) {
        t = ffn_down_type(model, base, layer);
    } else if (contains(name, "attn_output.weight")) {
        t = attn_output_type(model, base);
    } else if (contains(name, "attn_qkv.weight")) {
        t = attn_qkv_type(model, base);
    }
    return fit_row_length(t, row_len);
}

}  // namespace tern::quant
