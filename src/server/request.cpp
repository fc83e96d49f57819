#include "server/request.h"

#include <cctype>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "runtime/json_schema.h"
#include "server/json_value.h"

namespace tern::server {
namespace {

// Ordered: tools and template arguments reach the template with their keys
// in the order the client wrote them.
using json = nlohmann::ordered_json;

// Thrown inside the parser only; parse_request turns it into a value.
struct Reject {
    ApiError error;
};

[[noreturn]] void reject_field(const std::string& field, const std::string& what) {
    throw Reject{ApiError{400, "'" + field + "' " + what, "invalid_request_error", field, "invalid_value"}};
}

const char* type_name(const json& v) {
    switch (v.type()) {
        case json::value_t::null: return "null";
        case json::value_t::boolean: return "a boolean";
        case json::value_t::string: return "a string";
        case json::value_t::array: return "an array";
        case json::value_t::object: return "an object";
        default: return "a number";
    }
}

double get_number(const json& body, const char* field) {
    const json& v = body.at(field);
    if (!v.is_number()) reject_field(field, std::string("must be a number, not ") + type_name(v));
    return v.get<double>();
}

float get_float(const json& body, const char* field) {
    const double d = get_number(body, field);
    if (!std::isfinite(d) || std::fabs(d) > 1e30) reject_field(field, "is out of range");
    return float(d);
}

int64_t get_integer(const json& body, const char* field, int64_t lo, int64_t hi) {
    const json& v = body.at(field);
    if (!v.is_number_integer() && !(v.is_number_float() && std::nearbyint(v.get<double>()) == v.get<double>()))
        reject_field(field, std::string("must be an integer, not ") + type_name(v));
    const double d = v.get<double>();
    if (!(d >= double(lo) && d <= double(hi)))
        reject_field(field, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    if (v.is_number_unsigned()) return int64_t(std::min<uint64_t>(v.get<uint64_t>(), uint64_t(hi)));
    if (v.is_number_integer()) return v.get<int64_t>();
    return int64_t(d);
}

bool present(const json& body, const char* field) {
    auto it = body.find(field);
    return it != body.end() && !it->is_null();
}

// Message content: a string, or OpenAI's list of parts of which only text is supported.
std::string message_content(const json& content, const std::string& field) {
    if (content.is_string()) return content.get<std::string>();
    if (content.is_null()) return {};
    if (!content.is_array()) reject_field(field, std::string("must be a string or an array of text parts, not ") + type_name(content));
    std::string out;
    for (size_t i = 0; i < content.size(); ++i) {
        const json& part = content[i];
        const std::string pf = field + "[" + std::to_string(i) + "]";
        if (!part.is_object()) reject_field(pf, "must be an object");
        auto type = part.find("type");
        if (type == part.end() || !type->is_string() || *type != "text")
            reject_field(pf + ".type", "must be \"text\" (only text content is supported)");
        auto text = part.find("text");
        if (text == part.end() || !text->is_string()) reject_field(pf + ".text", "must be a string");
        out += text->get<std::string>();
    }
    return out;
}

text::jinja::Value template_value(const json& v, const std::string& field) {
    auto out = json_to_value(v);
    if (!out) reject_field(field, "nests deeper than " + std::to_string(kJsonValueMaxDepth) + " levels");
    return std::move(*out);
}

std::string get_string(const json& m, const char* key, const std::string& field) {
    auto it = m.find(key);
    if (it == m.end() || it->is_null()) return {};
    if (!it->is_string()) reject_field(field + "." + key, std::string("must be a string, not ") + type_name(*it));
    return it->get<std::string>();
}

// An assistant message's tool_calls: [{"id", "type": "function", "function":
// {"name", "arguments"}}]. Arguments are JSON text (OpenAI) or an object;
// templates get an object as a dict, other text as it is.
std::vector<text::ChatToolCall> parse_tool_calls(const json& calls, const std::string& field) {
    if (!calls.is_array()) reject_field(field, std::string("must be an array, not ") + type_name(calls));
    std::vector<text::ChatToolCall> out;
    for (size_t i = 0; i < calls.size(); ++i) {
        const json& c = calls[i];
        const std::string f = field + "[" + std::to_string(i) + "]";
        if (!c.is_object()) reject_field(f, "must be an object");
        const std::string type = get_string(c, "type", f);
        if (!type.empty() && type != "function") reject_field(f + ".type", "must be \"function\"");
        auto fn = c.find("function");
        if (fn == c.end() || !fn->is_object()) reject_field(f + ".function", "must be an object");
        text::ChatToolCall call;
        call.id = get_string(c, "id", f);
        call.name = get_string(*fn, "name", f + ".function");
        if (call.name.empty()) reject_field(f + ".function.name", "must be a non-empty string");
        auto args = fn->find("arguments");
        if (args == fn->end() || args->is_null()) {
            call.arguments = text::jinja::Value(text::jinja::Dict{});
        } else if (args->is_object()) {
            call.arguments = template_value(*args, f + ".function.arguments");
        } else if (args->is_string()) {
            const json parsed = json::parse(args->get<std::string>(), nullptr, false);
            call.arguments = !parsed.is_discarded() && parsed.is_object()
                                 ? template_value(parsed, f + ".function.arguments")
                                 : text::jinja::Value(args->get<std::string>());
        } else {
            reject_field(f + ".function.arguments", std::string("must be a string, not ") + type_name(*args));
        }
        out.push_back(std::move(call));
    }
    return out;
}

void parse_messages(const json& body, ParsedRequest& r) {
    if (!present(body, "messages")) reject_field("messages", "is required");
    const json& msgs = body.at("messages");
    if (!msgs.is_array()) reject_field("messages", std::string("must be an array, not ") + type_name(msgs));
    if (msgs.empty()) reject_field("messages", "must not be empty");
    for (size_t i = 0; i < msgs.size(); ++i) {
        const json& m = msgs[i];
        const std::string f = "messages[" + std::to_string(i) + "]";
        if (!m.is_object()) reject_field(f, "must be an object");
        auto role = m.find("role");
        if (role == m.end() || !role->is_string()) reject_field(f + ".role", "must be a string");
        const std::string role_s = role->get<std::string>();
        if (role_s != "system" && role_s != "user" && role_s != "assistant" && role_s != "developer" &&
            role_s != "tool")
            reject_field(f + ".role", "must be one of system, developer, user, assistant, tool (got \"" + role_s + "\")");
        text::ChatMessage msg;
        msg.role = role_s == "developer" ? "system" : role_s;
        auto content = m.find("content");
        if (content != m.end()) msg.content = message_content(*content, f + ".content");
        if (role_s == "assistant") {
            if (present(m, "tool_calls")) msg.tool_calls = parse_tool_calls(m.at("tool_calls"), f + ".tool_calls");
            msg.reasoning_content = get_string(m, "reasoning_content", f);
        }
        if (role_s == "tool") {
            msg.tool_call_id = get_string(m, "tool_call_id", f);
            msg.name = get_string(m, "name", f);
        }
        r.chat.messages.push_back(std::move(msg));
    }
    if (present(body, "chat_template_kwargs")) {
        const json& kw = body.at("chat_template_kwargs");
        if (!kw.is_object()) reject_field("chat_template_kwargs", std::string("must be an object, not ") + type_name(kw));
        r.chat.extra = template_value(kw, "chat_template_kwargs").as_dict();
    }
}

// response_format (OpenAI) and grammar (llama-server): the GBNF grammar the
// answer must follow, compiled from a JSON Schema where one is given.
// Whatever cannot be honoured is refused naming it.
void parse_structured_output(const json& body, ParsedRequest& r) {
    std::string gbnf;
    const char* field = nullptr;
    if (present(body, "response_format")) {
        const json& rf = body.at("response_format");
        if (!rf.is_object()) reject_field("response_format", std::string("must be an object, not ") + type_name(rf));
        const std::string type = get_string(rf, "type", "response_format");
        if (type == "json_object") {
            gbnf = runtime::json_object_gbnf();
            field = "response_format";
        } else if (type == "json_schema") {
            auto js = rf.find("json_schema");
            if (js == rf.end() || !js->is_object()) reject_field("response_format.json_schema", "must be an object");
            auto schema = js->find("schema");
            if (schema == js->end() || schema->is_null())
                reject_field("response_format.json_schema.schema", "is required");
            auto compiled = runtime::json_schema_to_gbnf(template_value(*schema, "response_format.json_schema.schema"));
            if (!compiled.ok())
                throw Reject{ApiError{400, compiled.error().message, "invalid_request_error",
                                      "response_format.json_schema.schema", "unsupported_schema"}};
            gbnf = std::move(*compiled);
            field = "response_format.json_schema.schema";
        } else if (type != "text") {
            reject_field("response_format.type", "must be \"text\", \"json_object\" or \"json_schema\"");
        }
    }
    if (present(body, "grammar")) {
        if (field) reject_field("grammar", "cannot be combined with a JSON response_format");
        const json& g = body.at("grammar");
        if (!g.is_string()) reject_field("grammar", std::string("must be a string (GBNF), not ") + type_name(g));
        gbnf = g.get<std::string>();
        field = "grammar";
    }
    if (!field) return;
    auto grammar = runtime::Grammar::parse(gbnf);
    if (!grammar.ok()) throw Reject{ApiError{400, grammar.error().message, "invalid_request_error", field, "invalid_grammar"}};
    r.grammar = std::move(*grammar);
}

// tools, tool_choice, parallel_tool_calls (chat only).
void parse_tools(const json& body, ParsedRequest& r) {
    ToolRequest& t = r.tools;
    if (present(body, "tools")) {
        if (r.endpoint != Endpoint::Chat) reject_field("tools", "is for /v1/chat/completions");
        const json& tools = body.at("tools");
        if (!tools.is_array()) reject_field("tools", std::string("must be an array, not ") + type_name(tools));
        if (tools.size() > 128) reject_field("tools", "may hold at most 128 tools");
        for (size_t i = 0; i < tools.size(); ++i) {
            const std::string f = "tools[" + std::to_string(i) + "]";
            const json& x = tools[i];
            if (!x.is_object()) reject_field(f, "must be an object");
            if (get_string(x, "type", f) != "function") reject_field(f + ".type", "must be \"function\"");
            auto fn = x.find("function");
            if (fn == x.end() || !fn->is_object()) reject_field(f + ".function", "must be an object");
            Tool tool;
            tool.name = get_string(*fn, "name", f + ".function");
            bool name_ok = !tool.name.empty() && tool.name.size() <= 64;
            for (const char c : tool.name) name_ok = name_ok && (std::isalnum(uint8_t(c)) || c == '_' || c == '-');
            if (!name_ok) reject_field(f + ".function.name", "must be 1-64 letters, digits, '_' or '-'");
            for (const Tool& other : t.tools)
                if (other.name == tool.name) reject_field(f + ".function.name", "repeats the tool '" + tool.name + "'");
            get_string(*fn, "description", f + ".function");
            if (auto params = fn->find("parameters"); params != fn->end() && !params->is_null()) {
                if (!params->is_object()) reject_field(f + ".function.parameters", "must be an object (a JSON Schema)");
                tool.parameters = *params;
            } else {
                tool.parameters = json::object();
            }
            t.tools.push_back(std::move(tool));
        }
        t.tools_json = tools;
    }
    if (present(body, "tool_choice")) {
        const json& c = body.at("tool_choice");
        if (c == "none") {
            t.choice = ToolRequest::Choice::None;
        } else if (c == "auto") {
            t.choice = ToolRequest::Choice::Auto;
        } else if (c == "required") {
            t.choice = ToolRequest::Choice::Required;
        } else if (c.is_object()) {
            auto fn = c.find("function");
            if (get_string(c, "type", "tool_choice") != "function" || fn == c.end() || !fn->is_object())
                reject_field("tool_choice", "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
            t.choice = ToolRequest::Choice::Named;
            t.named = get_string(*fn, "name", "tool_choice.function");
            bool known = false;
            for (const Tool& tool : t.tools) known = known || tool.name == t.named;
            if (!known) reject_field("tool_choice.function.name", "names no tool of the request ('" + t.named + "')");
        } else {
            reject_field("tool_choice", "must be \"none\", \"auto\", \"required\" or a named function");
        }
        if (t.tools.empty() && (t.choice == ToolRequest::Choice::Required || t.choice == ToolRequest::Choice::Named))
            reject_field("tool_choice", "needs tools");
    }
    if (present(body, "parallel_tool_calls")) {
        if (!body.at("parallel_tool_calls").is_boolean()) reject_field("parallel_tool_calls", "must be a boolean");
        t.parallel = body.at("parallel_tool_calls").get<bool>();
    }
    if (t.active() && r.grammar)
        reject_field("tools", "cannot be combined with response_format or grammar (both would hold the reply)");
}

// Fields of OpenAI's API that tern does not implement yet: a request that
// uses one is refused naming it, never answered as if it had been ignored.
void refuse_unsupported(const json& body) {
    auto refuse = [](const char* field, const std::string& why) {
        throw Reject{ApiError{400, "'" + std::string(field) + "' " + why, "invalid_request_error", field,
                              "unsupported_parameter"}};
    };
    for (const char* legacy : {"functions", "function_call"})
        if (present(body, legacy)) refuse(legacy, "is not supported (use tools)");
    if (present(body, "logprobs") && body.at("logprobs") != false)
        refuse("logprobs", "is not supported yet");
    if (present(body, "top_logprobs")) refuse("top_logprobs", "is not supported yet");
    if (present(body, "logit_bias") && !(body.at("logit_bias").is_object() && body.at("logit_bias").empty()))
        refuse("logit_bias", "is not supported yet");
}

void parse_stop(const json& body, ParsedRequest& r) {
    if (!present(body, "stop")) return;
    const json& v = body.at("stop");
    if (v.is_string()) {
        if (!v.get<std::string>().empty()) r.stop.push_back(v.get<std::string>());
        return;
    }
    if (!v.is_array()) reject_field("stop", std::string("must be a string or an array of strings, not ") + type_name(v));
    if (v.size() > 16) reject_field("stop", "may hold at most 16 strings");
    for (const json& s : v) {
        if (!s.is_string()) reject_field("stop", "must be a string or an array of strings");
        if (!s.get<std::string>().empty()) r.stop.push_back(s.get<std::string>());
    }
}

void parse_sampling(const json& body, ParsedRequest& r, uint64_t default_seed) {
    runtime::SamplerParams& p = r.sampling;
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.top_k = 0;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.seed = default_seed;
    if (present(body, "temperature")) p.temperature = get_float(body, "temperature");
    if (present(body, "top_p")) p.top_p = get_float(body, "top_p");
    if (present(body, "top_k")) p.top_k = int32_t(get_integer(body, "top_k", 0, std::numeric_limits<int32_t>::max()));
    if (present(body, "min_p")) p.min_p = get_float(body, "min_p");
    if (present(body, "presence_penalty")) p.presence_penalty = get_float(body, "presence_penalty");
    if (present(body, "frequency_penalty")) p.frequency_penalty = get_float(body, "frequency_penalty");
    if (present(body, "repeat_penalty")) p.repeat_penalty = get_float(body, "repeat_penalty");
    if (present(body, "repeat_last_n"))
        p.repeat_last_n = int32_t(get_integer(body, "repeat_last_n", 0, 1 << 20));
    if (present(body, "seed")) {
        const json& v = body.at("seed");
        if (!v.is_number_integer()) reject_field("seed", std::string("must be an integer, not ") + type_name(v));
        p.seed = v.is_number_unsigned() ? v.get<uint64_t>() : uint64_t(v.get<int64_t>());
    }
    if (Status s = p.validate(); !s.ok()) {
        // validate() names the field in its message; find which for `param`.
        std::string param;
        for (const char* f : {"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                              "presence_penalty", "frequency_penalty"})
            if (s.message().find(f) != std::string::npos) {
                param = f;
                break;
            }
        throw Reject{ApiError{400, s.message(), "invalid_request_error", param, "invalid_value"}};
    }
}

ParsedRequest parse_body(Endpoint endpoint, const json& body, uint64_t default_seed) {
    if (!body.is_object())
        throw Reject{ApiError{400, std::string("the request body must be a JSON object, not ") + type_name(body),
                              "invalid_request_error", "", "invalid_json"}};
    ParsedRequest r;
    r.endpoint = endpoint;
    if (present(body, "model")) {
        if (!body.at("model").is_string()) reject_field("model", "must be a string");
        r.model = body.at("model").get<std::string>();
    }
    if (endpoint == Endpoint::Chat) {
        parse_messages(body, r);
    } else {
        if (!present(body, "prompt")) reject_field("prompt", "is required");
        const json& p = body.at("prompt");
        if (p.is_string()) {
            r.prompt = p.get<std::string>();
        } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
            r.prompt = p[0].get<std::string>();
        } else {
            reject_field("prompt", "must be a string (one prompt per request)");
        }
        if (r.prompt.empty()) reject_field("prompt", "must not be empty");
    }
    const char* max_field = present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (present(body, max_field)) r.max_tokens = int(get_integer(body, max_field, 1, 1 << 24));
    if (present(body, "n") && get_integer(body, "n", 1, 1 << 20) != 1) reject_field("n", "must be 1 (only one choice per request is supported)");
    if (present(body, "stream")) {
        if (!body.at("stream").is_boolean()) reject_field("stream", "must be a boolean");
        r.stream = body.at("stream").get<bool>();
    }
    if (present(body, "stream_options")) {
        const json& so = body.at("stream_options");
        if (!so.is_object()) reject_field("stream_options", "must be an object");
        if (present(so, "include_usage")) {
            if (!so.at("include_usage").is_boolean()) reject_field("stream_options.include_usage", "must be a boolean");
            r.include_usage = so.at("include_usage").get<bool>();
        }
    }
    refuse_unsupported(body);
    parse_structured_output(body, r);
    parse_tools(body, r);
    if (present(body, "reasoning_format")) {
        // llama-server's values: "none" keeps the thinking inline in content;
        // "auto" and "deepseek" return it as reasoning_content.
        const json& v = body.at("reasoning_format");
        if (!v.is_string() || (v != "none" && v != "auto" && v != "deepseek"))
            reject_field("reasoning_format", "must be \"auto\", \"deepseek\" or \"none\"");
        r.split_reasoning = v != "none";
    }
    parse_stop(body, r);
    parse_sampling(body, r, default_seed);
    return r;
}

}  // namespace

std::string error_body(const ApiError& e) {
    json err = {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
    return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

ParseOutcome parse_request(Endpoint endpoint, std::string_view body, uint64_t default_seed) {
    ParseOutcome out;
    json doc = json::parse(body.begin(), body.end(), nullptr, false);
    if (doc.is_discarded()) {
        out.error = ApiError{400, "the request body is not valid JSON", "invalid_request_error", "", "invalid_json"};
        return out;
    }
    try {
        out.request = parse_body(endpoint, doc, default_seed);
    } catch (const Reject& r) {
        out.error = r.error;
    }
    return out;
}

}  // namespace tern::server
