// Exposes the tokenizer to the Python oracle test: loads a GGUF vocabulary,
// then for each stdin line "<mode> <hex text>" (mode "p": parse special
// tokens, "t": treat them as text) prints the token ids separated by spaces,
// a tab, and the hex of decode(ids).
#include <cstdio>
#include <iostream>
#include <string>

#include "gguf/gguf.h"
#include "text/tokenizer.h"

using namespace tern;

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s MODEL.gguf < lines of \"p|t HEX\"\n", argv[0]);
        return 2;
    }
    auto file = gguf::File::open(argv[1]);
    if (!file) {
        std::fprintf(stderr, "%s\n", file.error().message.c_str());
        return 1;
    }
    auto vocab = text::load_vocab(**file);
    if (!vocab) {
        std::fprintf(stderr, "%s\n", vocab.error().message.c_str());
        return 1;
    }
    auto tok = text::Tokenizer::create(std::move(vocab.value()));
    if (!tok) {
        std::fprintf(stderr, "%s\n", tok.error().message.c_str());
        return 1;
    }
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.size() < 2 || (line[0] != 'p' && line[0] != 't') || line[1] != ' ' || line.size() % 2 != 0) {
            std::fprintf(stderr, "bad input line: %s\n", line.c_str());
            return 2;
        }
        std::string text;
        for (size_t i = 2; i + 1 < line.size(); i += 2) {
            const int hi = hex_value(line[i]), lo = hex_value(line[i + 1]);
            if (hi < 0 || lo < 0) {
                std::fprintf(stderr, "bad hex in line: %s\n", line.c_str());
                return 2;
            }
            text.push_back(char(hi * 16 + lo));
        }
        const std::vector<int32_t> ids = tok->encode(text, false, line[0] == 'p');
        std::string out;
        for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
        out += '\t';
        static const char* digits = "0123456789abcdef";
        for (unsigned char c : tok->decode(ids)) {
            out += digits[c >> 4];
            out += digits[c & 15];
        }
        std::cout << out << '\n';
    }
    return 0;
}
