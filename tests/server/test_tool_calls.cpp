// server/tool_calls: the format read from a template, replies parsed per
// format (calls of known tools only, everything else content), and the
// grammars of forced calls taking valid calls and refusing invalid ones.
#include <gtest/gtest.h>

#include <string>

#include "runtime/grammar.h"
#include "server/tool_calls.h"

namespace tern::server {
namespace {

using json = nlohmann::ordered_json;

ToolRequest weather_and_time(ToolRequest::Choice choice = ToolRequest::Choice::Auto) {
    ToolRequest r;
    r.tools.push_back({"get_weather", json::parse(R"({"type": "object", "properties": {"city": {"type": "string"},
        "unit": {"enum": ["c", "f"]}}, "required": ["city"], "additionalProperties": false})")});
    r.tools.push_back({"get_time", json::object()});
    r.choice = choice;
    return r;
}

TEST(ToolCalls, FormatComesFromTheTemplate) {
    EXPECT_EQ(tool_format_of("{% for tool in tools %}<tools>{{ tool | tojson }}</tools>{% endfor %}<tool_call>"),
              ToolFormat::Hermes);
    EXPECT_EQ(tool_format_of("[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS][TOOL_CALLS]"), ToolFormat::Mistral);
    EXPECT_EQ(tool_format_of("<|start_header_id|>ipython{% if tools %}parameters{% endif %}"), ToolFormat::Llama3);
    EXPECT_EQ(tool_format_of("<|im_start|>{{ message.content }}"), ToolFormat::Generic);
    EXPECT_EQ(tool_format_of(""), ToolFormat::Generic);
}

TEST(ToolCalls, RepliesAreParsedPerFormat) {
    const ToolRequest r = weather_and_time();
    ToolReply h = parse_tool_reply(ToolFormat::Hermes,
                                   "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                                   "\"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"get_time\", \"arguments\": "
                                   "\"{}\"}</tool_call>",
                                   r);
    ASSERT_EQ(h.calls.size(), 2u);
    EXPECT_EQ(h.calls[0].name, "get_weather");
    EXPECT_EQ(h.calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(h.calls[1].arguments, "{}");  // arguments given as JSON text
    EXPECT_EQ(h.content, "Let me check.");

    ToolReply l = parse_tool_reply(ToolFormat::Llama3, " {\"name\": \"get_time\", \"parameters\": {}}", r);
    ASSERT_EQ(l.calls.size(), 1u);
    EXPECT_EQ(l.calls[0].name, "get_time");
    EXPECT_TRUE(l.content.empty());

    ToolReply m = parse_tool_reply(
        ToolFormat::Mistral, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"c\"}}]", r);
    ASSERT_EQ(m.calls.size(), 1u);
    EXPECT_EQ(m.calls[0].arguments, R"({"city":"Oslo","unit":"c"})");

    ToolReply g = parse_tool_reply(ToolFormat::Generic, R"({"tool_call": {"name": "get_time", "arguments": {}}})", r);
    ASSERT_EQ(g.calls.size(), 1u);
    ToolReply answer = parse_tool_reply(ToolFormat::Generic, R"({"response": "It is sunny."})", r);
    EXPECT_TRUE(answer.calls.empty());
    EXPECT_EQ(answer.content, "It is sunny.");

    // Not calls: an unknown tool, arguments that are not an object, broken JSON, plain text.
    for (const auto& [f, text] : std::vector<std::pair<ToolFormat, std::string>>{
             {ToolFormat::Hermes, "<tool_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>"},
             {ToolFormat::Hermes, "<tool_call>{\"name\": \"get_time\", \"arguments\": [1]}</tool_call>"},
             {ToolFormat::Hermes, "<tool_call>{\"name\": \"get_time\", </tool_call>"},
             {ToolFormat::Llama3, "The weather is fine."},
             {ToolFormat::Mistral, "[{\"name\": \"get_time\"}, {\"name\": \"nope\"}]"},
             {ToolFormat::Generic, "{\"tool_call\": {\"name\": \"nope\", \"arguments\": {}}}"}}) {
        const ToolReply x = parse_tool_reply(f, text, r);
        EXPECT_TRUE(x.calls.empty()) << text;
        EXPECT_EQ(x.content, text);
    }
}

bool takes(const std::string& gbnf, const std::string& text) {
    auto g = runtime::Grammar::parse(gbnf);
    EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message) << "\n" << gbnf;
    if (!g.ok()) return false;
    runtime::GrammarMatcher m(*g);
    return m.accept(text) && m.can_end();
}

TEST(ToolCalls, ForcedCallsFollowTheParametersSchema) {
    const ToolRequest req = weather_and_time(ToolRequest::Choice::Required);
    auto hermes = tool_grammar(ToolFormat::Hermes, req);
    ASSERT_TRUE(hermes.ok()) << hermes.error().message;
    EXPECT_TRUE(takes(*hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"));
    EXPECT_TRUE(takes(*hermes, "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"
                               "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"));
    EXPECT_FALSE(takes(*hermes, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\"}}</tool_call>"));
    EXPECT_FALSE(takes(*hermes, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": 3}}</tool_call>"));
    EXPECT_FALSE(takes(*hermes, "Sure! <tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"));

    ToolRequest one = req;
    one.parallel = false;
    auto single = tool_grammar(ToolFormat::Hermes, one);
    EXPECT_FALSE(takes(*single, "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"
                                "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"));

    ToolRequest named = weather_and_time(ToolRequest::Choice::Named);
    named.named = "get_time";
    auto llama = tool_grammar(ToolFormat::Llama3, named);
    EXPECT_TRUE(takes(*llama, "{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}"));
    EXPECT_FALSE(takes(*llama, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"));

    auto mistral = tool_grammar(ToolFormat::Mistral, req);
    EXPECT_TRUE(takes(*mistral, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\", \"unit\": \"f\"}}]"));

    auto generic_auto = tool_grammar(ToolFormat::Generic, weather_and_time());
    EXPECT_TRUE(takes(*generic_auto, "{\"response\": \"Hello\"}"));
    EXPECT_TRUE(takes(*generic_auto, "{\"tool_call\": {\"name\": \"get_time\", \"arguments\": {}}}"));
    auto generic_required = tool_grammar(ToolFormat::Generic, req);
    EXPECT_FALSE(takes(*generic_required, "{\"response\": \"Hello\"}"));

    // The models' own formats need no grammar when they may answer freely.
    EXPECT_TRUE(tool_grammar(ToolFormat::Hermes, weather_and_time())->empty());

    ToolRequest bad = req;
    bad.tools[0].parameters = json::parse(R"({"type": "object", "properties": {"zip": {"type": "string", "pattern": "[0-9]+"}}})");
    auto refused = tool_grammar(ToolFormat::Hermes, bad);
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("tools[0].function.parameters"), std::string::npos) << refused.error().message;
    EXPECT_NE(refused.error().message.find("'pattern'"), std::string::npos) << refused.error().message;
}

}  // namespace
}  // namespace tern::server
