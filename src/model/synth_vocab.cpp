// Tokenizer sections for synthetic models, laid out like the real ones so any
// GGUF consumer can load them: a SentencePiece vocabulary (Llama 2: <unk>, <s>,
// </s>, 256 byte-fallback tokens, then scored pieces) or a byte-level BPE one
// (Llama 3 / Qwen2: the 256 byte symbols, tokens made by merges that are listed
// in rank order, then special tokens). The pieces are generated, not learned,
// but every token is distinct valid UTF-8 and every merge joins two earlier
// tokens into the token that follows them.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>
#include <unordered_set>

#include "model/synth.h"

namespace tern::model {
namespace {

void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

// A small fixed generator: the vocabulary must not change with the weight seed.
struct SplitMix {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    // Uniform in [0, n).
    size_t below(size_t n) { return size_t((next() >> 11) % n); }
    // Skewed toward 0: early (short, common) tokens are picked more often.
    size_t skewed_below(size_t n) {
        const double u = double(next() >> 11) * (1.0 / 9007199254740992.0);
        return std::min(n - 1, size_t(u * u * double(n)));
    }
};

// ---- SentencePiece ------------------------------------------------------------

// Characters pieces are built from: letters by rough English frequency, then
// digits, punctuation and a few multi-byte characters so detokenization of
// non-ASCII text gets exercised.
const std::vector<std::string>& piece_alphabet() {
    static const std::vector<std::string> alphabet = [] {
        std::vector<std::string> a;
        for (char c : std::string("etaoinshrdlcumwfgypbvkjxqz")) a.emplace_back(1, c);
        for (char c : std::string("ETAOINSHRDLCUMWFGYPBVKJXQZ")) a.emplace_back(1, c);
        for (char c : std::string("0123456789.,'-!?:;()\"")) a.emplace_back(1, c);
        for (const char* s : {"é", "ü", "ñ", "ö", "ß", "я", "中", "的"}) a.emplace_back(s);
        return a;
    }();
    return alphabet;
}

// Appends pieces until `tokens` holds `count` entries: "▁" alone, then every
// string over the alphabet by increasing length, each as a word start ("▁s")
// and as a continuation ("s").
void append_pieces(std::vector<std::string>& tokens, size_t count) {
    static const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's word marker
    const auto& alphabet = piece_alphabet();
    if (tokens.size() < count) tokens.push_back(kSpace);
    std::vector<size_t> digits;
    while (tokens.size() < count) {
        // Odometer over strings of length digits.size(); grows when it wraps.
        size_t k = digits.size();
        while (k > 0 && ++digits[k - 1] == alphabet.size()) digits[--k] = 0;
        if (k == 0) digits.assign(digits.size() + 1, 0);
        std::string s;
        for (size_t d : digits) s += alphabet[d];
        tokens.push_back(kSpace + s);
        if (tokens.size() < count) tokens.push_back(s);
    }
}

SynthVocab sentencepiece_vocab(const SynthShape& shape) {
    SynthVocab v;
    v.model = "llama";
    v.pre = "default";
    const size_t n = size_t(shape.n_vocab);
    v.tokens = {"<unk>", "<s>", "</s>"};
    v.token_types = {kTokenUnknown, kTokenControl, kTokenControl};
    for (int b = 0; b < 256; ++b) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "<0x%02X>", b);
        v.tokens.emplace_back(buf);
        v.token_types.push_back(kTokenByte);
    }
    const size_t first_piece = v.tokens.size();
    append_pieces(v.tokens, n);
    v.token_types.resize(n, kTokenNormal);
    // Fixed tokens score 0; pieces score by rank, most frequent first.
    v.scores.assign(n, 0.0f);
    for (size_t i = first_piece; i < n; ++i) v.scores[i] = -float(i - first_piece);
    v.unk_id = 0;
    v.bos_id = 1;
    v.eos_id = 2;
    v.add_bos = true;
    return v;
}

// ---- byte-level BPE -----------------------------------------------------------

// The byte-to-symbol table of byte-level BPE: printable Latin-1 bytes stand for
// themselves, the other 68 bytes are mapped to U+0100 and up, so every token is
// printable text. Returns the symbols in vocabulary order (printable first).
std::vector<std::pair<uint8_t, std::string>> byte_symbols() {
    std::vector<std::pair<uint8_t, std::string>> out;
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
    for (int b = 0; b < 256; ++b)
        if (printable(b)) {
            std::string s;
            append_utf8(s, uint32_t(b));
            out.emplace_back(uint8_t(b), s);
        }
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b)
        if (!printable(b)) {
            std::string s;
            append_utf8(s, next++);
            out.emplace_back(uint8_t(b), s);
        }
    return out;
}

struct BpeLayout {
    size_t n_regular;                   // byte symbols + merged tokens
    std::vector<std::string> specials;  // control tokens after the regular ones
    size_t n_padding;                   // unused "[PADn]" tokens at the end
};

