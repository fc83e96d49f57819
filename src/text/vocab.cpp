// Vocab checks that do not depend on where the vocabulary came from.
#include "text/vocab.h"

namespace tern::text {

const char* vocab_kind_name(VocabKind kind) {
    switch (kind) {
        case VocabKind::Spm: return "llama";
        case VocabKind::Bpe: return "gpt2";
    }
    return "?";
}

static bool id_ok(int32_t id, int32_t n) { return id == -1 || (id >= 0 && id < n); }

Status Vocab::validate() const {
    const int32_t n = size();
    if (tokens.empty()) return Error{"vocab: no tokens"};
    if (tokens.size() > size_t(INT32_MAX)) return Error{"vocab: too many tokens"};
    if (!scores.empty() && scores.size() != tokens.size())
        return Error{"vocab: scores has " + std::to_string(scores.size()) + " entries for " +
                     std::to_string(tokens.size()) + " tokens"};
    if (!types.empty() && types.size() != tokens.size())
        return Error{"vocab: token_type has " + std::to_string(types.size()) + " entries for " +
                     std::to_string(tokens.size()) + " tokens"};
    for (size_t i = 0; i < types.size(); ++i) {
        const int32_t t = int32_t(types[i]);
        if (t < 0 || t > int32_t(TokenType::Byte))
            return Error{"vocab: token " + std::to_string(i) + " has unknown token type " + std::to_string(t)};
    }
    const struct {
        const char* name;
        int32_t id;
    } ids[] = {{"bos_token_id", bos_id}, {"eos_token_id", eos_id}, {"unknown_token_id", unk_id},
               {"padding_token_id", pad_id}, {"eot_token_id", eot_id}, {"eom_token_id", eom_id}};
    for (const auto& s : ids) {
        if (!id_ok(s.id, n))
            return Error{std::string("vocab: ") + s.name + " " + std::to_string(s.id) +
                         " is outside the vocabulary of " + std::to_string(n)};
    }
    if (add_bos && bos_id < 0) return Error{"vocab: add_bos_token is set but there is no bos token"};
    if (add_eos && eos_id < 0) return Error{"vocab: add_eos_token is set but there is no eos token"};
    if (kind == VocabKind::Bpe && merges.empty()) return Error{"vocab: a gpt2 (BPE) vocabulary needs merges"};
    return {};
}

}  // namespace tern::text
