// `tern run -m MODEL -p PROMPT`: one completion, streamed to stdout as it is
// generated, then the prompt and generation speeds on stderr. With --chat the
// prompt goes through the model's chat template first and the template's
// end-of-turn strings stop the answer; with --grammar every token keeps the
// output inside a GBNF grammar.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/json_schema.h"
#include "runtime/session.h"
#include "server/json_value.h"
#include "tools/commands.h"
#include "tools/common_options.h"
#include "tools/fail.h"

namespace tern::tools {
namespace {

constexpr const char* kCmd = "run";

struct RunOptions {
    ModelFlags model;
    SamplingFlags sampling;
    std::optional<std::string> prompt;
    std::optional<std::string> prompt_file;
    int n_predict = 128;
    bool chat = false;
    std::optional<std::string> system;
    std::vector<std::string> stop;
    bool ignore_eos = false;
    bool truncate = false;
    bool no_special = false;
    std::optional<std::string> grammar;
    std::optional<std::string> grammar_file;
    std::optional<std::string> json_schema;
};

std::string read_text_file(const std::string& path, const char* what) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(kCmd, std::string("cannot open ") + what + " " + path);
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) fail(kCmd, std::string("cannot read ") + what + " " + path);
    return ss.str();
}

void run_run(const RunOptions& o, const CLI::App& cmd) {
    reject_extras(kCmd, cmd);
    if (o.prompt && o.prompt_file) fail(kCmd, "give the prompt with -p or -f, not both");
    if (!o.prompt && !o.prompt_file) fail(kCmd, "no prompt: give one with -p TEXT or -f FILE");
    if (o.n_predict < -1) fail(kCmd, "-n must be -1 (until the context is full) or more (got " + std::to_string(o.n_predict) + ")");
    if (o.system && !o.chat) fail(kCmd, "--system needs --chat");
    const runtime::SamplerParams sampling = finish_sampling(kCmd, o.sampling);
    const std::string prompt = o.prompt ? *o.prompt : read_text_file(*o.prompt_file, "prompt file");

    if (int(bool(o.grammar)) + int(bool(o.grammar_file)) + int(bool(o.json_schema)) > 1)
        fail(kCmd, "give one of --grammar, --grammar-file and --json-schema");
    std::string gbnf;
    if (o.grammar) gbnf = *o.grammar;
    if (o.grammar_file) gbnf = read_text_file(*o.grammar_file, "grammar file");
    if (o.json_schema) {
        const std::string text = read_text_file(*o.json_schema, "JSON schema");
        const nlohmann::ordered_json doc = nlohmann::ordered_json::parse(text, nullptr, false);
        if (doc.is_discarded()) fail(kCmd, *o.json_schema + " is not valid JSON");
        auto schema = server::json_to_value(doc);
        if (!schema) fail(kCmd, *o.json_schema + " nests too deeply");
        auto compiled = runtime::json_schema_to_gbnf(*schema);
        if (!compiled.ok()) fail(kCmd, *o.json_schema + ": " + compiled.error().message);
        gbnf = std::move(*compiled);
    }
    std::shared_ptr<const runtime::Grammar> grammar;
    if (o.grammar || o.grammar_file || o.json_schema) {
        auto g = runtime::Grammar::parse(gbnf);
        if (!g.ok()) fail(kCmd, g.error().message);
        grammar = std::move(*g);
    }

    const std::string path = resolve_model_path(kCmd, o.model.model);
    std::unique_ptr<runtime::Engine> engine = open_engine(kCmd, path, o.model, o.model.ctx);
    const text::Tokenizer& tok = engine->tokenizer();
    if (o.model.verbose) {
        print_model_summary(*engine, path);
        std::fprintf(stderr, "seed: %llu\n", static_cast<unsigned long long>(sampling.seed));
    }

    runtime::GenerateOptions gen;
    gen.max_tokens = o.n_predict;
    gen.sampling = sampling;
    gen.stop = o.stop;
    gen.ignore_eos = o.ignore_eos;
    gen.truncate_prompt = o.truncate;
    gen.grammar = grammar;

    std::vector<int32_t> tokens;
    if (o.chat) {
        const text::ChatFormat format = chat_format_of(kCmd, *engine);
        text::ChatRequest chat;
        if (o.system) chat.messages.push_back({"system", *o.system});
        chat.messages.push_back({"user", prompt});
        auto rendered = tokenize_chat(tok, format, chat);
        if (!rendered.ok()) fail(kCmd, rendered.error().message);
        tokens = std::move(rendered->tokens);
        for (const std::string& s : format.stop_strings()) gen.stop.push_back(s);
        if (o.model.verbose) std::fprintf(stderr, "rendered prompt:\n%s\n", rendered->text.c_str());
    } else {
        tokens = tokenize_prompt(tok, prompt, !o.no_special);
    }
    if (tokens.empty()) fail(kCmd, "the prompt is empty");
    if (o.model.verbose) std::fprintf(stderr, "prompt: %zu tokens\n", tokens.size());

    runtime::Session session(*engine);
    install_interrupt_handler();
    bool ends_with_newline = true;
    auto stream = [&ends_with_newline](std::string_view piece) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        if (!piece.empty()) ends_with_newline = piece.back() == '\n';
        return !interrupted();
    };
    auto result = session.generate(tokens, gen, stream);
    if (!result.ok()) fail(kCmd, result.error().message);
    if (!ends_with_newline) std::fputc('\n', stdout);
    std::fflush(stdout);
    print_timings(result->n_prompt, result->prompt_ms, result->n_generated, result->generate_ms);
    if (o.model.verbose) std::fprintf(stderr, "finish reason: %s\n", runtime::finish_reason_name(result->finish));
    if (o.model.verbose && grammar)
        std::fprintf(stderr, "grammar: %d of %d tokens drawn again from the masked vocabulary; %.3f ms a token\n",
                     result->n_grammar_masks, result->n_generated,
                     result->n_generated ? result->grammar_ms / result->n_generated : 0.0);
}

}  // namespace

