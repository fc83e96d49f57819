// Tensor maps for Hopper's tensor copies (cp.async.bulk.tensor, TMA): the
// host side. A map describes a 2-D array in global memory and the box one
// copy moves into shared memory; the kernels take it as a __grid_constant__
// parameter.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>

namespace tern::cuda {

// cuTensorMapEncodeTiled through the runtime (no link to the driver
// library); null where the driver lacks it.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();

// A row-major 2-D map: `rows` rows of `cols` elements, `stride` bytes apart,
// copied in boxes of box_cols x box_rows (zeros past either end). False where
// the driver cannot describe it.
bool encode_map(CUtensorMap& map, CUtensorMapDataType type, const void* base, uint64_t cols, uint64_t rows,
                uint64_t stride, uint32_t box_cols, uint32_t box_rows, CUtensorMapSwizzle swizzle);

}  // namespace tern::cuda
