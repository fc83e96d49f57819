// PCRE2-backed pre-tokenizer. Each stage splits every piece of the previous
// stage into its matches and the gaps between them (both kept), the way a
// Hugging Face "Sequence" of Split / ByteLevel pre-tokenizers does.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/pretokenize.h"

#include <pcre2.h>

#include "text/utf8.h"

namespace tern::text {

namespace {

// GPT-2's pattern: contractions, optionally space-led letter / digit /
// symbol runs, and whitespace (a run before a word leaves its last space to
// that word).
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3: contractions in any case, a letter run may take one leading
// non-letter non-digit (not a newline), digits in groups of up to three,
// symbol runs take trailing newlines, newline runs take leading spaces.
constexpr const char* kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2: as Llama 3 but every digit stands alone.
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// SmolLM / StarCoder: digits split off one by one first, then GPT-2.
constexpr const char* kEachDigit = R"(\p{N})";

struct Preset {
    const char* names[4];
    const char* stages[2];
    bool ignore_merges;
};

const Preset kPresets[] = {
    {{"gpt2", "default", "", nullptr}, {kGpt2, nullptr}, false},
    {{"llama3", "llama-bpe", "smaug-bpe", nullptr}, {kLlama3, nullptr}, true},
    {{"qwen2", "deepseek-r1-qwen", nullptr, nullptr}, {kQwen2, nullptr}, false},
    {{"smollm", "starcoder", "refact", nullptr}, {kEachDigit, kGpt2}, false},
};

}  // namespace

struct PreTokenizer::Regex {
    std::string pattern;
    pcre2_code* code = nullptr;
    bool jit = false;
    ~Regex() { pcre2_code_free(code); }
};

Result<PreTokenizer> PreTokenizer::create(std::string_view pre_name) {
    const Preset* preset = nullptr;
    std::string known;
    for (const Preset& p : kPresets) {
        for (const char* n : p.names) {
            if (n == nullptr) break;
            if (pre_name == n) preset = &p;
            if (*n != '\0') known += std::string(known.empty() ? "" : ", ") + n;
        }
    }
    if (preset == nullptr)
        return Error{"pre-tokenizer \"" + std::string(pre_name) + "\" is not supported (known: " + known + ")"};

    PreTokenizer pt;
    pt.name_ = std::string(pre_name);
    pt.ignore_merges_ = preset->ignore_merges;
    for (const char* pattern : preset->stages) {
        if (pattern == nullptr) break;
        auto re = std::make_shared<Regex>();
        re->pattern = pattern;
        int err = 0;
        PCRE2_SIZE err_offset = 0;
        // MATCH_INVALID_UTF: arbitrary bytes are legal subjects; invalid
        // sequences simply never match.
        re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
        if (re->code == nullptr) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            return Error{"pre-tokenizer \"" + pt.name_ + "\": pattern fails to compile at offset " +
                         std::to_string(err_offset) + ": " + reinterpret_cast<const char*>(msg)};
        }
        re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
        pt.stages_.push_back(std::move(re));
    }
    return pt;
}

std::vector<std::string> PreTokenizer::patterns() const {
    std::vector<std::string> out;
    for (const auto& s : stages_) out.push_back(s->pattern);
    return out;
}

namespace {

struct MatchData {
    pcre2_match_data* md;
    explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {}
    ~MatchData() { pcre2_match_data_free(md); }
    MatchData(const MatchData&) = delete;
    MatchData& operator=(const MatchData&) = delete;
};

// Splits one piece by one regex into matches and gaps.
void split_piece(const pcre2_code* code, bool jit, pcre2_match_data* md, std::string_view piece,
                 std::vector<std::string_view>& out) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
    size_t pos = 0;
    size_t gap_start = 0;
    while (pos < piece.size()) {
        int rc = pcre2_match(code, subject, piece.size(), pos, 0, md, nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && jit)  // very long runs: the interpreter keeps its frames on the heap
            rc = pcre2_match(code, subject, piece.size(), pos, PCRE2_NO_JIT, md, nullptr);
        // No match, or a resource limit: the rest stays one piece, which the
        // byte-level BPE still encodes losslessly.
        if (rc < 0) break;
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t start = ov[0];
        const size_t end = ov[1];
        if (start < pos || end < start || end > piece.size()) break;  // never expected; do not trust it
        if (end == start) {  // an empty match cannot split anything; step over one character
            pos = start + utf8_decode(piece, start).len;
            continue;
        }
        if (start > gap_start) out.push_back(piece.substr(gap_start, start - gap_start));
        out.push_back(piece.substr(start, end - start));
        pos = gap_start = end;
    }
    if (gap_start < piece.size()) out.push_back(piece.substr(gap_start));
}

}  // namespace

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
    if (text.empty()) return;
    std::vector<std::string_view> current{text};
    std::vector<std::string_view> next;
    for (size_t s = 0; s < stages_.size(); ++s) {
        const Regex& re = *stages_[s];
        MatchData md(re.code);
        std::vector<std::string_view>& dst = s + 1 == stages_.size() ? out : next;
        if (md.md == nullptr) {  // out of memory: keep pieces unsplit
            dst.insert(dst.end(), current.begin(), current.end());
        } else {
            for (std::string_view piece : current) split_piece(re.code, re.jit, md.md, piece, dst);
        }
        if (&dst == &next) {
            current.swap(next);
            next.clear();
        }
    }
}

}  // namespace tern::text
