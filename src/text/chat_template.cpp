// Chat families: detection from template markers, the default system prompt
// some ChatML templates carry, and one renderer per family written from its
// official Jinja template (the reference texts are in docs/chat-templates.md).
// Jinja's `trim` filter and Python's str.strip() remove Unicode whitespace,
// so the renderers that trim do the same on UTF-8.
#include "text/chat_template.h"

#include <cstdint>
#include <cstdio>
#include <optional>

namespace tern::text {
namespace {

// ---------------------------------------------------------------- whitespace

// Python's str.isspace(): the code points str.strip() removes.
bool is_python_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 ||
           cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// Decodes one well-formed UTF-8 sequence at the start of s; 0 on anything
// malformed (which then counts as non-space, as a byte Python never sees).
size_t decode_utf8(std::string_view s, uint32_t* cp) {
    if (s.empty()) return 0;
    const auto b = [&](size_t i) { return uint32_t(uint8_t(s[i])); };
    const uint32_t c0 = b(0);
    if (c0 < 0x80) {
        *cp = c0;
        return 1;
    }
    size_t n;
    uint32_t v, min;
    if ((c0 & 0xe0) == 0xc0) n = 2, v = c0 & 0x1f, min = 0x80;
    else if ((c0 & 0xf0) == 0xe0) n = 3, v = c0 & 0x0f, min = 0x800;
    else if ((c0 & 0xf8) == 0xf0) n = 4, v = c0 & 0x07, min = 0x10000;
    else return 0;
    if (s.size() < n) return 0;
    for (size_t i = 1; i < n; ++i) {
        if ((b(i) & 0xc0) != 0x80) return 0;
        v = (v << 6) | (b(i) & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return n;
}

std::string_view trim_python(std::string_view s) {
    uint32_t cp = 0;
    while (!s.empty()) {
        const size_t n = decode_utf8(s, &cp);
        if (n == 0 || !is_python_space(cp)) break;
        s.remove_prefix(n);
    }
    while (!s.empty()) {
        // The last code point starts at most 3 continuation bytes back.
        size_t start = s.size() - 1;
        while (start > 0 && s.size() - start < 4 && (uint8_t(s[start]) & 0xc0) == 0x80) --start;
        const size_t n = decode_utf8(s.substr(start), &cp);
        if (n != s.size() - start || !is_python_space(cp)) break;
        s.remove_suffix(n);
    }
    return s;
}

// ---------------------------------------------------------------- detection

bool contains(std::string_view text, std::string_view marker) {
    return text.find(marker) != std::string_view::npos;
}

struct Detection {
    ChatFamily family;
    bool recognized;
};

Detection detect(std::string_view t) {
    if (contains(t, "<|im_start|>")) {
        // Phi-4 puts <|im_sep|> where ChatML has a newline.
        return {ChatFamily::ChatML, !contains(t, "<|im_sep|>")};
    }
    if (contains(t, "<|start_header_id|>")) return {ChatFamily::Llama3, true};
    if (contains(t, "<start_of_turn>")) return {ChatFamily::Gemma, true};
    if (contains(t, "<｜User｜>") && contains(t, "<｜Assistant｜>")) return {ChatFamily::DeepSeekR1, true};
    if (contains(t, "[INST]")) {
        if (contains(t, "<<SYS>>")) return {ChatFamily::Llama2, true};
        if (contains(t, " [INST]")) return {ChatFamily::MistralV1, true};
        // Mistral's v3/v7 templates (tools, [SYSTEM_PROMPT]) space [INST]
        // differently: the original layout is the nearest guess.
        const bool newer = contains(t, "[AVAILABLE_TOOLS]") || contains(t, "[SYSTEM_PROMPT]") ||
                           contains(t, "[TOOL_CALLS]");
        return {ChatFamily::Mistral, !newer};
    }
    if (contains(t, "<|user|>")) {
        if (contains(t, "<|end|>")) return {ChatFamily::Phi3, true};
        // Zephyr ends every turn with the EOS (</s>); ChatGLM's <|user|> has
        // no turn end at all.
        if (!contains(t, "[gMASK]") && (contains(t, "eos_token") || contains(t, "</s>")))
            return {ChatFamily::Zephyr, true};
    }
    return {ChatFamily::ChatML, false};
}

// ---------------------------------------------------------------- Jinja literals

// Appends code point cp as UTF-8.
void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xc0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        out += char(0xe0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    } else {
        out += char(0xf0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3f));
        out += char(0x80 | ((cp >> 6) & 0x3f));
        out += char(0x80 | (cp & 0x3f));
    }
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Reads the Jinja string literal that starts at t[*pos] (a quote) with
// Python's escapes, leaving *pos after the closing quote. nullopt when the
// literal is unterminated or uses an escape this reader does not decode
// (*pos still moves past it when it is terminated).
std::optional<std::string> read_string_literal(std::string_view t, size_t* pos) {
    const char quote = t[*pos];
    std::string out;
    bool decodable = true;
    size_t i = *pos + 1;
    for (; i < t.size() && t[i] != quote; ++i) {
        if (t[i] != '\\') {
            out += t[i];
            continue;
        }
        if (++i >= t.size()) break;
        const char e = t[i];
        switch (e) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case 'a': out += '\a'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'v': out += '\v'; break;
            case '\\': case '\'': case '"': out += e; break;
            case '\n': break;  // a backslash-newline continues the line
            case 'x': case 'u': case 'U': {
                const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
                uint32_t cp = 0;
                bool ok = i + digits < t.size();
                for (size_t k = 1; ok && k <= digits; ++k) {
                    const int h = hex_value(t[i + k]);
                    ok = h >= 0;
                    cp = (cp << 4) | uint32_t(h < 0 ? 0 : h);
                }
                if (!ok || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
                    decodable = false;
                    break;
                }
                append_utf8(out, cp);
                i += digits;
                break;
            }
            default:
                if (e >= '0' && e <= '7') {
                    decodable = false;  // octal escapes: not worth decoding here
                } else {
                    out += '\\';  // Python keeps unknown escapes as written
                    out += e;
                }
        }
    }
    if (i >= t.size()) {
        *pos = t.size();
        return std::nullopt;
    }
    *pos = i + 1;
    if (!decodable) return std::nullopt;
    return out;
}

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Every {{ ... }} expression made only of string literals joined by '+':
// the text such an expression prints. Reading stops at malformed input.
std::vector<std::string> printed_literals(std::string_view t) {
    std::vector<std::string> found;
    size_t pos = 0;
    while (pos < t.size()) {
        const size_t open = t.find('{', pos);
        if (open == std::string_view::npos || open + 1 >= t.size()) break;
        const char kind = t[open + 1];
        if (kind == '#') {  // comment
            const size_t close = t.find("#}", open + 2);
            if (close == std::string_view::npos) break;
            pos = close + 2;
            continue;
        }
        if (kind != '{' && kind != '%') {
            pos = open + 1;
            continue;
        }
        // Walk to the closing delimiter, stepping over string literals.
        const char closer = kind == '{' ? '}' : '%';
        size_t i = open + 2;
        if (i < t.size() && (t[i] == '-' || t[i] == '+')) ++i;  // whitespace control
        std::string joined;
        bool only_literals = kind == '{';
        bool have_literal = false;
        bool expect_literal = true;
        bool closed = false;
        while (i < t.size()) {
            const char c = t[i];
            if (c == '\'' || c == '"') {
                std::optional<std::string> lit = read_string_literal(t, &i);
                if (!lit || !expect_literal) only_literals = false;
                else joined += *lit;
                have_literal = true;
                expect_literal = false;
                continue;
            }
            if ((c == '-' || c == '+') && i + 2 < t.size() && t[i + 1] == closer && t[i + 2] == '}') {
                ++i;  // whitespace control before the closer
                continue;
            }
            if (c == closer && i + 1 < t.size() && t[i + 1] == '}') {
                closed = true;
                i += 2;
                break;
            }
            if (c == '+' && !expect_literal) expect_literal = true;
            else if (!is_blank(c)) only_literals = false;
            ++i;
        }
        if (!closed) break;
        if (only_literals && have_literal && !expect_literal) found.push_back(std::move(joined));
        pos = i;
    }
    return found;
}

// The system text a ChatML template prints when the conversation has no
// system message: a printed literal "<|im_start|>system\n...<|im_end|>\n",
// in a template that looks at messages[0].
std::string chatml_default_system(std::string_view t) {
    if (!contains(t, "messages[0]")) return {};
    constexpr std::string_view kHead = "<|im_start|>system\n";
    constexpr std::string_view kTail = "<|im_end|>\n";
    for (const std::string& lit : printed_literals(t)) {
        const std::string_view s = lit;
        if (s.size() <= kHead.size() + kTail.size() || !s.starts_with(kHead) || !s.ends_with(kTail))
            continue;
        const std::string_view body = s.substr(kHead.size(), s.size() - kHead.size() - kTail.size());
        if (contains(body, "<|im_start|>") || contains(body, "<|im_end|>")) continue;
        return std::string(body);
    }
    return {};
}

// ---------------------------------------------------------------- rendering

const char* family_title(ChatFamily f) {
    switch (f) {
        case ChatFamily::ChatML: return "ChatML";
        case ChatFamily::Llama2: return "Llama 2";
        case ChatFamily::Llama3: return "Llama 3";
        case ChatFamily::Mistral: return "Mistral";
        case ChatFamily::MistralV1: return "Mistral v1";
        case ChatFamily::Gemma: return "Gemma";
        case ChatFamily::Zephyr: return "Zephyr";
        case ChatFamily::Phi3: return "Phi-3";
        case ChatFamily::DeepSeekR1: return "DeepSeek-R1";
    }
    return "?";
}

// A role as it may appear in an error message: printable ASCII kept, other
// bytes as \xNN, at most 40 bytes.
std::string printable(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size() && i < 40; ++i) {
        const unsigned char c = uint8_t(s[i]);
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out += char(c);
        } else {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        }
    }
    if (s.size() > 40) out += "...";
    return out;
}

