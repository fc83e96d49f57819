// The part of weight registration every backend shares: the view of a GGUF
// tensor as a matrix, checked once here.
#include "backend/backend.h"
#include "quant/quant.h"

namespace tern::backend {

Result<Weight> describe_weight(const gguf::TensorInfo& t) {
    if (!tensor_type_supported(t.type_id))
        return Error{"tensor '" + t.name + "': unsupported tensor type " + tensor_type_name(t.type_id)};
    Weight w;
    w.name = t.name;
    w.type = t.type();
    w.cols = t.ne[0];
    w.rows = t.n_elements / t.ne[0];
    w.host = t.data;
    w.row_bytes = quant::row_bytes(w.type, w.cols);
    if (w.row_bytes == 0)
        return Error{"tensor '" + t.name + "': row length " + std::to_string(w.cols) + " is not a whole number of " +
                     tensor_type_name(t.type_id) + " blocks"};
    return w;
}

size_t weight_span(const Weight& w) { return size_t(w.rows - 1) * w.row_bytes + quant::row_bytes(w.type, w.cols); }

}  // namespace tern::backend
