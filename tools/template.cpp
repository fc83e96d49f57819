// `tern template`: renders a chat template exactly as it would prompt the
// model, for checking a model's template or one being written. The template
// comes from a GGUF file (tokenizer.chat_template, or a named one such as
// tokenizer.chat_template.tool_use; -m as the other commands resolve it) or
// a text file; the conversation, tools
// and any extra template variables from JSON. The rendered prompt goes to
// stdout as it is (no newline added); a template error is exit status 1
// with the template's message.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "gguf/gguf.h"
#include "server/json_value.h"
#include "text/chat_format.h"
#include "text/jinja.h"
#include "text/vocab.h"
#include "tools/commands.h"
#include "tools/common_options.h"
#include "tools/fail.h"

namespace tern::tools {
namespace {

using nlohmann::ordered_json;
namespace jinja = text::jinja;

constexpr const char* kCmd = "template";

struct TemplateOptions {
    std::string model, file, messages, tools, kwargs, name, now;
    std::string bos, eos;
    bool bos_set = false, eos_set = false;
    bool no_generation_prompt = false;
};

std::string read_file(const std::string& path, const char* what) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(kCmd, std::string("cannot read ") + what + " " + path);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

ordered_json parse_json(const std::string& text, const std::string& what) {
    try {
        return ordered_json::parse(text);
    } catch (const ordered_json::exception& e) {
        fail(kCmd, what + " is not valid JSON: " + e.what());
    }
}

jinja::Value to_value(const ordered_json& j, const std::string& what) {
    auto v = server::json_to_value(j);
    if (!v) fail(kCmd, what + " nests deeper than " + std::to_string(server::kJsonValueMaxDepth) + " levels");
    return std::move(*v);
}

void run_template(const TemplateOptions& o) {
    if (!o.model.empty() && !o.file.empty()) fail(kCmd, "give the template with one of -m MODEL or --file FILE, not both");
    std::string source, bos = o.bos, eos = o.eos;
    if (o.file.empty()) {
        const std::string model = resolve_model_path(kCmd, o.model);
        auto file = gguf::File::open(model);
        if (!file) fail(kCmd, file.error().message);
        const std::string key = o.name.empty() ? "tokenizer.chat_template" : "tokenizer.chat_template." + o.name;
        const auto tmpl = (*file)->get_string(key);
        if (!tmpl) fail(kCmd, model + " has no " + key);
        source = *tmpl;
        auto vocab = text::load_vocab(**file);
        if (!vocab) fail(kCmd, vocab.error().message);
        auto token_text = [&](int32_t id) { return id >= 0 && id < vocab->size() ? vocab->tokens[size_t(id)] : std::string(); };
        if (!o.bos_set) bos = token_text(vocab->bos_id);
        if (!o.eos_set) eos = token_text(vocab->eos_id);
    } else {
        if (!o.name.empty()) fail(kCmd, "--name picks a template inside a model (-m)");
        source = read_file(o.file, "the template");
    }

    const ordered_json messages = parse_json(read_file(o.messages, "the messages"), o.messages);
    if (!messages.is_array()) fail(kCmd, o.messages + ": the messages must be a JSON array of message objects");
    jinja::Value tools = jinja::Value::none();
    if (!o.tools.empty()) {
        const ordered_json t = parse_json(read_file(o.tools, "the tools"), o.tools);
        if (!t.is_array()) fail(kCmd, o.tools + ": the tools must be a JSON array");
        tools = to_value(t, o.tools);
    }
    jinja::Dict extra;
    if (!o.kwargs.empty()) {
        const ordered_json e = parse_json(o.kwargs, "--kwargs");
        if (!e.is_object()) fail(kCmd, "--kwargs must be a JSON object of template variables");
        extra = to_value(e, "--kwargs").as_dict();
    }
    auto vars = text::chat_template_vars(to_value(messages, o.messages), std::move(tools), !o.no_generation_prompt, bos, eos, extra);
    if (!vars) fail(kCmd, "--kwargs: " + vars.error().message);

    jinja::RenderOptions options;
    if (!o.now.empty()) {
        options.now = jinja::parse_iso_time(o.now);
        if (!options.now) fail(kCmd, "--now: not an ISO-8601 date-time: " + o.now);
    }
    auto tmpl = jinja::Template::parse(source);
    if (!tmpl) fail(kCmd, tmpl.error().message);
    auto out = tmpl->render(*vars, options);
    if (!out) fail(kCmd, out.error().message);
    std::fwrite(out->data(), 1, out->size(), stdout);
}

}  // namespace

void add_template_command(CLI::App& app) {
    auto opts = std::make_shared<TemplateOptions>();
    CLI::App* cmd = app.add_subcommand(
        kCmd, "Render a chat template (a model's, or a file's) for a conversation, as it would prompt the model");
    cmd->add_option("-m,--model", opts->model,
                    "GGUF model whose tokenizer.chat_template to render (default: $TERN_MODEL, else the default model)");
    cmd->add_option("--file", opts->file, "Template file (Jinja) to render instead");
    cmd->add_option("--name", opts->name, "A named template of the model (tokenizer.chat_template.NAME, e.g. tool_use)");
    cmd->add_option("--messages", opts->messages, "JSON file: the conversation, an array of message objects")
        ->required();
    cmd->add_option("--tools", opts->tools, "JSON file: the tools, an array of tool definitions");
    cmd->add_option("--kwargs", opts->kwargs,
                    "JSON object of extra template variables (e.g. '{\"enable_thinking\": false}')");
    cmd->add_flag("--no-generation-prompt", opts->no_generation_prompt,
                  "Render without the assistant turn's opening (add_generation_prompt false)");
    cmd->add_option("--bos", opts->bos, "Text of bos_token (default: the model's BOS token; with --file, empty)")
        ->each([opts](const std::string&) { opts->bos_set = true; });
    cmd->add_option("--eos", opts->eos, "Text of eos_token (default: the model's EOS token; with --file, empty)")
        ->each([opts](const std::string&) { opts->eos_set = true; });
    cmd->add_option("--now", opts->now, "The time strftime_now() formats, ISO-8601 (default: the local time)");
    cmd->callback([opts] { run_template(*opts); });
}

}  // namespace tern::tools