bool system_only_first(ChatFamily f) {
    return f == ChatFamily::Llama2 || f == ChatFamily::Mistral || f == ChatFamily::MistralV1 ||
           f == ChatFamily::Gemma;
}

std::optional<Error> check_messages(ChatFamily f, const std::vector<ChatMessage>& messages) {
    for (size_t i = 0; i < messages.size(); ++i) {
        const std::string& role = messages[i].role;
        const std::string at = "chat: messages[" + std::to_string(i) + "]";
        if (role == "tool" || !messages[i].tool_calls.empty())
            return Error{at + " is a tool " + std::string(role == "tool" ? "result" : "call") + ", which the " +
                         std::string(family_title(f)) +
                         " format has no way to show (tools take the model's own chat template)"};
        if (role != "system" && role != "user" && role != "assistant")
            return Error{at + ".role '" + printable(role) + "' is not system, user or assistant"};
        if (role == "system" && i > 0 && system_only_first(f))
            return Error{at + " is a system message; the " + std::string(family_title(f)) +
                         " format takes a system message only as messages[0]"};
    }
    return std::nullopt;
}

bool starts_with_system(const std::vector<ChatMessage>& m) {
    return !m.empty() && m[0].role == "system";
}

void render_chatml(const ChatTemplate& t, const std::vector<ChatMessage>& msgs, bool gen,
                   std::string& out) {
    if (!msgs.empty() && !starts_with_system(msgs) && !t.default_system.empty())
        out += "<|im_start|>system\n" + t.default_system + "<|im_end|>\n";
    for (const ChatMessage& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    if (gen) out += "<|im_start|>assistant\n";
}

// Llama 2 has no generation prompt: the text ends with " [/INST]" anyway.
void render_llama2(const std::vector<ChatMessage>& msgs, std::string_view bos, std::string& out) {
    const bool has_system = starts_with_system(msgs);
    for (size_t i = has_system ? 1 : 0; i < msgs.size(); ++i) {
        std::string content = msgs[i].content;
        if (has_system && i == 1) content = "<<SYS>>\n" + msgs[0].content + "\n<</SYS>>\n\n" + content;
        // The template strips the whole turn, system block included.
        const std::string_view body = trim_python(content);
        if (msgs[i].role == "user") {
            out += bos;
            out += "[INST] ";
            out += body;
            out += " [/INST]";
        } else {
            out += ' ';
            out += body;
            out += " </s>";
        }
    }
}

void render_llama3(const std::vector<ChatMessage>& msgs, bool gen, std::string_view bos,
                   std::string& out) {
    for (size_t i = 0; i < msgs.size(); ++i) {
        if (i == 0) out += bos;
        out += "<|start_header_id|>" + msgs[i].role + "<|end_header_id|>\n\n";
        out += trim_python(msgs[i].content);
        out += "<|eot_id|>";
    }
    if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

// Both Mistral layouts; v1 puts a space before [INST] and before replies.
// The system text goes in front of the first user message.
void render_mistral(const std::vector<ChatMessage>& msgs, bool v1, std::string_view bos,
                    std::string& out) {
    const bool has_system = starts_with_system(msgs);
    bool system_pending = has_system;
    out += bos;
    for (size_t i = has_system ? 1 : 0; i < msgs.size(); ++i) {
        const ChatMessage& m = msgs[i];
        if (m.role == "user") {
            out += v1 ? " [INST] " : "[INST] ";
            if (system_pending) out += msgs[0].content + "\n\n";
            system_pending = false;
            out += m.content;
            out += " [/INST]";
        } else {
            if (v1) out += ' ';
            out += m.content;
            out += "</s>";
        }
    }
}

void render_gemma(const std::vector<ChatMessage>& msgs, bool gen, std::string_view bos,
                  std::string& out) {
    const bool has_system = starts_with_system(msgs);
    out += bos;
    for (size_t i = has_system ? 1 : 0; i < msgs.size(); ++i) {
        out += "<start_of_turn>";
        out += msgs[i].role == "assistant" ? "model" : msgs[i].role;
        out += '\n';
        if (has_system && i == 1) out += msgs[0].content + "\n\n";  // untrimmed, as in the template
        out += trim_python(msgs[i].content);
        out += "<end_of_turn>\n";
    }
    if (gen) out += "<start_of_turn>model\n";
}

// The official template prints the generation prompt inside its message
// loop, so an empty conversation gets none.
void render_zephyr(const std::vector<ChatMessage>& msgs, bool gen, std::string& out) {
    for (const ChatMessage& m : msgs) out += "<|" + m.role + "|>\n" + m.content + "</s>\n";
    if (gen && !msgs.empty()) out += "<|assistant|>\n";
}

void render_phi3(const std::vector<ChatMessage>& msgs, bool gen, std::string& out) {
    for (const ChatMessage& m : msgs) {
        if (m.role == "system" && m.content.empty()) continue;  // the template skips it
        out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
    }
    out += gen ? "<|assistant|>\n" : "<|endoftext|>";
}

void render_deepseek_r1(const ChatTemplate& t, const std::vector<ChatMessage>& msgs, bool gen,
                        std::string_view bos, std::string& out) {
    // System messages anywhere are lifted to the front; the last one wins.
    std::string_view system;
    for (const ChatMessage& m : msgs)
        if (m.role == "system") system = m.content;
    out += bos;
    out += system;
    for (const ChatMessage& m : msgs) {
        if (m.role == "user") {
            out += "<｜User｜>" + m.content;
        } else if (m.role == "assistant") {
            // Earlier replies lose their reasoning: only the text after the
            // last </think> is kept.
            std::string_view reply = m.content;
            const size_t think_end = reply.rfind("</think>");
            if (think_end != std::string_view::npos) reply.remove_prefix(think_end + 8);
            out += "<｜Assistant｜>";
            out += reply;
            out += "<｜end▁of▁sentence｜>";
        }
    }
    if (gen) out += t.generation_opens_think ? "<｜Assistant｜><think>\n" : "<｜Assistant｜>";
}

}  // namespace

std::string_view chat_family_name(ChatFamily family) {
    switch (family) {
        case ChatFamily::ChatML: return "chatml";
        case ChatFamily::Llama2: return "llama2";
        case ChatFamily::Llama3: return "llama3";
        case ChatFamily::Mistral: return "mistral";
        case ChatFamily::MistralV1: return "mistral-v1";
        case ChatFamily::Gemma: return "gemma";
        case ChatFamily::Zephyr: return "zephyr";
        case ChatFamily::Phi3: return "phi3";
        case ChatFamily::DeepSeekR1: return "deepseek-r1";
    }
    return "unknown";
}

ChatFamily detect_chat_family(std::string_view jinja_template, bool* recognized) {
    const Detection d = detect(jinja_template);
    if (recognized) *recognized = d.recognized;
    return d.family;
}

ChatTemplate inspect_chat_template(std::string_view jinja_template) {
    const Detection d = detect(jinja_template);
    ChatTemplate t = default_chat_template(d.family);
    t.recognized = d.recognized;
    if (d.family == ChatFamily::ChatML) t.default_system = chatml_default_system(jinja_template);
    if (d.family == ChatFamily::DeepSeekR1)
        t.generation_opens_think = contains(jinja_template, "<｜Assistant｜><think>");
    return t;
}

ChatTemplate default_chat_template(ChatFamily family) {
    ChatTemplate t;
    t.family = family;
    t.recognized = true;
    t.generation_opens_think = family == ChatFamily::DeepSeekR1;
    return t;
}

Result<std::string> render_chat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, std::string_view bos_text) {
    if (std::optional<Error> e = check_messages(tmpl.family, messages)) return *e;
    std::string out;
    const bool gen = add_generation_prompt;
    switch (tmpl.family) {
        case ChatFamily::ChatML: render_chatml(tmpl, messages, gen, out); break;
        case ChatFamily::Llama2: render_llama2(messages, bos_text, out); break;
        case ChatFamily::Llama3: render_llama3(messages, gen, bos_text, out); break;
        case ChatFamily::Mistral: render_mistral(messages, false, bos_text, out); break;
        case ChatFamily::MistralV1: render_mistral(messages, true, bos_text, out); break;
        case ChatFamily::Gemma: render_gemma(messages, gen, bos_text, out); break;
        case ChatFamily::Zephyr: render_zephyr(messages, gen, out); break;
        case ChatFamily::Phi3: render_phi3(messages, gen, out); break;
        case ChatFamily::DeepSeekR1: render_deepseek_r1(tmpl, messages, gen, bos_text, out); break;
    }
    return out;
}

