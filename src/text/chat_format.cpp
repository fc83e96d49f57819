#include "text/chat_format.h"

#include <utility>

namespace tern::text {

ChatFormat ChatFormat::make(std::string_view source, std::string bos_text, std::string eos_text) {
    ChatFormat f;
    f.bos_text_ = std::move(bos_text);
    f.eos_text_ = std::move(eos_text);
    f.family_ = inspect_chat_template(source);
    if (source.empty()) {
        f.warning_ = "the model has no chat template; using ChatML";
        return f;
    }
    auto parsed = jinja::Template::parse(source);
    if (parsed.ok()) {
        f.program_ = std::move(*parsed);
        return f;
    }
    f.warning_ = "the model's chat template does not parse (" + parsed.error().message + "); using the " +
                 std::string(chat_family_name(f.family_.family)) + " format" +
                 (f.family_.recognized ? " it resembles" : " as a guess");
    return f;
}

jinja::Value messages_value(const std::vector<ChatMessage>& messages) {
    jinja::List out;
    out.reserve(messages.size());
    for (const ChatMessage& m : messages) {
        jinja::Dict d;
        d.set("role", jinja::Value(m.role));
        d.set("content", jinja::Value(m.content));
        if (!m.reasoning_content.empty()) d.set("reasoning_content", jinja::Value(m.reasoning_content));
        if (!m.tool_calls.empty()) {
            jinja::List calls;
            for (const ChatToolCall& c : m.tool_calls) {
                jinja::Dict fn;
                fn.set("name", jinja::Value(c.name));
                fn.set("arguments", c.arguments);
                jinja::Dict call;
                call.set("id", jinja::Value(c.id));
                call.set("type", jinja::Value("function"));
                call.set("function", jinja::Value(std::move(fn)));
                calls.push_back(jinja::Value(std::move(call)));
            }
            d.set("tool_calls", jinja::Value(std::move(calls)));
        }
        if (!m.tool_call_id.empty()) d.set("tool_call_id", jinja::Value(m.tool_call_id));
        if (!m.name.empty()) d.set("name", jinja::Value(m.name));
        out.push_back(jinja::Value(std::move(d)));
    }
    return jinja::Value(std::move(out));
}

Result<jinja::Dict> chat_template_vars(jinja::Value messages, jinja::Value tools, bool add_generation_prompt,
                                       const std::string& bos_text, const std::string& eos_text,
                                       const jinja::Dict& extra) {
    jinja::Dict vars;
    vars.set("messages", std::move(messages));
    vars.set("tools", std::move(tools));
    vars.set("documents", jinja::Value::none());
    vars.set("add_generation_prompt", jinja::Value(add_generation_prompt));
    vars.set("bos_token", jinja::Value(bos_text));
    vars.set("eos_token", jinja::Value(eos_text));
    for (const auto& [key, value] : extra.items) {
        if (vars.find(key)) return Error{"the template variable '" + key + "' is given by the conversation itself"};
        vars.set(key, value);
    }
    return vars;
}

Result<std::string> ChatFormat::render(const ChatRequest& request) const {
    if (!program_) return render_chat(family_, request.messages, request.add_generation_prompt, bos_text_);
    auto vars = chat_template_vars(messages_value(request.messages), request.tools, request.add_generation_prompt,
                                   bos_text_, eos_text_, request.extra);
    if (!vars.ok()) return vars.error();
    jinja::RenderOptions options;
    options.now = now_;
    auto out = program_->render(*vars, options);
    if (!out.ok()) return Error{"chat template: " + out.error().message};
    return out;
}

bool ChatFormat::includes_bos(std::string_view rendered) const {
    if (!program_) return template_includes_bos(family_.family);
    return !bos_text_.empty() && rendered.substr(0, bos_text_.size()) == bos_text_;
}

std::vector<std::string> ChatFormat::stop_strings() const {
    // A template tern does not recognize ends its turns with the EOS or an
    // end-of-generation token, which stop a reply anyway.
    if (program_ && !family_.recognized) return {};
    return chat_stop_strings(family_.family);
}

}  // namespace tern::text
