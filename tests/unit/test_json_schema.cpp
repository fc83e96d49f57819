// runtime/json_schema: schemas compiled to grammars that take valid
// instances and refuse invalid ones, and the constructs it cannot honour
// refused by name. (tests/python/test_structured_output.py checks generated
// output against the jsonschema package.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/grammar.h"
#include "runtime/json_schema.h"
#include "server/json_value.h"

namespace {

using tern::runtime::Grammar;
using tern::runtime::GrammarMatcher;

tern::text::jinja::Value schema_of(const std::string& json) {
    return *tern::server::json_to_value(nlohmann::ordered_json::parse(json));
}

std::shared_ptr<const Grammar> compile(const std::string& schema) {
    auto gbnf = tern::runtime::json_schema_to_gbnf(schema_of(schema));
    EXPECT_TRUE(gbnf.ok()) << schema << ": " << (gbnf.ok() ? "" : gbnf.error().message);
    if (!gbnf.ok()) std::abort();
    auto g = Grammar::parse(*gbnf);
    EXPECT_TRUE(g.ok()) << *gbnf << "\n" << (g.ok() ? "" : g.error().message);
    if (!g.ok()) std::abort();
    return *g;
}

bool takes(const std::shared_ptr<const Grammar>& g, const std::string& text) {
    GrammarMatcher m(g);
    return m.accept(text) && m.can_end();
}

struct Case {
    const char* schema;
    std::vector<const char*> valid, invalid;
};

TEST(JsonSchema, GrammarTakesValidInstancesAndRefusesInvalidOnes) {
    const Case cases[] = {
        {R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
             "required": ["name", "age"]})",
         {R"({"name": "Mae", "age": 10})", R"({"name":"x","age":-3})", "{\n  \"name\": \"\\u00e9\\n\",\n  \"age\": 0\n}"},
         {R"({"name": "Mae"})", R"({"name": 5, "age": 1})", R"({"name": "a", "age": 1.5})", R"({"name": "a", "age": 1, "x": 2})",
          R"([1])", R"({"name": "a\x", "age": 1})"}},
        {R"({"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"type": "number"}},
             "required": ["b"]})",
         {R"({"b": null})", R"({"a": true, "b": null})", R"({"b": null, "c": 2.5e3})", R"({"a": false, "b": null, "c": -0.5})"},
         {R"({})", R"({"a": true})", R"({"a": true, "c": 1})", R"({"b": null,})", R"({, "b": null})"}},
        {R"({"properties": {"x": {"type": "string"}}, "additionalProperties": {"type": "integer"}})",
         {R"({})", R"({"x": "s"})", R"({"x": "s", "n": 1, "m": 2})", R"({"n": 1})"},
         {R"({"n": "s"})", R"({"x": 1})", R"({"x": "s", "x": 2})"}},
        {R"({"properties": {"ab": {"type": "null"}, "é": {"type": "null"}}, "additionalProperties": true})",
         {R"({"a": 1})", R"({"abc": 1})", R"({"b": 1})", R"({"ab": null, "e": 2})", R"({"": 1})", R"({"éé": 1})"},
         {R"({"ab": 1})", R"({"é": 1})", R"({"ab": null, "ab": 1})"}},
        // Keys with characters JSON writes escaped (a fuzzer's find: a raw
        // backslash once closed the character class early).
        {R"({"properties": {"a\\b": {"type": "null"}, "q\"]": {"type": "null"}, "t\t": {"type": "null"}},
             "additionalProperties": {"type": "integer"}})",
         {R"({"a\\b": null})", R"({"q\"]": null})", R"({"t\t": null})", R"({"ab": 1})", R"({"a": 1, "q]": 2, "t": 3})"},
         {R"({"a\\b": "s"})", R"({"t\t": true})", R"({"ab": null})", R"({"q]": null})"}},
        {R"({"enum": ["red", "green", 3, null]})", {R"("red")", R"(3)", R"(null)"}, {R"("blue")", R"("Red")", R"(4)"}},
        {R"({"const": {"k": [1, 2]}})", {R"({"k": [1, 2]})"}, {R"({"k": [1]})"}},
        {R"({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]})", {R"("abc")", R"(null)", R"("")"},
         {R"("abcd")", R"(1)"}},
        {R"({"type": ["integer", "string"], "minLength": 2})", {R"(12)", R"("ab")"}, {R"("a")", R"(true)"}},
        {R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})",
         {R"([1])", R"([1, 2, 3])", "[\n  1,\n  2\n]"}, {R"([])", R"([1, 2, 3, 4])", R"(["a"])"}},
        {R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})",
         {R"(["a", 1])", R"(["a"])", R"([])"}, {R"(["a", 1, 2])", R"([1, "a"])", R"([1])"}},
        {R"({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}, "minItems": 2})",
         {R"(["a", 1])", R"(["a", 1, 2, 3])"}, {R"(["a"])", R"(["a", "b"])"}},
        {R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
             "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}},
             "$ref": "#/$defs/node"})",
         {R"({"v": 1})", R"({"v": 1, "kids": [{"v": 2, "kids": [{"v": 3}]}]})"}, {R"({"v": 1, "kids": [{}]})"}},
        {R"({"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]})",
         {R"(1)", R"([1, [2, []]])"}, {R"([1, "a"])"}},
        {R"({"type": "string", "format": "date-time"})", {R"("2026-12-02T10:30:00Z")", R"("2026-02-28T23:59:59.5+01:00")"},
         {R"("2026-02-30T10:30:00Z")", R"("2026-12-02 10:30:00Z")", R"("2026-13-02T10:30:00Z")"}},
        {R"({"type": "string", "format": "uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567")"}},
        {R"({})", {R"({"any": [1, "x", null]})", R"(3)"}, {R"({"any": })"}},
    };
    for (const Case& c : cases) {
        SCOPED_TRACE(c.schema);
        const auto g = compile(c.schema);
        for (const char* v : c.valid) EXPECT_TRUE(takes(g, v)) << "valid: " << v;
        for (const char* v : c.invalid) EXPECT_FALSE(takes(g, v)) << "invalid: " << v;
    }
}

