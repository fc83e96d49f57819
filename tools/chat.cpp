// `tern chat -m MODEL`: a conversation on stdin/stdout. Each user line joins
// the history, the whole conversation is rendered through the model's chat
// template, and the Session reuses the KV cache of the prefix it already
// holds, so a turn costs only its new tokens. Works from a terminal (with a
// "> " prompt) and from a pipe (reads until end of input).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/session.h"
#include "tools/commands.h"
#include "tools/common_options.h"
#include "tools/fail.h"

namespace tern::tools {
namespace {

constexpr const char* kCmd = "chat";

struct ChatOptions {
    ModelFlags model;
    SamplingFlags sampling;
    std::optional<std::string> system;
    int n_predict = -1;
};

// The history's first message that can be dropped (a system message stays).
size_t first_droppable(const std::vector<text::ChatMessage>& messages) {
    return !messages.empty() && messages.front().role == "system" ? 1 : 0;
}

// Renders the conversation, dropping the oldest turns (a user message and the
// replies after it) until the prompt leaves `reserve` positions for the
// answer. The newest user message is never dropped: if it alone does not fit,
// that is an error.
Result<ChatPrompt> fit_conversation(const text::Tokenizer& tok, const text::ChatFormat& format,
                                    std::vector<text::ChatMessage>& messages, int n_ctx, int reserve,
                                    int& dropped_turns) {
    dropped_turns = 0;
    for (;;) {
        text::ChatRequest chat;
        chat.messages = messages;
        auto p = tokenize_chat(tok, format, chat);
        if (!p.ok()) return p.error();
        if (int64_t(p->tokens.size()) + reserve <= n_ctx) return p;
        const size_t first = first_droppable(messages);
        if (messages.size() - first <= 1)
            return Error{"the message takes " + std::to_string(p->tokens.size()) +
                         " tokens with the template and does not fit the context of " + std::to_string(n_ctx) +
                         " with room for an answer (" + std::to_string(reserve) + " tokens); use a larger --ctx"};
        messages.erase(messages.begin() + int64_t(first));
        while (messages.size() - first > 1 && messages[first].role != "user")
            messages.erase(messages.begin() + int64_t(first));
        ++dropped_turns;
    }
}

void run_chat(const ChatOptions& o, const CLI::App& cmd) {
    reject_extras(kCmd, cmd);
    if (o.n_predict < -1 || o.n_predict == 0)
        fail(kCmd, "-n must be -1 (until the context is full) or positive (got " + std::to_string(o.n_predict) + ")");
    const runtime::SamplerParams sampling = finish_sampling(kCmd, o.sampling);
    const std::string path = resolve_model_path(kCmd, o.model.model);
    std::unique_ptr<runtime::Engine> engine = open_engine(kCmd, path, o.model, o.model.ctx);
    const text::Tokenizer& tok = engine->tokenizer();
    const text::ChatFormat format = chat_format_of(kCmd, *engine);
    const int n_ctx = engine->n_ctx();
    if (o.model.verbose) {
        print_model_summary(*engine, path);
        std::fprintf(stderr, "seed: %llu\n", static_cast<unsigned long long>(sampling.seed));
    }

    runtime::GenerateOptions gen;
    gen.max_tokens = o.n_predict;
    gen.sampling = sampling;
    for (const std::string& s : format.stop_strings()) gen.stop.push_back(s);
    // Room kept for each answer when old turns must go; an unlimited answer
    // still ends at the context's end and the next turn makes room again.
    const int reserve = std::min(o.n_predict > 0 ? o.n_predict : n_ctx / 4, n_ctx / 2);

    std::vector<text::ChatMessage> messages;
    if (o.system) messages.push_back({"system", *o.system});
    runtime::Session session(*engine);
    const bool tty = isatty(STDIN_FILENO) != 0;
    if (tty) std::fprintf(stderr, "chat with %s: /reset clears the history, /exit or Ctrl-D ends\n", path.c_str());
    install_interrupt_handler();

    std::string line;
    for (;;) {
        if (tty) {
            std::fputs("> ", stdout);
            std::fflush(stdout);
        }
        clear_interrupt();
        if (!std::getline(std::cin, line)) break;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        if (line == "/exit" || line == "/quit") break;
        if (line == "/reset") {
            messages.erase(messages.begin() + int64_t(first_droppable(messages)), messages.end());
            session.reset();
            std::fprintf(stderr, "(history cleared)\n");
            continue;
        }

        messages.push_back({"user", line});
        int dropped = 0;
        auto prompt = fit_conversation(tok, format, messages, n_ctx, reserve, dropped);
        if (!prompt.ok()) {
            std::fprintf(stderr, "tern chat: error: %s\n", prompt.error().message.c_str());
            messages.pop_back();
            continue;
        }
        if (dropped > 0)
            std::fprintf(stderr, "(context full: dropped the %d oldest turn%s of the conversation)\n", dropped,
                         dropped == 1 ? "" : "s");

        auto stream = [](std::string_view piece) {
            std::fwrite(piece.data(), 1, piece.size(), stdout);
            std::fflush(stdout);
            return !interrupted();
        };
        auto result = session.generate(prompt->tokens, gen, stream);
        if (!result.ok()) fail(kCmd, result.error().message);
        std::fputc('\n', stdout);
        std::fflush(stdout);
        // Kept even when cut short (Ctrl-C or length): it is what the user saw.
        messages.push_back({"assistant", result->text});
        if (o.model.verbose)
            print_timings(result->n_prompt, result->prompt_ms, result->n_generated, result->generate_ms);
        if (result->finish == runtime::FinishReason::Cancelled) std::fprintf(stderr, "(answer interrupted)\n");
    }
    if (tty) std::fputc('\n', stdout);
    std::fflush(stdout);
}

}  // namespace

void add_chat_command(CLI::App& app) {
    auto o = std::make_shared<ChatOptions>();
    CLI::App* cmd = app.add_subcommand(
        "chat", "Interactive chat: one user message per line on stdin, answers streamed to stdout");
    add_model_flags(cmd, kCmd, o->model, "Context size in tokens (default 0: the model's, at most 4096)");
    cmd->add_option("--system", o->system, "System message")->type_name("TEXT");
    add_int_option(cmd, kCmd, "-n,--n-predict", o->n_predict,
                   "Tokens per answer at most; -1 = until end of turn or a full context (default -1)");
    add_sampling_flags(cmd, kCmd, o->sampling);
    cmd->callback([o, cmd] { run_chat(*o, *cmd); });
}

}  // namespace tern::tools
