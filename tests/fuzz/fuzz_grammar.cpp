// libFuzzer entry for runtime/grammar: the input is a GBNF grammar, then
// (after a NUL byte) text to feed the matcher in pieces of 1-4 bytes, each
// first asked of allows() and taken by accept(). Besides memory safety it
// checks the matcher's own promises: accept() agrees with allows(), a
// refused piece leaves the state unchanged, an error names something.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/grammar.h"

namespace {
void require(bool ok) {
    if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view all(reinterpret_cast<const char*>(data), size);
    const size_t cut = all.find('\0');
    const std::string_view text = all.substr(0, cut);
    const std::string_view feed = cut == std::string_view::npos ? std::string_view() : all.substr(cut + 1);

    auto g = tern::runtime::Grammar::parse(text);
    if (!g.ok()) {
        require(!g.error().message.empty());
        return 0;
    }
    tern::runtime::GrammarMatcher m(*g);
    for (size_t i = 0; i < feed.size();) {
        const size_t n = std::min<size_t>(1 + uint8_t(feed[i]) % 4, feed.size() - i);
        const std::string_view piece = feed.substr(i, n);
        i += n;
        const bool allowed = m.allows(piece);
        const bool could_end = m.can_end(), could_go_on = m.can_continue();
        const bool took = m.accept(piece);
        if (!m.error().empty()) break;  // too ambiguous: refused, and said so
        require(took == allowed);
        if (!took) require(m.can_end() == could_end && m.can_continue() == could_go_on);
    }
    return 0;
}
