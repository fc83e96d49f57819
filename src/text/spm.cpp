// SentencePiece-style bigram merging driven by token scores.
#include "text/spm.h"

#include <queue>

#include "text/utf8.h"

namespace tern::text {

std::string spm_escape_spaces(std::string_view text) {
    std::string out;
    out.reserve(text.size() + text.size() / 4);
    for (char c : text) {
        if (c == ' ') out.append(kSpmSpace);
        else out.push_back(c);
    }
    return out;
}

std::string spm_unescape_spaces(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        if (text.substr(i, kSpmSpace.size()) == kSpmSpace) {
            out.push_back(' ');
            i += kSpmSpace.size();
        } else {
            out.push_back(text[i++]);
        }
    }
    return out;
}

int spm_byte_token_value(std::string_view text) {
    if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
    int value = 0;
    for (size_t i = 3; i < 5; ++i) {
        const char c = text[i];
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else return -1;
        value = value * 16 + d;
    }
    return value;
}

SpmModel::SpmModel(const Vocab& vocab) : unk_id_(vocab.unk_id) {
    byte_token_.fill(-1);
    scores_.resize(size_t(vocab.size()));
    int n_bytes = 0;
    for (int32_t id = 0; id < vocab.size(); ++id) {
        const std::string& text = vocab.tokens[size_t(id)];
        scores_[size_t(id)] = vocab.score(id);
        const TokenType t = vocab.type(id);
        if (t == TokenType::Normal || t == TokenType::Undefined) index_.add(text, id);
        if (t == TokenType::Byte) {
            const int b = spm_byte_token_value(text);
            if (b >= 0 && byte_token_[size_t(b)] < 0) {
                byte_token_[size_t(b)] = id;
                ++n_bytes;
            }
        }
    }
    has_byte_fallback_ = n_bytes > 0;
}

void SpmModel::encode(std::string_view text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    // One symbol per character; an invalid byte is a symbol of its own (it
    // can only come out through byte fallback).
    struct Symbol {
        size_t start;
        size_t len;  // 0 once merged into the symbol on its left
        int32_t prev, next;
    };
    std::vector<Symbol> sym;
    sym.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        const size_t len = utf8_decode(text, i).len;
        const int32_t k = int32_t(sym.size());
        sym.push_back({i, len, k - 1, -1});
        if (k > 0) sym[size_t(k - 1)].next = k;
        i += len;
    }

    struct Bigram {
        float score;
        int32_t left, right;
        size_t len;  // combined length when queued; a mismatch later means stale
        // Highest score first, then leftmost.
        bool operator<(const Bigram& o) const { return score != o.score ? score < o.score : left > o.left; }
    };
    std::priority_queue<Bigram> queue;
    auto consider = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) return;
        const size_t len = sym[size_t(l)].len + sym[size_t(r)].len;
        const int32_t id = index_.find(text.substr(sym[size_t(l)].start, len));
        if (id >= 0) queue.push({scores_[size_t(id)], l, r, len});
    };
    for (size_t i = 0; i + 1 < sym.size(); ++i) consider(int32_t(i), int32_t(i + 1));

    while (!queue.empty()) {
        const Bigram b = queue.top();
        queue.pop();
        Symbol& l = sym[size_t(b.left)];
        Symbol& r = sym[size_t(b.right)];
        if (l.len == 0 || r.len == 0 || l.next != b.right || l.len + r.len != b.len) continue;
        l.len += r.len;
        r.len = 0;
        l.next = r.next;
        if (l.next >= 0) sym[size_t(l.next)].prev = b.left;
        consider(l.prev, b.left);
        consider(b.left, l.next);
    }

    for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) {
        const std::string_view piece = text.substr(sym[size_t(i)].start, sym[size_t(i)].len);
        const int32_t id = index_.find(piece);
        if (id >= 0) {
            out.push_back(id);
            continue;
        }
        bool all_bytes = true;
        for (char c : piece) all_bytes = all_bytes && byte_token_[uint8_t(c)] >= 0;
        if (all_bytes) {
            for (char c : piece) out.push_back(byte_token_[uint8_t(c)]);
        } else if (unk_id_ >= 0) {
            out.push_back(unk_id_);
        }
    }
}

}  // namespace tern::text
