// The regex pre-tokenizer of byte-level BPE vocabularies: text is cut into
// pieces (words, number groups, punctuation runs, whitespace) before merges
// run, so merges never cross a piece boundary. Which regexes apply is named
// by tokenizer.ggml.pre; they are matched with PCRE2 in UTF mode with Unicode
// properties (\p{L}, \p{N}, and \s over all Unicode white space).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace tern::text {

class PreTokenizer {
public:
    // An error for a name without known regexes (the message lists the known ones).
    static Result<PreTokenizer> create(std::string_view pre_name);

    // Appends the pieces of `text` to out. The pieces are consecutive and
    // cover text exactly, so their concatenation is text. Bytes that are not
    // valid UTF-8 match no pattern and come out as pieces of their own.
    void split(std::string_view text, std::vector<std::string_view>& out) const;

    // Llama 3 style vocabularies look a whole piece up in the vocabulary
    // before merging (HF "ignore_merges").
    bool ignore_merges() const { return ignore_merges_; }
    const std::string& name() const { return name_; }

    // The pattern of each stage, for tests and `tern info`.
    std::vector<std::string> patterns() const;

private:
    struct Regex;
    std::vector<std::shared_ptr<const Regex>> stages_;  // applied in order, each to every piece of the last
    bool ignore_merges_ = false;
    std::string name_;
};

}  // namespace tern::text
