// Shared helpers for the tokenizer tests: hand-built vocabularies, the
// location of the test model, random text.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "text/bpe.h"
#include "text/tokenizer.h"
#include "text/vocab.h"
#include "tests/support/test_seed.h"

namespace tern::text::testing_util {

// A byte-level BPE vocabulary: ids 0-255 are the bytes, then one token per
// merge (raw byte strings; an already present result is not repeated).
inline Vocab make_bpe_vocab(const std::vector<std::pair<std::string, std::string>>& merges,
                            const std::string& pre = "gpt2") {
    Vocab v;
    v.kind = VocabKind::Bpe;
    v.pre = pre;
    for (int b = 0; b < 256; ++b) v.tokens.push_back(bpe_bytes_to_text(std::string(1, char(b))));
    for (const auto& [l, r] : merges) {
        const std::string lt = bpe_bytes_to_text(l), rt = bpe_bytes_to_text(r);
        v.merges.push_back(lt + " " + rt);
        bool present = false;
        for (const std::string& t : v.tokens) present = present || t == lt + rt;
        if (!present) v.tokens.push_back(lt + rt);
    }
    v.types.assign(v.tokens.size(), TokenType::Normal);
    return v;
}

inline int32_t find_token(const Vocab& v, const std::string& text) {
    for (int32_t i = 0; i < v.size(); ++i)
        if (v.tokens[size_t(i)] == text) return i;
    return -1;
}

inline Tokenizer make_tokenizer(Vocab v) {
    auto t = Tokenizer::create(std::move(v));
    if (!t) {
        ADD_FAILURE() << t.error().message;
        std::abort();
    }
    return std::move(t.value());
}

// The test model: $TERN_MODEL, else <repo>/models/SmolLM2-135M-Instruct.Q4_1.gguf.
// Empty, with *error saying what to do, when it is missing.
inline std::string test_model_path(std::string* error) {
    std::string path;
    if (const char* env = std::getenv("TERN_MODEL"); env != nullptr && *env != '\0') {
        path = env;
    } else {
#ifdef TERN_SOURCE_DIR
        path = std::string(TERN_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
#else
        path = std::string(TERN_TEST_DATA) + "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf";
#endif
    }
    if (!std::filesystem::exists(path)) {
        *error = "test model not found at " + path +
                 ": run scripts/setup to download it, or point TERN_MODEL at a GGUF file";
        return {};
    }
    return path;
}


// Random text drawn from pieces (whole characters, words, whitespace), so it
// exercises the interesting boundaries rather than being mostly noise.
inline std::string random_text(std::mt19937& rng, const std::vector<std::string>& palette, size_t max_pieces) {
    std::string s;
    const size_t n = rng() % (max_pieces + 1);
    for (size_t i = 0; i < n; ++i) s += palette[rng() % palette.size()];
    return s;
}

inline std::string random_bytes(std::mt19937& rng, size_t max_len) {
    std::string s(rng() % (max_len + 1), '\0');
    for (char& c : s) c = char(rng());
    return s;
}

}  // namespace tern::text::testing_util
