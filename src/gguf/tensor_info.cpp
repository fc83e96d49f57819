// Tensor geometry: how many bytes a tensor of a given type and shape takes,
// computed without overflow so hostile dimensions cannot wrap a size check.
#include <limits>

#include "gguf/gguf.h"

namespace tern::gguf {

std::string TensorInfo::shape_string() const {
    std::string s = "[";
    for (uint32_t d = 0; d < n_dims && d < uint32_t(kMaxDims); ++d) {
        if (d) s += ", ";
        s += std::to_string(ne[d]);
    }
    return s + "]";
}

Result<uint64_t> tensor_bytes(uint32_t type_id, const int64_t* ne, uint32_t n_dims) {
    if (n_dims > uint32_t(kMaxDims))
        return Error{"n_dims " + std::to_string(n_dims) + " exceeds " + std::to_string(kMaxDims)};
    std::optional<TensorTypeInfo> info = tensor_type_info(type_id);
    if (!info) return Error{"unknown tensor type id " + std::to_string(type_id)};
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
        if (ne[d] <= 0)
            return Error{"dimension " + std::to_string(d) + " is " + std::to_string(ne[d]) +
                         " (must be positive)"};
        if (__builtin_mul_overflow(n_elements, ne[d], &n_elements))
            return Error{"element count overflows int64"};
    }
    const int64_t row = n_dims > 0 ? ne[0] : 1;
    if (row % int64_t(info->block_elems) != 0)
        return Error{"row length " + std::to_string(row) + " is not a multiple of the " +
                     info->name + " block size " + std::to_string(info->block_elems)};
    // Whole blocks, so the byte count is blocks * block_bytes.
    const uint64_t blocks = uint64_t(n_elements) / info->block_elems;
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(blocks, uint64_t(info->block_bytes), &bytes))
        return Error{"byte size overflows uint64"};
    return bytes;
}

}  // namespace tern::gguf