TEST(JsonSchema, RefusesWhatItCannotHonourNamingItAndWhere) {
    const std::pair<const char*, const char*> cases[] = {
        {R"({"type": "string", "pattern": "^a+$"})", "'pattern' is not supported (at $)"},
        {R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})",
         "'minimum' is not supported (at $.properties.n)"},
        {R"({"oneOf": [{"type": "string"}, {"type": "integer"}]})", "'oneOf' is not supported"},
        {R"({"type": "string", "format": "email"})", "format 'email' is not supported"},
        {R"({"type": "integr"})", "unknown type 'integr'"},
        {R"({"$ref": "#/$defs/missing"})", "does not name a schema"},
        {R"({"type": "object", "required": ["a"]})", "required property 'a' has no schema"},
        {R"({"type": "array", "minItems": 3, "maxItems": 2})", "maxItems is below minItems"},
        {R"(false)", "admits no value"},
        {R"({"allOf": [{"type": "string"}, {"maxLength": 2}]})", "'allOf' is supported with one schema only"},
        {R"({"anyOf": [{"$ref": "#"}]})", "'$ref' # leads back to itself before any character"},
        {R"({"$defs": {"a": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/b"}]}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
             "$ref": "#/$defs/a"})",
         "leads back to itself before any character"},
    };
    for (const auto& [schema, says] : cases) {
        auto r = tern::runtime::json_schema_to_gbnf(schema_of(schema));
        ASSERT_FALSE(r.ok()) << schema;
        EXPECT_NE(r.error().message.find(says), std::string::npos) << schema << " -> " << r.error().message;
    }
}

TEST(JsonSchema, JsonObjectGrammarTakesObjectsOnly) {
    auto g = Grammar::parse(tern::runtime::json_object_gbnf());
    ASSERT_TRUE(g.ok()) << g.error().message;
    EXPECT_TRUE(takes(*g, R"({"a": [1, {"b": null}], "c": "\u00e9"})"));
    EXPECT_TRUE(takes(*g, "{}"));
    EXPECT_FALSE(takes(*g, "[1]"));
    EXPECT_FALSE(takes(*g, "\"s\""));
}

}  // namespace
