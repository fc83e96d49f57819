// libFuzzer entry for server/tool_calls: arbitrary bytes as a model's finished
// reply, read as tool calls in each format (byte 0 picks the format and
// whether parallel calls are allowed). A prompt can steer what a model
// writes, so the reply is untrusted text. Besides memory safety it checks
// the reader's contract: every call names one of the request's tools and
// carries a JSON object of arguments; a reply with no call keeps its text
// (Generic: an answer in {"response": ...} gives that string).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/tool_calls.h"

namespace {

void require(bool ok) {
    if (!ok) __builtin_trap();
}

tern::server::ToolRequest make_request(bool parallel) {
    tern::server::ToolRequest r;
    r.tools.push_back({"get_weather", nlohmann::ordered_json::parse(
                                          R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})")});
    r.tools.push_back({"add", nlohmann::ordered_json::object()});
    r.choice = tern::server::ToolRequest::Choice::Auto;
    r.parallel = parallel;
    return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    using tern::server::ToolFormat;
    constexpr ToolFormat kFormats[] = {ToolFormat::Hermes, ToolFormat::Llama3, ToolFormat::Mistral, ToolFormat::Generic};
    const ToolFormat f = kFormats[data[0] & 3];
    static const tern::server::ToolRequest requests[2] = {make_request(false), make_request(true)};
    const tern::server::ToolRequest& r = requests[(data[0] >> 2) & 1];
    const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

    const tern::server::ToolReply reply = tern::server::parse_tool_reply(f, text, r);
    for (const tern::server::ToolCall& c : reply.calls) {
        require(c.name == "get_weather" || c.name == "add");
        const auto args = nlohmann::json::parse(c.arguments, nullptr, false);
        require(!args.is_discarded() && args.is_object());
    }
    if (reply.calls.empty() && f != ToolFormat::Generic) require(reply.content == text);
    if (f == ToolFormat::Generic) require(reply.calls.size() <= 1);
    return 0;
}
