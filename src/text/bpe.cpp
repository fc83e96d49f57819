// Byte-level BPE merging with a priority queue, so a long piece costs
// O(n log n) rather than a rescan per merge.
#include "text/bpe.h"

#include <queue>

#include "text/utf8.h"

namespace tern::text {

namespace {

bool maps_to_itself(uint32_t b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

// The 68 remapped bytes take U+0100.. in byte order, so every mapped code
// point is below 256 + 68.
constexpr uint32_t kMappedLimit = 256 + 68;

struct ByteTable {
    std::array<uint32_t, 256> to_cp{};
    std::array<int16_t, kMappedLimit> from_cp{};
    ByteTable() {
        from_cp.fill(-1);
        uint32_t next = 256;
        for (uint32_t b = 0; b < 256; ++b) {
            to_cp[b] = maps_to_itself(b) ? b : next++;
            from_cp[to_cp[b]] = int16_t(b);
        }
    }
};

const ByteTable& byte_table() {
    static const ByteTable table;
    return table;
}

}  // namespace

uint32_t bpe_byte_to_codepoint(uint8_t b) { return byte_table().to_cp[b]; }

int bpe_codepoint_to_byte(uint32_t cp) { return cp < kMappedLimit ? byte_table().from_cp[cp] : -1; }

std::string bpe_bytes_to_text(std::string_view bytes) {
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes) utf8_append(out, bpe_byte_to_codepoint(uint8_t(c)));
    return out;
}

std::string bpe_text_to_bytes(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        const Utf8Char c = utf8_decode(text, i);
        const int b = c.valid ? bpe_codepoint_to_byte(c.cp) : -1;
        if (b >= 0) out.push_back(char(b));
        else out.append(text.substr(i, c.len));
        i += c.len;
    }
    return out;
}

static bool mergeable(TokenType t) {
    return t == TokenType::Normal || t == TokenType::Undefined || t == TokenType::Byte;
}

Result<BpeModel> BpeModel::create(const Vocab& vocab, bool ignore_merges) {
    BpeModel m;
    m.ignore_merges_ = ignore_merges;
    TokenIndex index;
    for (int32_t id = 0; id < vocab.size(); ++id) {
        if (!mergeable(vocab.type(id))) continue;
        index.add(vocab.tokens[size_t(id)], id);
    }
    int n_bytes = 0;
    for (uint32_t b = 0; b < 256; ++b) {
        std::string text;
        utf8_append(text, bpe_byte_to_codepoint(uint8_t(b)));
        m.byte_token_[b] = index.find(text);  // -1: this byte cannot be encoded
        n_bytes += m.byte_token_[b] >= 0;
    }
    if (n_bytes == 0)
        return Error{"BPE vocab has no tokens for the byte-level alphabet (\"Ġ\" for space, ...)"};
    m.merges_.reserve(vocab.merges.size());
    std::string joined;
    for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
        const std::string& line = vocab.merges[rank];
        // Mapped token text never holds a plain space, so the first one
        // separates the two parts.
        const size_t sp = line.find(' ', 1);
        if (sp == std::string::npos) continue;
        const std::string_view left = std::string_view(line).substr(0, sp);
        const std::string_view right = std::string_view(line).substr(sp + 1);
        const int32_t a = index.find(left);
        const int32_t b = index.find(right);
        joined.assign(left);
        joined.append(right);
        const int32_t r = index.find(joined);
        if (a < 0 || b < 0 || r < 0) continue;
        m.merges_.try_emplace(pair_key(a, b), Merge{int32_t(rank), r});
    }
    if (ignore_merges) m.whole_ = std::move(index);
    return m;
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.empty()) return;
    if (ignore_merges_) {
        const int32_t id = whole_.find(bpe_bytes_to_text(piece));
        if (id >= 0) {
            out.push_back(id);
            return;
        }
    }
    // Symbols form a linked list; a merged symbol lives at the position of
    // its left part. A byte without a token is dropped before merging (some
    // vocabularies lack bytes that never occur in UTF-8 text, and have no
    // byte fallback), as Hugging Face's BPE does.
    std::vector<int32_t> id;
    id.reserve(piece.size());
    for (char c : piece)
        if (byte_token_[uint8_t(c)] >= 0) id.push_back(byte_token_[uint8_t(c)]);
    const size_t n = id.size();
    if (n <= 1) {
        out.insert(out.end(), id.begin(), id.end());
        return;
    }
    std::vector<int32_t> next(n), prev(n);
    for (size_t i = 0; i < n; ++i) {
        next[i] = i + 1 < n ? int32_t(i + 1) : -1;
        prev[i] = int32_t(i) - 1;
    }
    struct Candidate {
        int32_t rank, left, right, left_id, right_id;
        // Lowest rank first, then leftmost.
        bool operator<(const Candidate& o) const {
            return rank != o.rank ? rank > o.rank : left > o.left;
        }
    };
    std::priority_queue<Candidate> queue;
    auto consider = [&](int32_t l, int32_t r) {
        if (l < 0 || r < 0) return;
        auto it = merges_.find(pair_key(id[size_t(l)], id[size_t(r)]));
        if (it != merges_.end()) queue.push({it->second.rank, l, r, id[size_t(l)], id[size_t(r)]});
    };
    for (size_t i = 0; i + 1 < n; ++i) consider(int32_t(i), int32_t(i + 1));

    while (!queue.empty()) {
        const Candidate c = queue.top();
        queue.pop();
        // Stale if either side has since been merged into something else.
        if (id[size_t(c.left)] != c.left_id || id[size_t(c.right)] != c.right_id || next[size_t(c.left)] != c.right)
            continue;
        const int32_t result = merges_.at(pair_key(c.left_id, c.right_id)).result;
        id[size_t(c.left)] = result;
        id[size_t(c.right)] = -1;
        const int32_t after = next[size_t(c.right)];
        next[size_t(c.left)] = after;
        if (after >= 0) prev[size_t(after)] = c.left;
        consider(prev[size_t(c.left)], c.left);
        consider(c.left, after);
    }
    for (int32_t i = 0; i >= 0; i = next[size_t(i)]) out.push_back(id[size_t(i)]);
}

}  // namespace tern::text
