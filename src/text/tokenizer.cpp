// Tokenizer: splits out special tokens (a byte trie, leftmost-longest match),
// hands the text between them to the vocabulary's model, and undoes both.
#include "text/tokenizer.h"

#include <algorithm>
#include <optional>

#include "text/bpe.h"
#include "text/pretokenize.h"
#include "text/spm.h"

namespace tern::text {

namespace {

// Texts of special tokens in a byte trie, so finding the longest one that
// starts at a position costs at most its length.
class SpecialTrie {
public:
    SpecialTrie() : nodes_(1) {}

    void add(std::string_view text, int32_t id, bool control) {
        size_t node = 0;
        for (char c : text) {
            const uint8_t b = uint8_t(c);
            auto& ch = nodes_[node].children;
            auto it = std::lower_bound(ch.begin(), ch.end(), b,
                                       [](const std::pair<uint8_t, uint32_t>& e, uint8_t v) { return e.first < v; });
            if (it == ch.end() || it->first != b) {
                const uint32_t fresh = uint32_t(nodes_.size());
                it = ch.insert(it, {b, fresh});
                nodes_.emplace_back();  // may move `ch`; `fresh` stays right
                node = fresh;
            } else {
                node = it->second;
            }
        }
        int32_t& slot = control ? nodes_[node].control : nodes_[node].user;
        if (slot < 0) slot = id;  // a repeated text keeps its first id
    }

    // Longest special token starting at text[pos]: {id, length}, or {-1, 0}.
    std::pair<int32_t, size_t> match(std::string_view text, size_t pos, bool with_control) const {
        std::pair<int32_t, size_t> best{-1, 0};
        size_t node = 0;
        for (size_t i = pos; i < text.size(); ++i) {
            const uint8_t b = uint8_t(text[i]);
            const auto& ch = nodes_[node].children;
            auto it = std::lower_bound(ch.begin(), ch.end(), b,
                                       [](const std::pair<uint8_t, uint32_t>& e, uint8_t v) { return e.first < v; });
            if (it == ch.end() || it->first != b) break;
            node = it->second;
            const Node& n = nodes_[node];
            if (n.user >= 0) best = {n.user, i + 1 - pos};
            else if (with_control && n.control >= 0) best = {n.control, i + 1 - pos};
        }
        return best;
    }

    bool empty() const { return nodes_[0].children.empty(); }

private:
    struct Node {
        std::vector<std::pair<uint8_t, uint32_t>> children;  // sorted by byte
        int32_t user = -1;
        int32_t control = -1;
    };
    std::vector<Node> nodes_;
};

// Control tokens that end a turn in common chat formats, beyond eos/eot/eom.
constexpr std::string_view kTurnEnders[] = {"<|im_end|>", "<|eot_id|>",    "<|eom_id|>", "<|end|>",
                                            "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>"};

}  // namespace

struct Tokenizer::Impl {
    Vocab vocab;
    std::optional<PreTokenizer> pre;  // BPE only
    std::optional<BpeModel> bpe;
    std::optional<SpmModel> spm;
    SpecialTrie specials;
    std::vector<bool> eog;  // by id
    std::string no_pre;

