// The chat-template engine (text/jinja.h) on its own: Python's value
// semantics where they show in output (repr, float text, JSON), the errors a
// template must get (and their lines), and every limit a hostile template
// can hit. Rendering against Python's jinja2 itself, template by template, is
// tests/python/test_jinja_oracle.py.
#include <gtest/gtest.h>

#include <string>

#include "text/jinja.h"

namespace jinja = tern::text::jinja;

namespace {

std::string render(const std::string& source, const jinja::Dict& vars = {}, jinja::RenderOptions options = {}) {
    auto t = jinja::Template::parse(source);
    if (!t.ok()) return "PARSE ERROR: " + t.error().message;
    auto out = t->render(vars, options);
    if (!out.ok()) return "RENDER ERROR: " + out.error().message;
    return *out;
}

jinja::Dict conversation() {
    jinja::List messages;
    for (const auto& [role, content] : {std::pair{"system", "Be brief."}, std::pair{"user", "Hi ü"}}) {
        jinja::Dict m;
        m.set("role", jinja::Value(role));
        m.set("content", jinja::Value(content));
        messages.push_back(jinja::Value(std::move(m)));
    }
    jinja::Dict vars;
    vars.set("messages", jinja::Value(std::move(messages)));
    vars.set("add_generation_prompt", jinja::Value(true));
    return vars;
}

}  // namespace

TEST(Jinja, PythonTextOfValues) {
    EXPECT_EQ(jinja::float_repr(1.0), "1.0");
    EXPECT_EQ(jinja::float_repr(0.1 + 0.2), "0.30000000000000004");
    EXPECT_EQ(jinja::float_repr(1e16), "1e+16");
    EXPECT_EQ(jinja::float_repr(1e-5), "1e-05");
    EXPECT_EQ(jinja::float_repr(123456.5), "123456.5");
    EXPECT_EQ(jinja::float_repr(-0.0), "-0.0");
    EXPECT_EQ(render("{{ [1, 'a', none, true, 2.5, ('t',)] }}"), "[1, 'a', None, True, 2.5, ('t',)]");
    EXPECT_EQ(render("{{ {'k': \"it's\"} }}"), "{'k': \"it's\"}");
    EXPECT_EQ(render("{{ undefined_name }}|{{ none }}"), "|None");
}

TEST(Jinja, JsonAsPythonDumpsIt) {
    EXPECT_EQ(render("{{ {'a': [1, 2.0, 'é\\n', none, false]}|tojson }}"), "{\"a\": [1, 2.0, \"é\\n\", null, false]}");
    EXPECT_EQ(render("{{ [1, {'b': []}]|tojson(indent=2) }}"), "[\n  1,\n  {\n    \"b\": []\n  }\n]");
    EXPECT_EQ(render("{{ 'é😀'|tojson(ensure_ascii=true) }}"), "\"\\u00e9\\ud83d\\ude00\"");
}

TEST(Jinja, RendersAChatTurnByTurn) {
    const std::string tmpl =
        "{% for m in messages %}<|{{ m.role }}|>{{ m['content'] | trim }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}";
    EXPECT_EQ(render(tmpl, conversation()), "<|system|>Be brief.\n<|user|>Hi ü\n<|assistant|>");
}

TEST(Jinja, TrimAndLstripBlocksAsHuggingFaceSetsThem) {
    EXPECT_EQ(render("{% if true %}\n  x\n{% endif %}\n"), "  x\n");
    EXPECT_EQ(render("a\n    {% if true %}b{% endif %}"), "a\nb");
    EXPECT_EQ(render("a\n    {%+ if true %}b{% endif %}"), "a\n    b");
    EXPECT_EQ(render("a   {{- 'b' -}}   c"), "abc");
}

TEST(Jinja, SyntaxErrorsNameTheirLine) {
    auto t = jinja::Template::parse("line one\n{% if x %}\nno end");
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find("endif"), std::string::npos) << t.error().message;
    t = jinja::Template::parse("a\nb\n{{ x | no_such_filter }}");
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find("line 3"), std::string::npos) << t.error().message;
    EXPECT_NE(t.error().message.find("no_such_filter"), std::string::npos);
    for (const char* unsupported : {"{% include 'x' %}", "{% extends 'x' %}", "{% call f() %}{% endcall %}"}) {
        t = jinja::Template::parse(unsupported);
        ASSERT_FALSE(t.ok()) << unsupported;
        EXPECT_NE(t.error().message.find("not supported"), std::string::npos) << t.error().message;
    }
}

TEST(Jinja, RaiseExceptionCarriesTheTemplatesMessage) {
    EXPECT_EQ(render("{{ raise_exception('roles must alternate') }}"), "RENDER ERROR: roles must alternate");
    // An empty message (or an undefined name's) still says what happened, and where.
    for (const char* empty : {"\n{{ raise_exception('') }}", "\n{{ raise_exception(no_such_name) }}"})
        EXPECT_EQ(render(empty), "RENDER ERROR: template line 2: raise_exception() was called with an empty message")
            << empty;
}

