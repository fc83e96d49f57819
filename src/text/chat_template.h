// Chat prompts without a Jinja interpreter: the GGUF's tokenizer.chat_template
// is matched to one of a few known families by distinctive markers, and each
// family renders a conversation exactly as its official template does.
// Message content is inserted literally: text that spells a special token
// ("<|im_end|>" typed by a user) is not interpreted here; whether it becomes
// that token is the tokenizer's decision (its parse_special flag).
// docs/chat-templates.md names the reference template of every family.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"
#include "text/jinja_value.h"

namespace tern::text {

// An assistant's call of a tool (OpenAI's tool_calls[i]).
struct ChatToolCall {
    std::string id;
    std::string name;
    // The arguments as templates expect them: a dict when the call's JSON
    // text is an object (the usual case), else that text as a string.
    jinja::Value arguments;
};

struct ChatMessage {
    ChatMessage() = default;
    ChatMessage(std::string role_, std::string content_) : role(std::move(role_)), content(std::move(content_)) {}

    std::string role;  // "system", "user", "assistant" or (templates only) "tool"
    std::string content;
    std::vector<ChatToolCall> tool_calls;  // assistant messages
    std::string tool_call_id;              // tool messages: the call answered
    std::string name;                      // tool messages: the function's name, when given
    std::string reasoning_content;         // assistant messages: the thinking, when given apart
};

enum class ChatFamily {
    ChatML,      // <|im_start|>role\n...<|im_end|>\n (Qwen, SmolLM, OpenHermes, ...)
    Llama2,      // <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s>
    Llama3,      // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
    Mistral,     // <s>[INST] ... [/INST]...</s> (Mistral 7B v0.1/v0.2, Mixtral 8x7B)
    MistralV1,   // <s> [INST] ... [/INST] ...</s> (the later template with system support)
    Gemma,       // <start_of_turn>user\n...<end_of_turn>\n, assistant named "model"
    Zephyr,      // <|user|>\n...</s>\n
    Phi3,        // <|user|>\n...<|end|>\n (Phi-3, Phi-3.5)
    DeepSeekR1,  // <｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜> (R1 and its distills)
};

// A short stable name ("chatml", "llama3", ...) for logs and flags.
std::string_view chat_family_name(ChatFamily family);

// What a template's text tells the renderer: the family, and details some
// templates of a family carry.
struct ChatTemplate {
    ChatFamily family = ChatFamily::ChatML;
    // False when the template was empty or matched no family: the caller
    // should warn that ChatML is a guess.
    bool recognized = false;
    // ChatML templates such as SmolLM2's and Qwen2's insert a system turn
    // with this text when the conversation does not start with one. Empty
    // when the template has none.
    std::string default_system;
    // DeepSeekR1: the generation prompt opens the reasoning block
    // ("<｜Assistant｜><think>\n"), as the current R1 templates do.
    bool generation_opens_think = false;
};

// Chooses the family from markers in the template text; unknown or empty
// text gives ChatML with *recognized = false (recognized may be null).
ChatFamily detect_chat_family(std::string_view jinja_template, bool* recognized);

// detect_chat_family plus the details above, read from the same text.
ChatTemplate inspect_chat_template(std::string_view jinja_template);

// The family's official template with no extras (no default system prompt;
// DeepSeekR1 opens the think block).
ChatTemplate default_chat_template(ChatFamily family);

// Renders the conversation as the family's official template would, with
// bos_text standing for the template's bos_token (the vocabulary's BOS
// text, e.g. "<s>", "<|begin_of_text|>", "<bos>"). Errors name the message:
// a role other than system/user/assistant, tool calls (the families have no
// format for them: that takes the model's own template), or (Llama2, Mistral, MistralV1,
// Gemma, whose formats have no system turn) a system message after the
// first message. Where an official template would refuse a conversation
// (roles not alternating), the rendering extends its pattern; see the doc.
Result<std::string> render_chat(const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, std::string_view bos_text);
Result<std::string> render_chat(ChatFamily family, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, std::string_view bos_text);

// True when the rendered text already holds the BOS (Llama2, Llama3,
// Mistral, MistralV1, Gemma, DeepSeekR1): tokenize it without adding
// another. ChatML, Zephyr and Phi3 leave BOS to the tokenizer's add_bos.
bool template_includes_bos(ChatFamily family);

// Text that ends the assistant's turn in this format (its end-of-turn
// marker, and the opener of a next turn a model may run into), for the
// generation loop's stop conditions.
std::vector<std::string> chat_stop_strings(ChatFamily family);

}  // namespace tern::text