// Llama 3 ends its vocabulary with 256 control tokens; Qwen2 with three, padded
// with unused tokens up to the embedding size when that exceeds the 151646
// tokens the tokenizer defines.
Result<BpeLayout> bpe_layout(const SynthShape& shape) {
    const size_t n = size_t(shape.n_vocab);
    BpeLayout l{};
    if (shape.bpe_pre == "qwen2") {
        l.specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
        constexpr size_t kQwen2Defined = 151646;
        l.n_padding = n > kQwen2Defined ? n - kQwen2Defined : 0;
    } else {
        l.specials = {"<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                      "<|reserved_special_token_1|>", "<|reserved_special_token_2|>",
                      "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
                      "<|reserved_special_token_4|>", "<|eot_id|>"};
        for (int r = 5; l.specials.size() < 256; ++r)
            l.specials.push_back("<|reserved_special_token_" + std::to_string(r) + "|>");
        l.n_padding = 0;
    }
    const size_t fixed = 256 + l.specials.size() + l.n_padding;
    if (n < fixed + 1)
        return Error{"vocabulary of " + std::to_string(n) + " tokens is too small for a BPE tokenizer with " +
                     std::to_string(l.specials.size()) + " special tokens (need at least " +
                     std::to_string(fixed + 1) + ")"};
    l.n_regular = n - l.specials.size() - l.n_padding;
    return l;
}

// Appends merged tokens until there are n_regular regular tokens. A word-start
// token (beginning with the space symbol) or a continuation is extended by a
// continuation, mostly a single frequent letter, so tokens look like pieces
// of words ("Ġth", "ing") and short tokens come first.
void append_merges(SynthVocab& v, size_t n_regular) {
    static const std::string kSpaceSymbol = "\xC4\xA0";  // U+0120 'Ġ', the symbol of byte 0x20
    static const std::string kLetters = "etaoinshrdlcumwfgypbvkjxqz";
    constexpr size_t kMaxBytes = 16;                      // keeps tokens word-sized
    std::unordered_set<std::string> seen(v.tokens.begin(), v.tokens.end());
    auto id_of = [&v](const std::string& t) {
        return size_t(std::find(v.tokens.begin(), v.tokens.end(), t) - v.tokens.begin());
    };
    std::vector<size_t> starts{id_of(kSpaceSymbol)}, continuations;
    for (char c : kLetters) continuations.push_back(id_of(std::string(1, c)));
    for (char c : kLetters) continuations.push_back(id_of(std::string(1, char(std::toupper(c)))));
    SplitMix rng{0x5EED0F7E4B0C0DE5ull};
    while (v.tokens.size() < n_regular) {
        const bool word_start = rng.below(2) == 0;
        const std::vector<size_t>& left_pool = word_start ? starts : continuations;
        const size_t left = left_pool[rng.skewed_below(left_pool.size())];
        const size_t right = rng.below(10) < 7 ? continuations[rng.skewed_below(kLetters.size())]
                                               : continuations[rng.skewed_below(continuations.size())];
        std::string merged = v.tokens[left] + v.tokens[right];
        if (merged.size() > kMaxBytes || !seen.insert(merged).second) continue;
        v.merges.push_back(v.tokens[left] + " " + v.tokens[right]);
        (word_start ? starts : continuations).push_back(v.tokens.size());
        v.tokens.push_back(std::move(merged));
        v.token_types.push_back(kTokenNormal);
    }
}

Result<SynthVocab> bpe_vocab(const SynthShape& shape) {
    auto layout = bpe_layout(shape);
    if (!layout) return layout.error();
    SynthVocab v;
    v.model = "gpt2";
    v.pre = shape.bpe_pre.empty() ? "llama-bpe" : shape.bpe_pre;
    for (auto& [byte, symbol] : byte_symbols()) {
        (void)byte;
        v.tokens.push_back(symbol);
        v.token_types.push_back(kTokenNormal);
    }
    append_merges(v, layout->n_regular);
    const int32_t first_special = int32_t(v.tokens.size());
    for (const std::string& s : layout->specials) {
        v.tokens.push_back(s);
        v.token_types.push_back(kTokenControl);
    }
    for (size_t p = 0; p < layout->n_padding; ++p) {
        v.tokens.push_back("[PAD" + std::to_string(v.tokens.size()) + "]");
        v.token_types.push_back(kTokenUnused);
    }
    if (v.pre == "qwen2") {
        v.bos_id = first_special;      // <|endoftext|>
        v.pad_id = first_special;
        v.eos_id = first_special + 2;  // <|im_end|>
        v.add_bos = false;
        v.chat_template =
            "{%- for message in messages %}"
            "{%- if loop.first and message['role'] != 'system' %}"
            "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
            "{%- endif %}"
            "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
            "{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
    } else {
        v.bos_id = first_special;      // <|begin_of_text|>
        v.eos_id = first_special + 9;  // <|eot_id|>
        v.add_bos = true;
        v.chat_template =
            "{{- bos_token }}"
            "{%- for message in messages %}"
            "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
            "message['content'] | trim + '<|eot_id|>' }}"
            "{%- endfor %}"
            "{%- if add_generation_prompt %}"
            "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
            "{%- endif %}";
    }
    return v;
}

}  // namespace

Result<SynthVocab> synth_vocab(const SynthShape& shape) {
    if (shape.tokenizer == SynthTokenizer::Gpt2Bpe) return bpe_vocab(shape);
    constexpr int64_t kFixed = 3 + 256;
    if (shape.n_vocab < kFixed + 1)
        return Error{"vocabulary of " + std::to_string(shape.n_vocab) +
                     " tokens is too small for a SentencePiece tokenizer (need at least " +
                     std::to_string(kFixed + 1) + ")"};
    return sentencepiece_vocab(shape);
}

}  // namespace tern::model
