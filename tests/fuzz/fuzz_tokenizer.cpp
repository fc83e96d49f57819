// libFuzzer target for the tokenizers: arbitrary bytes through the regex
// pre-tokenizers, byte-level BPE, SentencePiece-style encoding, decoding and
// the streaming detokenizer, on small hand-built vocabularies (and on the
// model named by TERN_MODEL when set). Beyond "no crash, no sanitizer
// report" it checks the round-trip and UTF-8 guarantees the API promises.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "text/bpe.h"
#include "text/detok.h"
#include "text/pretokenize.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

using namespace tern;
using namespace tern::text;

namespace {

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "fuzz_tokenizer: %s\n", what);
    std::abort();
}

Tokenizer must(Result<Tokenizer> t) {
    if (!t) {
        std::fprintf(stderr, "fuzz_tokenizer: %s\n", t.error().message.c_str());
        std::abort();
    }
    return std::move(t.value());
}

void add_token(Vocab& v, std::string text, TokenType type, float score = 0) {
    v.tokens.push_back(std::move(text));
    v.types.push_back(type);
    v.scores.push_back(score);
}

// Byte-level BPE: all 256 bytes (or all but a few), merges over common
// letters and multi-byte characters, a control and a user-defined token.
Tokenizer make_bpe(const char* pre, bool drop_some_bytes) {
    Vocab v;
    v.kind = VocabKind::Bpe;
    v.pre = pre;
    for (int b = 0; b < 256; ++b) {
        const bool dropped = drop_some_bytes && (b == 0x04 || b == 0xC0 || b >= 0xF5);
        add_token(v, dropped ? "unused" + std::to_string(b) : bpe_bytes_to_text(std::string(1, char(b))),
                  TokenType::Normal);
    }
    const char* pairs[][2] = {{"t", "h"}, {"th", "e"}, {" ", "the"}, {"i", "n"}, {" ", "a"}, {"e", "r"},
                              {"\xE4", "\xB8"}, {"\xE4\xB8", "\xAD"}, {"\xF0", "\x9F"}, {"1", "2"}, {"!", "!"},
                              {"\n", "\n"}, {" ", " "}, {"  ", "  "}};
    for (const auto& p : pairs) {
        const std::string l = bpe_bytes_to_text(p[0]), r = bpe_bytes_to_text(p[1]);
        v.merges.push_back(l + " " + r);
        add_token(v, l + r, TokenType::Normal);
    }
    add_token(v, "<|ctl|>", TokenType::Control);
    v.eos_id = v.size() - 1;
    add_token(v, "<user>", TokenType::UserDefined);
    return must(Tokenizer::create(std::move(v)));
}

// SentencePiece-style with byte fallback and the space prefix.
Tokenizer make_spm() {
    Vocab v;
    v.kind = VocabKind::Spm;
    add_token(v, "<unk>", TokenType::Unknown);
    add_token(v, "<s>", TokenType::Control);
    add_token(v, "</s>", TokenType::Control);
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        add_token(v, name, TokenType::Byte);
    }
    const std::string sp = "\xE2\x96\x81";
    const char* pieces[] = {"a", "b", "e", "t", "h", "th", "the", "in", "中", "文", "中文", "ü"};
    float score = -1;
    for (const char* p : pieces) {
        add_token(v, p, TokenType::Normal, score);
        add_token(v, sp + p, TokenType::Normal, score + 0.5f);
        score -= 0.25f;
    }
    add_token(v, sp, TokenType::Normal, -3);
    add_token(v, sp + sp, TokenType::Normal, -4);
    add_token(v, "<user>", TokenType::UserDefined);
    v.unk_id = 0;
    v.bos_id = 1;
    v.eos_id = 2;
    v.add_bos = true;
    v.add_space_prefix = true;
    return must(Tokenizer::create(std::move(v)));
}

std::unique_ptr<Tokenizer> load_model_tokenizer() {
    const char* path = std::getenv("TERN_MODEL");
    if (path == nullptr || *path == '\0') return nullptr;
    auto file = gguf::File::open(path);
    if (!file) fail(file.error().message.c_str());
    auto vocab = load_vocab(**file);
    if (!vocab) fail(vocab.error().message.c_str());
    return std::make_unique<Tokenizer>(must(Tokenizer::create(std::move(vocab.value()))));
}