// Python refuses a keyword a function does not take; a template relying on
// one must not render as if it had not been written.
TEST(Jinja, UnknownKeywordArgumentsAreErrors) {
    EXPECT_EQ(render("{{ 'a b'|replace('a', 'c', count=1) }}|{{ [3, 1]|sort(reverse=true)|join(',') }}"), "c b|3,1");
    EXPECT_EQ(render("{{ [{'a': 1}]|map(attribute='a')|list }}|{{ [1, 2]|select('equalto', 2)|list }}"), "[1]|[2]");
    EXPECT_EQ(render("{{ dict(a=1, b=2)|tojson }}|{% set ns = namespace(x=3) %}{{ ns.x }}"), "{\"a\": 1, \"b\": 2}|3");
    for (const char* bad : {"{{ [3, 1]|sort(revers=true) }}", "{{ 'x'|tojson(indnt=2) }}",
                            "{{ [1]|map('string', nope=1)|list }}", "{{ 'x'.strip(chrs='x') }}",
                            "{{ range(3, step=1) }}", "{{ 1 is divisibleby(2, n=2) }}",
                            "{{ [1]|select('equalto', 1, wrong=2)|list }}"}) {
        const std::string out = render(bad);
        EXPECT_NE(out.find("RENDER ERROR"), std::string::npos) << bad << " -> " << out;
        EXPECT_NE(out.find("unexpected keyword argument"), std::string::npos) << bad << " -> " << out;
    }
}

TEST(Jinja, ImmutableValuesAndUndefinedAttributes) {
    EXPECT_NE(render("{% set l = [1] %}{{ l.append(2) }}").find("unsafe"), std::string::npos);
    EXPECT_NE(render("{{ nothing.attr }}").find("undefined"), std::string::npos);
    EXPECT_EQ(render("{{ messages[5] is defined }}{{ messages[0].missing is defined }}", conversation()), "FalseFalse");
    EXPECT_NE(render("{% set d = {} %}{% set d.x = 1 %}").find("namespace"), std::string::npos);
    // Found by fuzzing: arguments of the wrong type are errors, not reads of the wrong value.
    EXPECT_NE(render("{{ ' x '.strip(false) }}").find("string or none"), std::string::npos);
    EXPECT_NE(render("{{ [[1]]|map(attribute='99999999999999999999')|list }}").find("ERROR"), std::string::npos);
}

// Integer powers as Python gives them, up to int64's edge, and an error past it.
TEST(Jinja, IntegerPowersAreExactOrAnOverflowError) {
    EXPECT_EQ(render("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ (-1) ** 3 }} {{ (-1) ** 4 }} {{ 0 ** 0 }} {{ 1 ** 1000000000 }}"),
              "4611686018427387904 -9223372036854775808 -1 1 1 1");
    EXPECT_NE(render("{{ 2 ** 63 }}").find("integer overflow"), std::string::npos);
    EXPECT_NE(render("{{ (-3) ** 40 }}").find("integer overflow"), std::string::npos);
}

// The int filter truncates floats as Python does while int64 holds the
// result, and says so where it does not.
TEST(Jinja, IntOfAFloatIsTruncatedOrAnOutOfRangeError) {
    EXPECT_EQ(render("{{ 2.9|int }} {{ (-2.9)|int }} {{ '7.5'|int }} {{ 9.2e18|int }} {{ (-9.223372036854775808e18)|int }}"),
              "2 -2 7 9200000000000000000 -9223372036854775808");
    EXPECT_NE(render("{{ 3.3e66|int }}").find("outside the 64-bit integer range"), std::string::npos);
    EXPECT_NE(render("{{ 9.223372036854775808e18|int }}").find("outside the 64-bit integer range"), std::string::npos);
    EXPECT_NE(render("{{ '-1e300'|int }}").find("outside the 64-bit integer range"), std::string::npos);
}

TEST(Jinja, EveryLimitStopsARunawayTemplate) {
    jinja::RenderOptions small;
    small.limits.max_steps = 10000;
    EXPECT_NE(render("{% for i in range(100000) %}{% endfor %}", {}, small).find("steps"), std::string::npos);
    small = {};
    small.limits.max_output_bytes = 1000;
    EXPECT_NE(render("{% for i in range(2000) %}x{% endfor %}", {}, small).find("output"), std::string::npos);
    small = {};
    small.limits.max_depth = 50;
    EXPECT_NE(render("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", {}, small).find("deeper"), std::string::npos);
    small = {};
    small.limits.max_seconds = 0.05;
    EXPECT_NE(render("{% for i in range(1000000) %}{% for j in range(30) %}{% endfor %}{% endfor %}", {}, small)
                  .find("time"),
              std::string::npos);
    small = {};
    small.limits.max_built_bytes = 1 << 20;
    EXPECT_NE(render("{% set ns = namespace(s='ab') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                     {}, small)
                  .find("bytes of values"),
              std::string::npos);
    EXPECT_NE(render("{{ 'x' * 2000000000 }}").find("string would pass"), std::string::npos);
    EXPECT_NE(render("{{ range(2000000)|length }}").find("items"), std::string::npos);
}

TEST(Jinja, StrftimeNowUsesTheGivenTime) {
    jinja::RenderOptions at;
    at.now = jinja::parse_iso_time("2026-03-07T09:05:00");
    ASSERT_TRUE(at.now.has_value());
    EXPECT_EQ(render("{{ strftime_now('%Y-%m-%d %H:%M %a %j') }}", {}, at), "2026-03-07 09:05 Sat 066");
    EXPECT_FALSE(jinja::parse_iso_time("2026-13-01").has_value());
    EXPECT_FALSE(jinja::parse_iso_time("yesterday").has_value());
    EXPECT_TRUE(jinja::parse_iso_time("2026-03-07").has_value());
    EXPECT_TRUE(jinja::parse_iso_time("2026-03-07T09:05:00.123Z").has_value());
}
