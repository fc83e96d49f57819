// server/piece_event.h: a streamed piece's event cut from a template gives
// the bytes of the whole JSON document made for that piece, for completion
// and chat chunks, and for pieces that need escaping, carry invalid UTF-8 or
// spell the placeholder itself, beside a model name that spells it too.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/piece_event.h"

namespace tern::server {
namespace {

using nlohmann::json;

TEST(PieceEvent, GivesTheBytesOfTheWholeDocument) {
    const std::vector<std::string> pieces = {
        "", "Hello", " world", "\"quoted\" \\ back\\slash", "tab\there\nline", std::string("nul\0in", 6),
        "\x01\x1f control", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "bad \xff\xfe utf-8", "cut \xe2\x82",
        "\x01tern-piece\x01", "</script>"};
    for (const std::string model : {"tern", "\x01tern-piece\x01"}) {
        auto completion = [&](const json& text) {
            json choice = {{"index", 0}, {"finish_reason", nullptr}};
            choice["text"] = text, choice["logprobs"] = nullptr;
            json j = {{"id", "cmpl-7"}, {"object", "text_completion"}, {"created", 1764900000},
                      {"model", model}, {"choices", json::array({choice})}};
            return "data: " + dump_json(j) + "\n\n";
        };
        auto chat = [&](const json& content) {
            json choice = {{"index", 0}, {"finish_reason", nullptr}, {"delta", {{"content", content}}}};
            json j = {{"id", "chatcmpl-7"}, {"object", "chat.completion.chunk"}, {"created", 1764900000},
                      {"model", model}, {"choices", json::array({choice})}, {"usage", nullptr}};
            return "data: " + dump_json(j) + "\n\n";
        };
        const PieceEvent completion_event(completion), chat_event(chat);
        for (const std::string& p : pieces) {
            EXPECT_EQ(completion_event(p), completion(json(p))) << "piece of " << p.size() << " bytes";
            EXPECT_EQ(chat_event(p), chat(json(p))) << "piece of " << p.size() << " bytes";
        }
    }
}

}  // namespace
}  // namespace tern::server
