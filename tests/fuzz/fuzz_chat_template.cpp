// libFuzzer entry for text/chat_template: the input becomes a template text
// (inspected for its family and default system prompt) plus a few messages,
// rendered with the detected template and with every family. Besides memory
// safety it checks that detection is consistent and that rendering fails
// exactly for the conversations the API says it refuses.
//
// Input layout: byte 0 holds flags (bit 0: add_generation_prompt); the rest
// is split at 0x00 bytes: the first piece is the template, each further
// piece (at most 16) a message whose first byte picks the role (0 system,
// 1 user, 2 assistant, anything else: the piece's next bytes, up to 8, as an
// arbitrary role) and whose remaining bytes are the content.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template.h"

using tern::text::ChatFamily;
using tern::text::ChatMessage;

namespace {

void require(bool ok) {
    if (!ok) __builtin_trap();
}

std::vector<std::string_view> split_at_zero(std::string_view s) {
    std::vector<std::string_view> parts;
    size_t start = 0;
    for (size_t i = 0; i <= s.size(); ++i) {
        if (i == s.size() || s[i] == '\0') {
            parts.push_back(s.substr(start, i - start));
            start = i + 1;
        }
    }
    return parts;
}

ChatMessage to_message(std::string_view piece) {
    if (piece.empty()) return {"user", ""};
    const uint8_t selector = uint8_t(piece[0]);
    piece.remove_prefix(1);
    if (selector <= 2) {
        static const char* const roles[] = {"system", "user", "assistant"};
        return {roles[selector], std::string(piece)};
    }
    const size_t role_len = piece.size() < 8 ? piece.size() : 8;
    return {std::string(piece.substr(0, role_len)), std::string(piece.substr(role_len))};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const bool add_generation_prompt = data[0] & 1;
    const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
    std::vector<std::string_view> parts = split_at_zero(rest);
    const std::string_view jinja = parts[0];

    std::vector<ChatMessage> messages;
    bool roles_valid = true;
    bool late_system = false;
    for (size_t i = 1; i < parts.size() && messages.size() < 16; ++i) {
        messages.push_back(to_message(parts[i]));
        const std::string& role = messages.back().role;
        roles_valid &= role == "system" || role == "user" || role == "assistant";
        late_system |= role == "system" && messages.size() > 1;
    }

    bool recognized = false;
    const ChatFamily family = tern::text::detect_chat_family(jinja, &recognized);
    const tern::text::ChatTemplate tmpl = tern::text::inspect_chat_template(jinja);
    require(tmpl.family == family && tmpl.recognized == recognized);
    require(tmpl.default_system.empty() || family == ChatFamily::ChatML);
    require(tmpl.default_system.find("<|im_start|>") == std::string::npos);

    const auto expect_ok = [&](ChatFamily f) {
        const bool system_first_only = f == ChatFamily::Llama2 || f == ChatFamily::Mistral ||
                                       f == ChatFamily::MistralV1 || f == ChatFamily::Gemma;
        return roles_valid && !(late_system && system_first_only);
    };
    const auto check = [&](ChatFamily f, const tern::Result<std::string>& r) {
        require(r.ok() == expect_ok(f));
        if (!r.ok()) require(!r.error().message.empty());
    };

    check(family, tern::text::render_chat(tmpl, messages, add_generation_prompt, "<s>"));
    for (int f = 0; f <= int(ChatFamily::DeepSeekR1); ++f) {  // DeepSeekR1 is the last family
        const ChatFamily fam = ChatFamily(f);
        check(fam, tern::text::render_chat(fam, messages, add_generation_prompt, "<s>"));
        require(!tern::text::chat_stop_strings(fam).empty());
    }
    return 0;
}
