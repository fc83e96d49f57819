// libFuzzer entry for text/jinja: the input is a chat template, parsed and
// rendered for a small fixed conversation with tight limits. Besides memory
// safety (ASan, UBSan) it checks that the engine only ever answers with text
// or an error that says something, within its limits: output no longer than
// the output limit, and every error message non-empty.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "text/jinja.h"

namespace jinja = tern::text::jinja;

namespace {

void require(bool ok) {
    if (!ok) __builtin_trap();
}

jinja::Dict context() {
    jinja::List messages;
    const char* const turns[][2] = {{"system", "Be brief."}, {"user", "Hi ü"}, {"assistant", "Hello"},
                                    {"tool", "{\"t\": 1}"}, {"user", "Again?"}};
    for (const auto& turn : turns) {
        jinja::Dict m;
        m.set("role", jinja::Value(turn[0]));
        m.set("content", jinja::Value(turn[1]));
        messages.push_back(jinja::Value(std::move(m)));
    }
    jinja::Dict fn;
    fn.set("name", jinja::Value("get_weather"));
    fn.set("arguments", jinja::Value(jinja::Dict{{{"city", jinja::Value("Paris")}}}));
    jinja::Dict call;
    call.set("type", jinja::Value("function"));
    call.set("function", jinja::Value(std::move(fn)));
    jinja::Dict with_call;
    with_call.set("role", jinja::Value("assistant"));
    with_call.set("content", jinja::Value::none());
    with_call.set("tool_calls", jinja::Value(jinja::List{jinja::Value(std::move(call))}));
    messages.push_back(jinja::Value(std::move(with_call)));
    jinja::Dict vars;
    vars.set("messages", jinja::Value(std::move(messages)));
    vars.set("tools", jinja::Value::none());
    vars.set("add_generation_prompt", jinja::Value(true));
    vars.set("bos_token", jinja::Value("<s>"));
    vars.set("eos_token", jinja::Value("</s>"));
    return vars;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const jinja::Dict vars = context();
    const std::string_view source(reinterpret_cast<const char*>(data), size);
    auto t = jinja::Template::parse(source);
    if (!t.ok()) {
        require(!t.error().message.empty());
        return 0;
    }
    jinja::RenderOptions options;
    options.limits.max_output_bytes = 1 << 16;
    options.limits.max_steps = 200000;
    options.limits.max_depth = 64;
    options.limits.max_seconds = 2.0;
    options.limits.max_built_bytes = size_t(64) << 20;
    std::tm now{};
    now.tm_year = 126;
    now.tm_mday = 1;
    options.now = now;
    auto out = t->render(vars, options);
    if (out.ok())
        require(out->size() <= options.limits.max_output_bytes);
    else
        require(!out.error().message.empty());
    return 0;
}
