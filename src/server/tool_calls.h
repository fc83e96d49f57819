// OpenAI tool calling over a model's own format. The tools reach the model
// through its chat template; how it writes a call is read from that
// template (Hermes / Qwen <tool_call> blocks, Llama 3.x JSON, Mistral's
// [TOOL_CALLS] array), and a template without a tool format gets tern's
// generic one: the tools described in a system message and the reply held
// to a JSON grammar ({"tool_call": ...} or {"response": ...}). With
// tool_choice "required" or a named function, the reply is held by a
// grammar to a call whose arguments follow the function's parameters
// schema (runtime/json_schema.h), so the call always parses and validates.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace tern::server {

enum class ToolFormat { Hermes, Llama3, Mistral, Generic };

// Read from the chat template's text (empty: Generic).
ToolFormat tool_format_of(std::string_view chat_template);
const char* tool_format_name(ToolFormat f);

struct Tool {
    std::string name;
    nlohmann::ordered_json parameters;  // its JSON Schema ({} when the tool takes anything)
};

struct ToolRequest {
    enum class Choice { None, Auto, Required, Named };
    std::vector<Tool> tools;
    nlohmann::ordered_json tools_json;  // the request's tools array, for the template
    Choice choice = Choice::Auto;
    std::string named;                  // Choice::Named: the function
    bool parallel = true;               // parallel_tool_calls: more than one call per reply
    bool active() const { return !tools.empty() && choice != Choice::None; }
};

// The grammar (GBNF) of a reply in this format: a call of one of the tools
// (Required), of the named one (Named), or for Generic with Auto a call or
// an answer. Empty for Auto in the formats a model writes by itself. An
// error names a parameters schema it cannot honour.
Result<std::string> tool_grammar(ToolFormat f, const ToolRequest& r);

// Generic: the system message that tells the model the tools and the reply format.
std::string generic_tool_prompt(const ToolRequest& r);

struct ToolCall {
    std::string name;
    std::string arguments;  // JSON text of an object
};
struct ToolReply {
    std::string content;  // the text that is not a call
    std::vector<ToolCall> calls;
};

// The calls in a finished reply, in order: only calls of the request's tools
// with an object of arguments count; anything else stays content.
ToolReply parse_tool_reply(ToolFormat f, std::string_view text, const ToolRequest& r);

}  // namespace tern::server
