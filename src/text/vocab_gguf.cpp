// load_vocab(): the tokenizer.ggml.* metadata of a GGUF file turned into a
// Vocab. Kept apart from vocab.cpp so code that builds vocabularies by hand
// does not pull in the GGUF reader.
#include <cmath>

#include "gguf/gguf.h"
#include "text/vocab.h"

namespace tern::text {

namespace {

constexpr const char* kPrefix = "tokenizer.ggml.";

std::string key_of(const char* name) { return std::string(kPrefix) + name; }

// An array-valued key; nullptr when absent, an error when present but not an
// array of the wanted kind.
Result<const gguf::Value*> find_array(const gguf::File& file, const char* name, bool required) {
    const gguf::Value* v = file.find(key_of(name));
    if (v == nullptr) {
        if (required) return Error{"vocab: missing " + key_of(name)};
        return static_cast<const gguf::Value*>(nullptr);
    }
    if (v->type != gguf::ValueType::ARRAY)
        return Error{"vocab: " + key_of(name) + " is a " + gguf::value_type_name(v->type) + ", not an array"};
    return v;
}

Result<std::vector<std::string>> read_strings(const gguf::Value& v, const char* name) {
    std::vector<std::string> out;
    out.reserve(v.items.size());
    for (size_t i = 0; i < v.items.size(); ++i) {
        const std::string* s = v.items[i].as_string();
        if (s == nullptr) return Error{"vocab: " + key_of(name) + "[" + std::to_string(i) + "] is not a string"};
        out.push_back(*s);
    }
    return out;
}

// An optional token id; -1 when absent. A present value must be an integer.
Result<int32_t> read_id(const gguf::File& file, const char* name, int32_t fallback) {
    const gguf::Value* v = file.find(key_of(name));
    if (v == nullptr) return fallback;
    const std::optional<int64_t> id = v->as_int();
    if (!id || *id < -1 || *id > INT32_MAX)
        return Error{"vocab: " + key_of(name) + " is not a token id (" + v->to_display() + ")"};
    return int32_t(*id);
}

Result<bool> read_flag(const gguf::File& file, const char* name, bool fallback) {
    const gguf::Value* v = file.find(key_of(name));
    if (v == nullptr) return fallback;
    const std::optional<bool> b = v->as_bool();
    if (!b) return Error{"vocab: " + key_of(name) + " is not a bool (" + v->to_display() + ")"};
    return *b;
}

}  // namespace

Result<Vocab> load_vocab(const gguf::File& file) {
    Vocab vocab;
    const std::optional<std::string> model = file.get_string(key_of("model"));
    if (!model) return Error{"vocab: missing or non-string " + key_of("model")};
    if (*model == "llama") vocab.kind = VocabKind::Spm;
    else if (*model == "gpt2") vocab.kind = VocabKind::Bpe;
    else return Error{"vocab: unsupported tokenizer model \"" + *model + "\" (supported: llama, gpt2)"};
    const bool spm = vocab.kind == VocabKind::Spm;

    if (const gguf::Value* pre = file.find(key_of("pre")); pre != nullptr) {
        if (pre->as_string() == nullptr) return Error{"vocab: " + key_of("pre") + " is not a string"};
        vocab.pre = *pre->as_string();
    }

    auto tokens_v = find_array(file, "tokens", true);
    if (!tokens_v) return tokens_v.error();
    auto tokens = read_strings(**tokens_v, "tokens");
    if (!tokens) return tokens.error();
    vocab.tokens = std::move(tokens.value());

    auto scores_v = find_array(file, "scores", false);
    if (!scores_v) return scores_v.error();
    if (*scores_v != nullptr) {
        const auto& items = (*scores_v)->items;
        vocab.scores.reserve(items.size());
        for (size_t i = 0; i < items.size(); ++i) {
            const std::optional<double> d = items[i].as_double();
            if (!d || !std::isfinite(*d))
                return Error{"vocab: " + key_of("scores") + "[" + std::to_string(i) + "] is not a finite number"};
            vocab.scores.push_back(float(*d));
        }
    }

    auto types_v = find_array(file, "token_type", false);
    if (!types_v) return types_v.error();
    if (*types_v != nullptr) {
        const auto& items = (*types_v)->items;
        vocab.types.reserve(items.size());
        for (size_t i = 0; i < items.size(); ++i) {
            const std::optional<int64_t> t = items[i].as_int();
            if (!t || *t < 0 || *t > int64_t(TokenType::Byte))
                return Error{"vocab: " + key_of("token_type") + "[" + std::to_string(i) + "] is not a token type"};
            vocab.types.push_back(TokenType(int32_t(*t)));
        }
    }

    auto merges_v = find_array(file, "merges", !spm);
    if (!merges_v) return merges_v.error();
    if (*merges_v != nullptr) {
        auto merges = read_strings(**merges_v, "merges");
        if (!merges) return merges.error();
        vocab.merges = std::move(merges.value());
    }

    struct IdKey {
        const char* name;
        int32_t* dst;
        int32_t spm_default;
    };
    const IdKey ids[] = {{"bos_token_id", &vocab.bos_id, 1},       {"eos_token_id", &vocab.eos_id, 2},
                         {"unknown_token_id", &vocab.unk_id, 0},   {"padding_token_id", &vocab.pad_id, -1},
                         {"eot_token_id", &vocab.eot_id, -1},      {"eom_token_id", &vocab.eom_id, -1}};
    for (const IdKey& k : ids) {
        int32_t fallback = spm ? k.spm_default : -1;
        if (fallback >= vocab.size()) fallback = -1;
        auto id = read_id(file, k.name, fallback);
        if (!id) return id.error();
        *k.dst = *id;
    }

    struct FlagKey {
        const char* name;
        bool* dst;
        bool fallback;
    };
    const FlagKey flags[] = {{"add_bos_token", &vocab.add_bos, spm && vocab.bos_id >= 0},
                             {"add_eos_token", &vocab.add_eos, false},
                             {"add_space_prefix", &vocab.add_space_prefix, spm}};
    for (const FlagKey& f : flags) {
        auto b = read_flag(file, f.name, f.fallback);
        if (!b) return b.error();
        *f.dst = *b;
    }

    if (Status s = vocab.validate(); !s) return Error{s.message() + " (in " + file.path() + ")"};
    return vocab;
}

}  // namespace tern::text