    bool spm_kind() const { return vocab.kind == VocabKind::Spm; }
    bool in_range(int32_t id) const { return id >= 0 && id < vocab.size(); }
    bool special(int32_t id) const {
        const TokenType t = vocab.type(id);
        return t == TokenType::Control || t == TokenType::UserDefined;
    }
};

Result<Tokenizer> Tokenizer::create(Vocab vocab) {
    if (Status s = vocab.validate(); !s) return Error{s.message()};
    auto impl = std::make_shared<Impl>();
    impl->vocab = std::move(vocab);
    const Vocab& v = impl->vocab;

    if (v.kind == VocabKind::Bpe) {
        auto pre = PreTokenizer::create(v.pre);
        if (!pre) return Error{"tokenizer: " + pre.error().message};
        auto bpe = BpeModel::create(v, pre->ignore_merges());
        if (!bpe) return Error{"tokenizer: " + bpe.error().message};
        impl->pre = std::move(pre.value());
        impl->bpe = std::move(bpe.value());
    } else {
        impl->spm.emplace(v);
    }

    impl->eog.assign(size_t(v.size()), false);
    for (int32_t id : {v.eos_id, v.eot_id, v.eom_id})
        if (id >= 0) impl->eog[size_t(id)] = true;
    for (int32_t id = 0; id < v.size(); ++id) {
        const TokenType t = v.type(id);
        const std::string& text = v.tokens[size_t(id)];
        if (t != TokenType::Control && t != TokenType::UserDefined) continue;
        if (!text.empty()) impl->specials.add(text, id, t == TokenType::Control);
        for (std::string_view ender : kTurnEnders)
            if (text == ender) impl->eog[size_t(id)] = true;
    }
    return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
    const Impl& im = *impl_;
    const Vocab& v = im.vocab;
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (add_special && v.add_bos) out.push_back(v.bos_id);

    // SPM puts a space in front of a text fragment at the start or after a
    // special token, as SentencePiece does for each piece of text it sees.
    bool after_special = true;
    std::vector<std::string_view> pieces;
    auto encode_text = [&](std::string_view frag) {
        if (im.spm) {
            std::string escaped;
            if (v.add_space_prefix && after_special) escaped.append(kSpmSpace);
            escaped += spm_escape_spaces(frag);
            im.spm->encode(escaped, out);
        } else {
            pieces.clear();
            im.pre->split(frag, pieces);
            for (std::string_view p : pieces) im.bpe->encode_piece(p, out);
        }
        after_special = false;
    };

    size_t text_start = 0;
    size_t i = 0;
    while (i < text.size()) {
        const auto [id, len] = im.specials.empty() ? std::pair<int32_t, size_t>{-1, 0}
                                                   : im.specials.match(text, i, parse_special);
        if (id < 0) {
            ++i;
            continue;
        }
        if (i > text_start) encode_text(text.substr(text_start, i - text_start));
        out.push_back(id);
        after_special = true;
        i += len;
        text_start = i;
    }
    if (text_start < text.size()) encode_text(text.substr(text_start));

    if (add_special && v.add_eos) out.push_back(v.eos_id);
    return out;
}

std::string Tokenizer::raw_piece(int32_t id) const {
    const Impl& im = *impl_;
    if (!im.in_range(id)) return {};
    const std::string& text = im.vocab.tokens[size_t(id)];
    if (im.special(id)) return text;
    if (im.spm_kind()) {
        if (im.vocab.type(id) == TokenType::Byte) {
            const int b = spm_byte_token_value(text);
            if (b >= 0) return std::string(1, char(b));
        }
        return text;
    }
    return bpe_text_to_bytes(text);
}

std::string Tokenizer::token_to_piece(int32_t id) const {
    if (!impl_->in_range(id)) return {};
    if (impl_->spm_kind() && !impl_->special(id)) return spm_unescape_spaces(raw_piece(id));
    return raw_piece(id);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
    const Impl& im = *impl_;
    std::string out;
    std::string run;  // raw bytes of the text tokens since the last special token
    bool run_at_fragment_start = true;
    auto flush_run = [&] {
        if (run.empty()) return;
        std::string text = im.spm_kind() ? spm_unescape_spaces(run) : std::move(run);
        if (strips_space_prefix() && run_at_fragment_start && !text.empty() && text[0] == ' ') text.erase(0, 1);
        out += text;
        run.clear();
        run_at_fragment_start = false;
    };
    for (int32_t id : ids) {
        if (!im.in_range(id)) continue;
        if (im.special(id)) {
            flush_run();
            if (!(skip_special && im.vocab.type(id) == TokenType::Control)) out += im.vocab.tokens[size_t(id)];
            run_at_fragment_start = true;
            continue;
        }
        run += raw_piece(id);
    }
    flush_run();
    return out;
}

bool Tokenizer::is_eog(int32_t id) const { return impl_->in_range(id) && impl_->eog[size_t(id)]; }

bool Tokenizer::is_special(int32_t id) const { return impl_->in_range(id) && impl_->special(id); }

bool Tokenizer::is_control(int32_t id) const {
    return impl_->in_range(id) && impl_->vocab.type(id) == TokenType::Control;
}

const Vocab& Tokenizer::vocab() const { return impl_->vocab; }

const std::string& Tokenizer::pre_name() const { return impl_->pre ? impl_->pre->name() : impl_->no_pre; }

bool Tokenizer::unescapes_spaces() const { return impl_->spm_kind(); }

bool Tokenizer::strips_space_prefix() const { return impl_->spm_kind() && impl_->vocab.add_space_prefix; }

}  // namespace tern::text
