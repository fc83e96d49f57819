// libFuzzer target for the GGUF reader: any byte string must parse into a File
// or an Error, never crash, hang or allocate without bound. A parsed File is
// walked fully (every value displayed, every tensor's first and last data byte
// read) so ASan sees any pointer or size the reader let through unchecked.
#include <cstddef>
#include <cstdint>

#include "gguf/gguf.h"

namespace {

size_t walk(const tern::gguf::Value& v) {
    size_t n = v.str.size();
    for (const tern::gguf::Value& item : v.items) n += walk(item);
    return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    auto file = tern::gguf::File::parse(data, size, "fuzz.gguf");
    if (!file) return 0;
    volatile size_t sink = 0;
    for (const tern::gguf::KeyValue& kv : (*file)->metadata()) {
        sink = sink + walk(kv.value) + kv.value.to_display().size();
        (void)kv.value.as_int();
        (void)kv.value.as_double();
        if ((*file)->find(kv.key) == nullptr) __builtin_trap();
    }
    for (const tern::gguf::TensorInfo& t : (*file)->tensors()) {
        if (t.data < data || t.n_bytes == 0 || t.n_bytes > size ||
            size_t(t.data - data) > size - t.n_bytes)
            __builtin_trap();  // a range the reader should have refused
        sink = sink + t.data[0] + t.data[t.n_bytes - 1];
        if ((*file)->find_tensor(t.name) != &t) __builtin_trap();
    }
    (void)sink;
    return 0;
}