Result<std::string> render_chat(ChatFamily family, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, std::string_view bos_text) {
    return render_chat(default_chat_template(family), messages, add_generation_prompt, bos_text);
}

bool template_includes_bos(ChatFamily family) {
    switch (family) {
        case ChatFamily::Llama2:
        case ChatFamily::Llama3:
        case ChatFamily::Mistral:
        case ChatFamily::MistralV1:
        case ChatFamily::Gemma:
        case ChatFamily::DeepSeekR1: return true;
        case ChatFamily::ChatML:
        case ChatFamily::Zephyr:
        case ChatFamily::Phi3: return false;
    }
    return false;
}

std::vector<std::string> chat_stop_strings(ChatFamily family) {
    switch (family) {
        case ChatFamily::ChatML: return {"<|im_end|>", "<|im_start|>"};
        case ChatFamily::Llama2: return {"</s>", "[INST]"};
        case ChatFamily::Llama3: return {"<|eot_id|>", "<|start_header_id|>", "<|end_of_text|>"};
        case ChatFamily::Mistral:
        case ChatFamily::MistralV1: return {"</s>", "[INST]"};
        case ChatFamily::Gemma: return {"<end_of_turn>", "<start_of_turn>", "<eos>"};
        case ChatFamily::Zephyr: return {"</s>", "<|user|>"};
        case ChatFamily::Phi3: return {"<|end|>", "<|endoftext|>", "<|user|>"};
        case ChatFamily::DeepSeekR1: return {"<｜end▁of▁sentence｜>", "<｜User｜>"};
    }
    return {};
}

}  // namespace tern::text
