// libFuzzer entry for runtime/json_schema: the input is a JSON document taken
// as a schema. Besides memory safety it checks the compiler's promise: a
// schema it accepts becomes a grammar that parses, and a refusal says why.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "runtime/grammar.h"
#include "runtime/json_schema.h"
#include "server/json_value.h"

namespace {
void require(bool ok) {
    if (!ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text, nullptr, false);
    if (doc.is_discarded()) return 0;
    auto schema = tern::server::json_to_value(doc);
    if (!schema) return 0;
    auto gbnf = tern::runtime::json_schema_to_gbnf(*schema);
    if (!gbnf.ok()) {
        require(!gbnf.error().message.empty());
        return 0;
    }
    auto g = tern::runtime::Grammar::parse(*gbnf);
    require(g.ok() || g.error().message.find("too large") != std::string::npos);
    if (g.ok()) {
        tern::runtime::GrammarMatcher m(*g);
        m.accept("{\"a\": [1, \"b\"], \"c\": null}");
    }
    return 0;
}
