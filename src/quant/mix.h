// The quantization mix: which tensor type each weight of a model gets when the
// model is written as a given file type ("Q4_K_M", "Q8_0", ...). A file type is
// a policy, not a single tensor type: sensitive tensors (the output projection,
// some attn_v and ffn_down layers) get more bits, and rows whose length does not
// fit a K-quant super-block fall back to a 32-element type. The rules follow the
// ones GGUF quantizers apply, so `tern quantize` and `tern synth` produce the
// same per-tensor types as files found in the wild.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/tensor_type.h"

namespace tern::quant {

// general.file_type as GGUF files number it. Only the types tern can write are
// listed; file_type_name() also knows the others.
enum class FileType : uint32_t {
    ALL_F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q8_0 = 7, Q5_0 = 8, Q5_1 = 9,
    Q2_K = 10, Q3_K_S = 11, Q3_K_M = 12, Q3_K_L = 13, Q4_K_S = 14, Q4_K_M = 15,
    Q5_K_S = 16, Q5_K_M = 17, Q6_K = 18, BF16 = 32,
};

// Name of a general.file_type value ("Q4_K_M", "F32", "IQ2_XS", ...), including
// ones tern cannot write; nullopt for numbers no GGUF producer uses.
std::optional<std::string> file_type_name(uint32_t id);

// Parses a file type tern can write ("Q4_K_M", "q4_k_m", "f16", "F32", ...).
std::optional<FileType> file_type_from_name(std::string_view name);

// Names of the file types tern can write, in a stable order, for help and errors.
std::vector<std::string> writable_file_type_names();

// The tensor type most weights get under this file type (Q4_K_M -> q4_K).
TensorType file_type_base_type(FileType ftype);

// What the mix needs to know about the model as a whole.
struct MixModel {
    FileType ftype = FileType::F16;
    std::string arch;        // general.architecture ("llama", "qwen2", "falcon", ...)
    int n_layers = 0;        // <arch>.block_count
    int n_head = 0;          // attention.head_count; 0 when unknown
    int n_head_kv = 0;       // attention.head_count_kv; 0 when unknown
    bool has_output = true;  // false when output.weight is absent (tied to token_embd)
    int n_expert = 0;        // <arch>.expert_count; 0 for a dense model
};

// True for the tensors a quantizer converts: names ending in ".weight" with two
// or more dimensions, except norms and a few small matrices kept exact.
bool is_quantizable(std::string_view name, int n_dims);

// Layer number of a tensor named "blk.N....", or -1.
int layer_index_from_name(std::string_view name);

// The more-bits pattern for attn_v / ffn_down: the first and last eighth of the
// layers, and every third layer in between.
bool use_more_bits(int i_layer, int n_layers);

// The type tensor `name` (shape ne[0..n_dims), ne[0] the row length) gets in a
// file of model.ftype. Tensors that are not quantizable keep source_type.
TensorType choose_tensor_type(const MixModel& model, std::string_view name, const int64_t* ne,
                              int n_dims, TensorType source_type);

}  // namespace tern::quant
