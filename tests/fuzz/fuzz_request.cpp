// libFuzzer entry for server/request: arbitrary bytes as the body of a chat or
// a completion request (byte 0 picks which). Besides memory safety it checks
// the parser's contract: exactly one of a request or an error comes back, an
// error is a 4xx with a message and serializes to valid JSON, and an accepted
// request passes the sampler's own validation and carries its prompt.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/request.h"

namespace {

void require(bool ok) {
    if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    using tern::server::Endpoint;
    const Endpoint endpoint = (data[0] & 1) ? Endpoint::Completion : Endpoint::Chat;
    const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
    const tern::server::ParseOutcome out = tern::server::parse_request(endpoint, body, 42);
    if (!out.request) {
        require(out.error.status >= 400 && out.error.status < 500);
        require(!out.error.message.empty());
        const auto j = nlohmann::json::parse(tern::server::error_body(out.error), nullptr, false);
        require(!j.is_discarded() && j.contains("error"));
        return 0;
    }
    const tern::server::ParsedRequest& r = *out.request;
    require(r.endpoint == endpoint);
    require(r.sampling.validate().ok());
    if (endpoint == Endpoint::Chat) {
        require(!r.chat.messages.empty());
        for (const auto& m : r.chat.messages)
            require(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool");
    } else {
        require(!r.prompt.empty());
    }
    require(!r.max_tokens || *r.max_tokens >= 1);
    for (const auto& s : r.stop) require(!s.empty());
    return 0;
}
