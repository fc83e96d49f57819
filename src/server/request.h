// The OpenAI-style request bodies of /v1/chat/completions and /v1/completions,
// checked and turned into what the scheduler needs. Every rejection is an
// ApiError with the HTTP status and the field it concerns, so clients see
// which field was wrong. Unknown fields are ignored, as OpenAI's API does;
// fields of OpenAI's API that tern does not implement are refused by name.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/grammar.h"
#include "runtime/sampler.h"
#include "server/tool_calls.h"
#include "text/chat_format.h"

namespace tern::server {

struct ApiError {
    int status = 400;
    std::string message;
    std::string type = "invalid_request_error";
    std::string param;  // the offending field; empty when none
    std::string code;   // machine-readable reason; empty when none
};

// The {"error": {...}} body for an error.
std::string error_body(const ApiError& e);

enum class Endpoint { Chat, Completion };

struct ParsedRequest {
    Endpoint endpoint = Endpoint::Chat;
    std::string model;                       // echoed back
    text::ChatRequest chat;                  // Chat: the messages and template variables
    std::string prompt;                      // Completion
    std::optional<int> max_tokens;           // unset: the server's default
    runtime::SamplerParams sampling;
    std::vector<std::string> stop;
    bool stream = false;
    bool include_usage = false;              // stream_options.include_usage
    std::shared_ptr<const runtime::Grammar> grammar;  // response_format / grammar; null: free text
    bool split_reasoning = true;             // chat: <think> sections as reasoning_content (reasoning_format)
    ToolRequest tools;                       // chat: tools, tool_choice, parallel_tool_calls
};

// Parses and checks a body. Sampling defaults follow OpenAI (temperature 1,
// top_p 1) with top_k and min_p off; seed defaults to `default_seed`.
// Values are checked with SamplerParams::validate.
struct ParseOutcome {
    std::optional<ParsedRequest> request;
    ApiError error;  // when request is empty
};
ParseOutcome parse_request(Endpoint endpoint, std::string_view body, uint64_t default_seed);

}  // namespace tern::server
