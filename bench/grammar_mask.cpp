// The per-token cost of grammar-constrained sampling on a model's real
// vocabulary: building the token trie once, checking one drawn token
// (allows), and the full mask (the walk a missed draw pays), at every token
// boundary of a JSON text walked through a JSON grammar.
//   grammar_mask MODEL.gguf [GRAMMAR.gbnf [TEXT]]
// Prints medians and maxima in microseconds; compare the mask with the
// decode step's time (docs/server.md, "Structured output").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "runtime/grammar.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

const char* kJsonGrammar = R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
)";
const char* kJsonText =
    "{\"name\": \"Mae\", \"age\": 10, \"tags\": [\"small\", \"grey\"], \"description\": \"a cat who sleeps "
    "in the sun and chases moths at night\", \"weight_kg\": 3.5, \"indoor\": true}";

std::string read_file(const char* path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

struct Stats {
    std::vector<double> v;
    void add(double x) { v.push_back(x); }
    double median() {
        std::sort(v.begin(), v.end());
        return v.empty() ? 0 : v[v.size() / 2];
    }
    double max() const { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
};

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: grammar_mask MODEL.gguf [GRAMMAR.gbnf [TEXT]]\n");
        return 2;
    }
    auto file = tern::gguf::File::open(argv[1]);
    if (!file) return std::fprintf(stderr, "%s\n", file.error().message.c_str()), 1;
    auto vocab = tern::text::load_vocab(**file);
    if (!vocab) return std::fprintf(stderr, "%s\n", vocab.error().message.c_str()), 1;
    auto tok = tern::text::Tokenizer::create(std::move(*vocab));
    if (!tok) return std::fprintf(stderr, "%s\n", tok.error().message.c_str()), 1;
    const std::string grammar_text = argc > 2 ? read_file(argv[2]) : kJsonGrammar;
    const std::string text = argc > 3 ? argv[3] : kJsonText;
    auto grammar = tern::runtime::Grammar::parse(grammar_text);
    if (!grammar) return std::fprintf(stderr, "%s\n", grammar.error().message.c_str()), 1;

    auto t0 = Clock::now();
    const auto gv = tern::runtime::GrammarVocab::make(*tok);
    const double build_us = us_since(t0);

    const std::vector<int32_t> ids = tok->encode(text, false, false);
    tern::runtime::GrammarMatcher m(*grammar);
    std::vector<float> logits(size_t(tok->n_vocab()));
    Stats mask, allows;
    int allowed_sum = 0;
    for (int32_t id : ids) {
        std::fill(logits.begin(), logits.end(), 0.0f);
        t0 = Clock::now();
        m.mask(logits, *gv);
        mask.add(us_since(t0));
        for (float x : logits) allowed_sum += !std::isinf(x);
        t0 = Clock::now();
        const bool ok = m.allows(gv->bytes(id));
        allows.add(us_since(t0));
        if (!ok || !m.accept(gv->bytes(id))) {
            std::fprintf(stderr, "the text leaves the grammar at token %d ('%s')\n", id, gv->bytes(id).c_str());
            return 1;
        }
    }
    std::printf("vocabulary %d tokens, trie %zu nodes, built in %.1f ms\n", tok->n_vocab(), gv->nodes().size(),
                build_us / 1000);
    std::printf("%zu token boundaries; tokens allowed per step: %.0f on average\n", ids.size(),
                double(allowed_sum) / double(ids.size()));
    std::printf("allows (one drawn token): median %.2f us, max %.2f us\n", allows.median(), allows.max());
    std::printf("mask (every token):       median %.1f us, max %.1f us\n", mask.median(), mask.max());
    return 0;
}