void add_run_command(CLI::App& app) {
    auto o = std::make_shared<RunOptions>();
    CLI::App* cmd = app.add_subcommand("run", "Generate a completion for one prompt, streamed to stdout");
    add_model_flags(cmd, kCmd, o->model, "Context size in tokens (default 0: the model's, at most 4096)");
    cmd->add_option("-p,--prompt", o->prompt, "Prompt text")->type_name("TEXT");
    cmd->add_option("-f,--file", o->prompt_file, "Read the prompt from this file")->type_name("FILE");
    add_int_option(cmd, kCmd, "-n,--n-predict", o->n_predict, "Tokens to generate at most; -1 = until the context is full (default 128)");
    add_sampling_flags(cmd, kCmd, o->sampling);
    cmd->add_flag("--chat", o->chat, "Render the prompt as a user message through the model's chat template");
    cmd->add_option("--system", o->system, "System message (with --chat)")->type_name("TEXT");
    cmd->add_option("--stop", o->stop, "Stop when this text is generated (not printed); repeatable")
        ->type_name("TEXT")
        ->allow_extra_args(false);
    cmd->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-generation tokens");
    cmd->add_flag("--truncate", o->truncate,
                  "When the prompt does not fit the context, keep its newest tokens (half the context) instead of failing");
    cmd->add_flag("--no-special", o->no_special,
                  "Tokenize text like <|im_start|> in the prompt as plain text (default: as the control token; "
                  "--chat message contents are always plain)");
    cmd->add_option("--grammar", o->grammar,
                    "Constrain the output to this GBNF grammar (llama.cpp's format; the text of the grammar)")
        ->type_name("GBNF");
    cmd->add_option("--grammar-file", o->grammar_file, "Constrain the output to the GBNF grammar in this file")
        ->type_name("FILE");
    cmd->add_option("--json-schema", o->json_schema,
                    "Constrain the output to JSON valid under the JSON Schema in this file (docs/structured-output.md)")
        ->type_name("FILE");
    cmd->callback([o, cmd] { run_run(*o, *cmd); });
}

}  // namespace tern::tools
