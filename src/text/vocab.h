// The vocabulary of a model as the tokenizers need it: token texts, scores,
// token types, BPE merges, special ids and flags. Built by hand (tests) or
// from a GGUF file's tokenizer.ggml.* metadata by load_vocab().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/result.h"

namespace tern::gguf {
class File;
}

namespace tern::text {

// tokenizer.ggml.model: "llama" is SentencePiece-style (scores drive merges,
// "▁" marks spaces, "<0xNN>" tokens as byte fallback); "gpt2" is byte-level
// BPE (bytes mapped to printable code points, ranked merges, a regex
// pre-tokenizer).
enum class VocabKind { Spm, Bpe };
const char* vocab_kind_name(VocabKind kind);

// The values of tokenizer.ggml.token_type.
enum class TokenType : int32_t {
    Undefined = 0,
    Normal = 1,
    Unknown = 2,
    Control = 3,      // <s>, <|im_start|>: matched in text only when asked
    UserDefined = 4,  // always matched in text as a whole
    Unused = 5,
    Byte = 6,         // <0xNN> byte-fallback tokens
};

struct Vocab {
    VocabKind kind = VocabKind::Bpe;
    // tokenizer.ggml.pre: which pre-tokenizer regexes a BPE vocab was built
    // with ("gpt2"/"default", "llama3"/"llama-bpe", "qwen2", "smollm", ...).
    std::string pre = "default";

    std::vector<std::string> tokens;  // token id -> text, as stored in the file
    std::vector<float> scores;        // empty, or one per token (SPM merge priority)
    std::vector<TokenType> types;     // empty (all Normal), or one per token
    std::vector<std::string> merges;  // BPE: "left right", rank = index

    int32_t bos_id = -1;
    int32_t eos_id = -1;
    int32_t unk_id = -1;
    int32_t pad_id = -1;
    int32_t eot_id = -1;  // end of turn, where the model has one apart from eos
    int32_t eom_id = -1;  // end of message (tool calls)

    bool add_bos = false;           // encode(add_special) prepends bos
    bool add_eos = false;           // encode(add_special) appends eos
    bool add_space_prefix = false;  // SPM: a text fragment at the start or after a special token gets a leading space

    int32_t size() const { return int32_t(tokens.size()); }
    TokenType type(int32_t id) const { return types.empty() ? TokenType::Normal : types[size_t(id)]; }
    float score(int32_t id) const { return scores.empty() ? 0.0f : scores[size_t(id)]; }

    // Checks lengths of the parallel arrays, the special ids and the kind's
    // requirements; the error names the offending field.
    Status validate() const;
};

// Reads tokenizer.ggml.{model, pre, tokens, scores, token_type, merges,
// bos/eos/unknown/padding/eot/eom_token_id, add_bos_token, add_eos_token,
// add_space_prefix}. Missing optional keys take the usual defaults of the
// kind (SPM: bos 1, eos 2, unk 0, add_bos and add_space_prefix on).
Result<Vocab> load_vocab(const gguf::File& file);

}  // namespace tern::text
