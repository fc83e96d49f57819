#include "server/tool_calls.h"

#include <cstdio>

#include "runtime/json_schema.h"
#include "server/json_value.h"

namespace tern::server {
namespace {

using json = nlohmann::ordered_json;

bool contains(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

std::string trim(std::string_view s) {
    const char* ws = " \t\r\n";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string_view::npos) return {};
    return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

// A GBNF literal of the JSON text of s (a quoted string).
std::string json_string_literal(const std::string& s) {
    const std::string j = json(s).dump(-1, ' ', false, json::error_handler_t::replace);
    std::string out = "\"";
    for (const char c : j) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
    }
    return out + "\"";
}

// The key a format names the arguments by.
const char* arguments_key(ToolFormat f) { return f == ToolFormat::Llama3 ? "parameters" : "arguments"; }

// {"name": ..., "arguments": {...}} as a call of one of the tools, or nothing.
bool to_call(const json& j, const ToolRequest& r, ToolCall& out) {
    if (!j.is_object()) return false;
    auto name = j.find("name");
    if (name == j.end() || !name->is_string()) return false;
    bool known = false;
    for (const Tool& t : r.tools) known = known || t.name == name->get<std::string>();
    if (!known) return false;
    auto args = j.find("arguments");
    if (args == j.end()) args = j.find("parameters");
    json a = json::object();
    if (args != j.end()) {
        a = *args;
        if (a.is_string()) a = json::parse(a.get<std::string>(), nullptr, false);
        if (a.is_discarded() || !a.is_object()) return false;
    }
    out.name = name->get<std::string>();
    out.arguments = a.dump(-1, ' ', false, json::error_handler_t::replace);
    return true;
}

}  // namespace

ToolFormat tool_format_of(std::string_view t) {
    if (contains(t, "<tool_call>")) return ToolFormat::Hermes;
    if (contains(t, "[TOOL_CALLS]")) return ToolFormat::Mistral;
    if (contains(t, "<|start_header_id|>") && contains(t, "tools") && contains(t, "parameters"))
        return ToolFormat::Llama3;
    return ToolFormat::Generic;
}

const char* tool_format_name(ToolFormat f) {
    switch (f) {
        case ToolFormat::Hermes: return "hermes";
        case ToolFormat::Llama3: return "llama3";
        case ToolFormat::Mistral: return "mistral";
        case ToolFormat::Generic: return "generic";
    }
    return "?";
}

Result<std::string> tool_grammar(ToolFormat f, const ToolRequest& r) {
    using Choice = ToolRequest::Choice;
    const bool forced = r.choice == Choice::Required || r.choice == Choice::Named;
    if (!forced && f != ToolFormat::Generic) return std::string();
    std::string rules, alts;
    for (size_t i = 0; i < r.tools.size(); ++i) {
        const Tool& t = r.tools[i];
        if (r.choice == Choice::Named && t.name != r.named) continue;
        const std::string args = "tool-" + std::to_string(i) + "-args";
        if (t.parameters.is_null() || (t.parameters.is_object() && t.parameters.empty())) {
            rules += args + " ::= object\n";
        } else {
            auto schema = json_to_value(t.parameters);
            if (!schema) return Error{"tools[" + std::to_string(i) + "].function.parameters nests too deeply"};
            auto compiled = runtime::json_schema_rules(*schema, args);
            if (!compiled.ok())
                return Error{"tools[" + std::to_string(i) + "].function.parameters: " + compiled.error().message};
            rules += *compiled;
        }
        alts += std::string(alts.empty() ? "" : " | ") + json_string_literal(t.name) + " ws \",\" ws " +
                json_string_literal(arguments_key(f)) + " ws \":\" ws " + args;
    }
    std::string g = "tool-call ::= \"{\" ws " + json_string_literal("name") + " ws \":\" ws (" + alts + ") \"}\" ws\n";
    switch (f) {
        case ToolFormat::Hermes:
            g += "hermes-call ::= \"<tool_call>\" ws tool-call \"</tool_call>\" ws\n";
            g += r.parallel ? "root ::= hermes-call+\n" : "root ::= hermes-call\n";
            break;
        case ToolFormat::Llama3: g += "root ::= tool-call\n"; break;
        case ToolFormat::Mistral:
            g += r.parallel ? "root ::= \"[\" ws tool-call (\",\" ws tool-call)* \"]\" ws\n"
                            : "root ::= \"[\" ws tool-call \"]\" ws\n";
            break;
        case ToolFormat::Generic: {
            const std::string call = "\"{\" ws " + json_string_literal("tool_call") + " ws \":\" ws tool-call \"}\" ws";
            const std::string answer = "\"{\" ws " + json_string_literal("response") + " ws \":\" ws string \"}\" ws";
            g += "root ::= " + call + (forced ? "" : " | " + answer) + "\n";
            break;
        }
    }
    return g + rules + runtime::json_schema_basics();
}

std::string generic_tool_prompt(const ToolRequest& r) {
    using Choice = ToolRequest::Choice;
    json list = json::array();
    for (const Tool& t : r.tools)
        if (r.choice != Choice::Named || t.name == r.named) list.push_back({{"name", t.name}, {"parameters", t.parameters}});
    std::string p = "You can call these tools (JSON Schema of their arguments):\n" +
                    list.dump(2, ' ', false, json::error_handler_t::replace) + "\n\n";
    p += "Reply with one JSON object and nothing else. To call a tool: "
         "{\"tool_call\": {\"name\": <tool name>, \"arguments\": <the arguments>}}.";
    if (r.choice == Choice::Auto) p += " To answer without a tool: {\"response\": <your answer>}.";
    return p;
}

ToolReply parse_tool_reply(ToolFormat f, std::string_view text, const ToolRequest& r) {
    ToolReply out;
    switch (f) {
        case ToolFormat::Hermes: {
            constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
            std::string content;
            size_t at = 0;
            for (;;) {
                const size_t open = text.find(kOpen, at);
                const size_t close = open == std::string_view::npos ? open : text.find(kClose, open);
                if (close == std::string_view::npos) break;
                ToolCall c;
                const std::string_view inner = text.substr(open + kOpen.size(), close - open - kOpen.size());
                if (!to_call(json::parse(inner.begin(), inner.end(), nullptr, false), r, c)) break;
                content += text.substr(at, open - at);
                out.calls.push_back(std::move(c));
                at = close + kClose.size();
            }
            content += text.substr(at);
            out.content = out.calls.empty() ? std::string(text) : trim(content);
            return out;
        }
        case ToolFormat::Llama3:
        case ToolFormat::Mistral: {
            std::string body = trim(text);
            for (const char* tag : {"<|python_tag|>", "[TOOL_CALLS]"})
                if (body.rfind(tag, 0) == 0) body = trim(body.substr(std::string(tag).size()));
            const json j = json::parse(body, nullptr, false);
            std::vector<ToolCall> calls;
            if (j.is_array() && !j.empty()) {
                for (const json& x : j) {
                    ToolCall c;
                    if (!to_call(x, r, c)) {
                        calls.clear();
                        break;
                    }
                    calls.push_back(std::move(c));
                }
            } else {
                ToolCall c;
                if (to_call(j, r, c)) calls.push_back(std::move(c));
            }
            if (calls.empty()) out.content = std::string(text);
            out.calls = std::move(calls);
            return out;
        }
        case ToolFormat::Generic: {
            const json j = json::parse(text.begin(), text.end(), nullptr, false);
            ToolCall c;
            if (j.is_object() && j.contains("tool_call") && to_call(j.at("tool_call"), r, c)) {
                out.calls.push_back(std::move(c));
            } else if (j.is_object() && j.contains("response") && j.at("response").is_string()) {
                out.content = j.at("response").get<std::string>();
            } else {
                out.content = std::string(text);
            }
            return out;
        }
    }
    out.content = std::string(text);
    return out;
}

}  // namespace tern::server
