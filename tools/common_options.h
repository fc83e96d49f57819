// What the model-running subcommands (run, chat, perplexity, bench, serve)
// share: the model/threads/context/batch/backend/GPU flags, the sampling flags, strict
// number parsing that names the flag it rejects, finding the default model,
// opening the engine, and turning a prompt or a conversation into tokens.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "text/chat_format.h"
#include "text/tokenizer.h"

namespace tern::tools {

// The model the commands use when -m is not given (TERN_MODEL overrides it).
inline constexpr const char* kDefaultModelFile = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

struct ModelFlags {
    std::string model;           // empty: the default model
    int threads = 0;             // 0: all cores
    int ctx = 0;                 // 0: the command's default
    int batch = 512;
    std::string backend = "auto";  // auto, cpu or cuda
    int gpu = 0;                   // device index for cuda
    int tp = 1;                    // tensor-parallel ranks
    bool verbose = false;
};

struct SamplingFlags {
    runtime::SamplerParams params;
    std::optional<uint64_t> seed;  // unset: a random seed
};

// Options whose value is parsed strictly (the whole text must be a number in
// range); a bad value fails the command with a message naming the flag.
CLI::Option* add_int_option(CLI::App* cmd, const char* command, const std::string& names, int& dst,
                            const std::string& help);
CLI::Option* add_float_option(CLI::App* cmd, const char* command, const std::string& names, float& dst,
                              const std::string& help);
CLI::Option* add_u64_option(CLI::App* cmd, const char* command, const std::string& names,
                            std::optional<uint64_t>& dst, const std::string& help);

// -m/--model, -t/--threads, -c/--ctx, -b/--batch, --backend, --gpu, --tp, -v/--verbose.
// ctx_help describes the default context of the command.
void add_model_flags(CLI::App* cmd, const char* command, ModelFlags& flags, const std::string& ctx_help);
// --backend (checked to be auto, cpu or cuda as it is parsed), --gpu and --tp.
void add_backend_flags(CLI::App* cmd, const char* command, ModelFlags& flags);
// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n,
// --presence-penalty, --frequency-penalty, --seed.
void add_sampling_flags(CLI::App* cmd, const char* command, SamplingFlags& flags);

// Unknown options and stray arguments are collected (allow_extras) so that
// they fail through the command's own error line with exit status 1.
void reject_extras(const char* command, const CLI::App& cmd);

// The model file to open: the -m value if given, else TERN_MODEL, else the
// default model under the current directory, then under the binary's
// directory's parent. Fails naming every place tried.
std::string resolve_model_path(const char* command, const std::string& flag);

// Checks the sampling values and fills in a random seed when none was given;
// fails naming the bad value.
runtime::SamplerParams finish_sampling(const char* command, const SamplingFlags& flags);

// Opens the model (path already resolved) or fails with the loader's message.
// Weights copied onto a GPU show a progress bar on stderr (see load_progress_bar).
std::unique_ptr<runtime::Engine> open_engine(const char* command, const std::string& path,
                                             const ModelFlags& flags, int n_ctx, int n_slots = 1);

// A load-progress callback drawing a ProgressBar on stderr: a bar on a
// terminal, otherwise a line now and then for a long load. The Engine calls
// it only for backends that copy weights (never cpu).
model::LoadProgress load_progress_bar();

// The backend's name, in upper case as llama-bench prints it ("CPU", "CUDA").
std::string backend_display_name(const runtime::Engine& engine);

// One line on stderr about the loaded model and backend (for --verbose).
void print_model_summary(const runtime::Engine& engine, const std::string& path);

// A plain prompt: BOS first when the vocabulary adds one; parse_special turns
// text such as "<|im_start|>" into the control token.
std::vector<int32_t> tokenize_prompt(const text::Tokenizer& tok, std::string_view prompt, bool parse_special);

// A conversation rendered through the model's chat template, ready to feed.
struct ChatPrompt {
    std::string text;             // the rendered template
    std::vector<int32_t> tokens;  // BOS first unless the template writes it
};

// The chat format of the engine's model: its own template, or (none, or one
// that does not parse) a family's format, with a warning on stderr.
text::ChatFormat chat_format_of(const char* command, const runtime::Engine& engine);

// Renders and tokenizes a conversation. Template markup becomes control
// tokens; message contents never do (text that spells a control token inside
// a message is tokenized as plain text).
Result<ChatPrompt> tokenize_chat(const text::Tokenizer& tok, const text::ChatFormat& format,
                                 const text::ChatRequest& request);

// The llama.cpp-style timing lines on stderr.
void print_timings(int n_prompt, double prompt_ms, int n_generated, double generate_ms);

// SIGINT stops the current generation instead of killing the process; a
// second SIGINT while nothing is generating ends it as usual.
void install_interrupt_handler();
bool interrupted();
void clear_interrupt();

}  // namespace tern::tools
