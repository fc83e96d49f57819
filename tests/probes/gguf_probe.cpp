// Exposes the GGUF reader and writer to the Python interop test.
//   gguf_probe dump FILE         prints what the reader sees, as JSON
//   gguf_probe write FILE SEED   writes a file with every metadata type, nested
//                                arrays and f32/f16/q8_0 tensors (random from SEED)
// JSON form: strings and tensor data as hex (exact bytes), f32/f64 as their bit
// patterns (exact, NaN-safe), integers as numbers.
#include <bit>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "gguf/gguf.h"

using namespace tern;
using namespace tern::gguf;

namespace {

std::string hex(const uint8_t* p, size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string s;
    s.reserve(n * 2);
    for (size_t k = 0; k < n; ++k) {
        s += digits[p[k] >> 4];
        s += digits[p[k] & 15];
    }
    return s;
}

std::string json_value(const Value& v) {
    std::string out = std::string("{\"type\":\"") + value_type_name(v.type) + "\",\"value\":";
    switch (v.type) {
        case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64:
            out += std::to_string(v.u);
            break;
        case ValueType::BOOL:
            out += v.u ? "true" : "false";
            break;
        case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
            out += std::to_string(v.i);
            break;
        case ValueType::F32:
            out += std::to_string(std::bit_cast<uint32_t>(float(v.f)));
            break;
        case ValueType::F64:
            out += std::to_string(std::bit_cast<uint64_t>(v.f));
            break;
        case ValueType::STRING:
            out += "\"" + hex(reinterpret_cast<const uint8_t*>(v.str.data()), v.str.size()) + "\"";
            break;
        case ValueType::ARRAY:
            out += "[";
            for (size_t k = 0; k < v.items.size(); ++k) out += (k ? "," : "") + json_value(v.items[k]);
            out += "],\"elem_type\":\"" + std::string(value_type_name(v.elem_type)) + "\"";
            break;
    }
    return out + "}";
}

int dump(const char* path) {
    auto f = File::open(path);
    if (!f) {
        std::fprintf(stderr, "%s\n", f.error().message.c_str());
        return 1;
    }
    const File& file = **f;
    std::string out = "{\"version\":" + std::to_string(file.version()) +
                      ",\"alignment\":" + std::to_string(file.alignment()) + ",\"metadata\":[";
    for (size_t k = 0; k < file.metadata().size(); ++k) {
        const KeyValue& kv = file.metadata()[k];
        out += (k ? ",{\"key\":\"" : "{\"key\":\"") + kv.key + "\",\"v\":" + json_value(kv.value) + "}";
    }
    out += "],\"tensors\":[";
    for (size_t k = 0; k < file.tensors().size(); ++k) {
        const TensorInfo& t = file.tensors()[k];
        out += k ? ",{" : "{";
        out += "\"name\":\"" + t.name + "\",\"type\":" + std::to_string(t.type_id) + ",\"ne\":[";
        for (uint32_t d = 0; d < t.n_dims; ++d) out += (d ? "," : "") + std::to_string(t.ne[d]);
        out += "],\"offset\":" + std::to_string(t.offset) + ",\"n_bytes\":" + std::to_string(t.n_bytes) +
               ",\"data\":\"" + hex(t.data, t.n_bytes) + "\"}";
    }
    out += "]}\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
}

int write(const char* path, uint64_t seed) {
    std::mt19937_64 rng(seed);
    Writer w(rng() % 2 ? 32 : 64);
    w.set_string("general.architecture", "tern-test");
    w.set("t.u8", Value::of_u8(uint8_t(rng())));
    w.set("t.i8", Value::of_i8(int8_t(rng())));
    w.set("t.u16", Value::of_u16(uint16_t(rng())));
    w.set("t.i16", Value::of_i16(int16_t(rng())));
    w.set("t.u32", Value::of_u32(uint32_t(rng())));
    w.set("t.i32", Value::of_i32(int32_t(rng())));
    w.set("t.u64", Value::of_u64(rng()));
    w.set("t.i64", Value::of_i64(int64_t(rng())));
    w.set("t.f32", Value::of_f32(float(int32_t(rng())) / 4096.f));
    w.set("t.f64", Value::of_f64(double(int64_t(rng())) / 1e6));
    w.set("t.bool", Value::of_bool(rng() & 1));
    w.set("t.str", Value::of_string("h\xc3\xa9llo w\xc3\xb6rld " + std::to_string(rng())));
    w.set("t.empty_str", Value::of_string(""));
    std::vector<std::string> words;
    for (int k = 0; k < 20; ++k) words.push_back("w" + std::to_string(rng() % 100000));
    w.set("t.strings", Value::of_strings(words));
    w.set("t.f32s", Value::of_f32s({1.5f, -2.25f, float(rng() % 1000)}));
    w.set("t.i32s", Value::of_i32s({int32_t(rng()), -1, 0}));
    std::vector<Value> u64s;
    for (int k = 0; k < 5; ++k) u64s.push_back(Value::of_u64(rng()));
    w.set("t.u64s", Value::of_array(ValueType::U64, u64s));
    w.set("t.bools", Value::of_array(ValueType::BOOL, {Value::of_bool(true), Value::of_bool(false)}));
    w.set("t.empty", Value::of_array(ValueType::I32, {}));
    w.set("t.nested", Value::of_array(ValueType::ARRAY, {Value::of_i32s({1, 2}), Value::of_i32s({3})}));
    w.set("t.nested_str", Value::of_array(ValueType::ARRAY, {Value::of_strings({"a", "b"}),
                                                             Value::of_strings({"c"})}));

    struct Spec {
        const char* name;
        TensorType type;
        std::vector<int64_t> ne;
    };
    const Spec specs[] = {{"f32.a", TensorType::F32, {8, 3}},
                          {"f16.b", TensorType::F16, {16}},
                          {"q8_0.c", TensorType::Q8_0, {64, 2}},
                          {"f32.d", TensorType::F32, {5, 1, 2}}};
    for (const Spec& s : specs) {
        Status st = w.add_tensor(s.name, s.type, s.ne);
        if (!st) {
            std::fprintf(stderr, "%s\n", st.message().c_str());
            return 1;
        }
    }
    Status st = w.begin(path);
    for (size_t k = 0; st && k < w.tensors().size(); ++k) {
        std::vector<uint8_t> data(w.tensors()[k].n_bytes);
        for (uint8_t& b : data) b = uint8_t(rng());
        st = w.write_tensor_data(data.data(), data.size());
    }
    if (st) st = w.finish();
    if (!st) {
        std::fprintf(stderr, "%s\n", st.message().c_str());
        return 1;
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 3 && std::strcmp(argv[1], "dump") == 0) return dump(argv[2]);
    if (argc == 4 && std::strcmp(argv[1], "write") == 0)
        return write(argv[2], std::strtoull(argv[3], nullptr, 10));
    std::fprintf(stderr, "usage: gguf_probe dump FILE | gguf_probe write FILE SEED\n");
    return 2;
}
