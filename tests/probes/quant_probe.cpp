// Exposes the reference quantizers to the Python oracle tests:
//   quant_probe quantize TYPE [IN [OUT]]    f32 values -> blocks of TYPE
//   quant_probe dequantize TYPE [IN [OUT]]  blocks of TYPE -> f32 values
// IN and OUT default to stdin and stdout; "-" also means those. The data is
// treated as one row; its length must be whole blocks. Exit status 2 on bad
// usage or input, with the reason on stderr.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gguf/tensor_type.h"
#include "quant/quant.h"

namespace {

bool read_all(const char* path, std::vector<unsigned char>* out) {
    FILE* f = (path && std::strcmp(path, "-") != 0) ? std::fopen(path, "rb") : stdin;
    if (!f) return false;
    unsigned char buf[1 << 16];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) out->insert(out->end(), buf, buf + got);
    const bool ok = !std::ferror(f);
    if (f != stdin) std::fclose(f);
    return ok;
}

bool write_all(const char* path, const void* data, size_t n) {
    FILE* f = (path && std::strcmp(path, "-") != 0) ? std::fopen(path, "wb") : stdout;
    if (!f) return false;
    bool ok = std::fwrite(data, 1, n, f) == n;
    ok = (f == stdout ? std::fflush(f) == 0 : std::fclose(f) == 0) && ok;
    return ok;
}

int fail(const std::string& message) {
    std::fprintf(stderr, "quant_probe: %s\n", message.c_str());
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3 || argc > 5) {
        return fail("usage: quant_probe quantize|dequantize TYPE [IN [OUT]]");
    }
    const std::string mode = argv[1];
    const auto type = tern::tensor_type_from_name(argv[2]);
    if (!type) return fail(std::string("unknown tensor type ") + argv[2]);
    const auto info = tern::tensor_type_info(uint32_t(*type));
    const char* in_path = argc > 3 ? argv[3] : nullptr;
    const char* out_path = argc > 4 ? argv[4] : nullptr;

    std::vector<unsigned char> input;
    if (!read_all(in_path, &input)) return fail("cannot read input");

    if (mode == "quantize") {
        if (input.size() % sizeof(float) != 0) return fail("input is not whole f32 values");
        const int64_t n = int64_t(input.size() / sizeof(float));
        std::vector<float> values(static_cast<size_t>(n));
        if (n > 0) std::memcpy(values.data(), input.data(), input.size());
        std::vector<unsigned char> blocks(tern::quant::row_bytes(*type, n));
        if (tern::Status s = tern::quant::quantize_row(*type, values.data(), blocks.data(), n); !s) {
            return fail(s.message());
        }
        if (!write_all(out_path, blocks.data(), blocks.size())) return fail("cannot write output");
        return 0;
    }
    if (mode == "dequantize") {
        if (input.size() % info->block_bytes != 0) {
            return fail("input is not whole " + std::string(info->name) + " blocks");
        }
        const int64_t n = int64_t(input.size() / info->block_bytes) * info->block_elems;
        std::vector<float> values(static_cast<size_t>(n));
        if (tern::Status s = tern::quant::dequantize_row(*type, input.data(), values.data(), n); !s) {
            return fail(s.message());
        }
        if (!write_all(out_path, values.data(), values.size() * sizeof(float))) {
            return fail("cannot write output");
        }
        return 0;
    }
    return fail("unknown mode " + mode + " (quantize or dequantize)");
}
