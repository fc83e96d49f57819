// Tensor element types as GGUF numbers them, with the block geometry the file
// format needs to size tensor data. The block layouts themselves (and the
// arithmetic on them) live in src/quant; this table is only what a reader must
// know to validate a file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace tern {

enum class TensorType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3,
    // 4 and 5 were Q4_2 and Q4_3, long removed.
    Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21,
    IQ2_S = 22, IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28,
    IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct TensorTypeInfo {
    const char* name;      // as GGUF tools print it: "q4_K", "f16", ...
    uint32_t block_elems;  // elements per block (1 for plain types)
    uint32_t block_bytes;  // bytes per block
    bool supported;        // tern has block arithmetic for it (src/quant)
};

// Geometry of a type id as found in a file; nullopt for ids GGUF does not define.
std::optional<TensorTypeInfo> tensor_type_info(uint32_t type_id);

// Name for messages; "type#N" for unknown ids.
std::string tensor_type_name(uint32_t type_id);

// Parses "q4_K", "Q4_K", "f16", ... (case-insensitive); nullopt if unknown.
std::optional<TensorType> tensor_type_from_name(const std::string& name);

// True when tern can dequantize/quantize this type.
bool tensor_type_supported(uint32_t type_id);

}  // namespace tern