struct Fixture {
    std::vector<Tokenizer> tokenizers;
    std::vector<bool> exact;  // every byte encodable: decode(encode(s)) == s
    std::vector<PreTokenizer> pres;
    Fixture() {
        tokenizers.push_back(make_bpe("llama3", false));
        exact.push_back(true);
        tokenizers.push_back(make_bpe("smollm", true));
        exact.push_back(false);
        tokenizers.push_back(make_bpe("qwen2", false));
        exact.push_back(true);
        tokenizers.push_back(make_spm());
        exact.push_back(true);
        if (auto m = load_model_tokenizer()) {
            tokenizers.push_back(*m);
            exact.push_back(false);
        }
        for (const char* name : {"gpt2", "llama3", "qwen2", "smollm"}) {
            auto p = PreTokenizer::create(name);
            if (!p) fail(p.error().message.c_str());
            pres.push_back(std::move(p.value()));
        }
    }
};

void check_tokenizer(const Tokenizer& tok, bool exact, std::string_view text, bool add_special, bool parse_special) {
    const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
    for (int32_t id : ids)
        if (id < 0 || id >= tok.n_vocab()) fail("encode produced an id outside the vocabulary");
    if (!parse_special) {
        for (size_t i = 0; i < ids.size(); ++i) {
            const bool added = add_special && ((i == 0 && tok.vocab().add_bos) ||
                                               (i + 1 == ids.size() && tok.vocab().add_eos));
            if (!added && tok.is_control(ids[i])) fail("control token without parse_special");
        }
    }
    // Round trip, with what add_special added taken off again.
    std::vector<int32_t> body = ids;
    if (add_special && tok.vocab().add_eos && !body.empty()) body.pop_back();
    if (add_special && tok.vocab().add_bos && !body.empty()) body.erase(body.begin());
    const std::string decoded = tok.decode(body);
    const bool has_spm_space = tok.unescapes_spaces() && text.find("\xE2\x96\x81") != std::string_view::npos;
    if (exact && !has_spm_space && decoded != text) fail("decode(encode(s)) != s");
    // Streaming: every chunk valid UTF-8, all chunks == sanitized decode.
    Detokenizer detok(tok, false, true);
    std::string streamed;
    for (int32_t id : body) {
        const std::string chunk = detok.push(id);
        if (!utf8_is_valid(chunk)) fail("detokenizer emitted invalid UTF-8");
        streamed += chunk;
    }
    const std::string tail = detok.finish();
    if (!utf8_is_valid(tail)) fail("detokenizer flushed invalid UTF-8");
    streamed += tail;
    if (streamed != utf8_sanitize(decoded)) fail("streamed text != sanitized decode");
    for (int32_t id : body) (void)tok.token_to_piece(id);
    (void)tok.is_eog(ids.empty() ? -1 : ids.back());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const Fixture fx;
    if (size == 0) return 0;
    const uint8_t flags = data[0];
    const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

    const PreTokenizer& pre = fx.pres[flags % fx.pres.size()];
    std::vector<std::string_view> pieces;
    pre.split(text, pieces);
    size_t covered = 0;
    for (std::string_view p : pieces) {
        if (p.empty() || p.data() != text.data() + covered) fail("pre-tokenizer pieces are not consecutive");
        covered += p.size();
    }
    if (covered != text.size()) fail("pre-tokenizer pieces do not cover the text");

    const size_t which = (flags >> 2) % fx.tokenizers.size();
    check_tokenizer(fx.tokenizers[which], fx.exact[which], text, flags & 0x40, flags & 0x80);

    const std::string clean = utf8_sanitize(text);
    if (!utf8_is_valid(clean)) fail("sanitize left invalid UTF-8");
    const size_t tail = utf8_incomplete_tail(text);
    if (tail > 3 || tail > text.size()) fail("incomplete tail too long");
    return 0;
}
