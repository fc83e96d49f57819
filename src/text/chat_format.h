// How a model turns a conversation into its prompt: the chat template its
// GGUF carries (tokenizer.chat_template), rendered by the Jinja interpreter
// the way Hugging Face transformers renders it; only a file without a
// template, or with one that does not parse, falls back to the family
// renderers of chat_template.h (ChatML when nothing matches). The family is
// read from the template text either way: it names the end-of-turn strings
// that stop a reply.
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "text/chat_template.h"
#include "text/jinja.h"

namespace tern::text {

// One rendering: the conversation and what the template may also read.
struct ChatRequest {
    std::vector<ChatMessage> messages;
    bool add_generation_prompt = true;
    // OpenAI's tools array (a list of {"type": "function", "function": {...}});
    // None when the request has none, as transformers passes it.
    jinja::Value tools = jinja::Value::none();
    // Further template variables (a request's chat_template_kwargs, such as
    // Qwen3's enable_thinking); they may not replace the ones above.
    jinja::Dict extra;
};

class ChatFormat {
public:
    // source: the template text (empty when the model has none); bos_text and
    // eos_text: the vocabulary's BOS and EOS token texts (the template's
    // bos_token and eos_token).
    static ChatFormat make(std::string_view source, std::string bos_text, std::string eos_text);

    // Set when the model's template is not used (none, or it does not parse)
    // or when the fallback family is a guess; for a warning on stderr.
    const std::string& warning() const { return warning_; }
    bool uses_template() const { return program_.has_value(); }
    ChatFamily family() const { return family_.family; }

    Result<std::string> render(const ChatRequest& request) const;

    // True when rendered text already begins with the BOS, so the tokenizer
    // must not add another.
    bool includes_bos(std::string_view rendered) const;

    // Text that ends the assistant's turn (its end-of-turn marker and the
    // opener of a next turn), for the generation loop's stop conditions.
    std::vector<std::string> stop_strings() const;

    // What strftime_now() returns (unset: the local time when rendering).
    void set_now(std::optional<std::tm> now) { now_ = now; }

private:
    std::optional<jinja::Template> program_;
    ChatTemplate family_;
    std::string bos_text_, eos_text_, warning_;
    std::optional<std::tm> now_;
};

// A conversation's messages as the template sees them: dicts with role and
// content, and tool_calls ({"id", "type": "function", "function": {"name",
// "arguments"}}), tool_call_id, name and reasoning_content where a message
// has them.
jinja::Value messages_value(const std::vector<ChatMessage>& messages);

// The variables transformers' apply_chat_template gives a template: messages,
// tools, documents (None), add_generation_prompt, bos_token and eos_token,
// then `extra`, which may add variables but not replace those (an error
// names the one it tried).
Result<jinja::Dict> chat_template_vars(jinja::Value messages, jinja::Value tools, bool add_generation_prompt,
                                       const std::string& bos_text, const std::string& eos_text,
                                       const jinja::Dict& extra);

}  // namespace tern::text
