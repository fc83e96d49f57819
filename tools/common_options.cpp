// Shared flags and helpers of the model-running subcommands; see common_options.h.
#include "tools/common_options.h"

#include <csignal>
#include <charconv>
#include <functional>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <signal.h>
#include <utility>
#include <system_error>

#include "quant/simd_path.h"
#include "tools/fail.h"
#include "tools/progress.h"

namespace tern::tools {
namespace {

// "-n,--n-predict" -> "--n-predict": the name used in messages.
std::string flag_display_name(const std::string& names) {
    const size_t comma = names.rfind(',');
    return comma == std::string::npos ? names : names.substr(comma + 1);
}

template <class T>
bool parse_whole(const std::string& text, T& out, std::errc& why) {
    const char* begin = text.data();
    const char* end = begin + text.size();
    if (begin != end && *begin == '+') ++begin;  // from_chars rejects a leading '+'
    auto [ptr, ec] = std::from_chars(begin, end, out);
    why = ec;
    return ec == std::errc() && ptr == end && begin != end;
}

}  // namespace

namespace {

// An option whose text `parse` turns into a value, or into what the text is
// not ("an integer", ...) for the error message.
template <class T, class Parse>
CLI::Option* add_parsed_option(CLI::App* cmd, const char* command, const std::string& names,
                               const std::string& help, const char* type_name, Parse parse,
                               std::function<void(T)> store) {
    const std::string flag = flag_display_name(names);
    return cmd
        ->add_option_function<std::string>(
            names,
            [command, flag, parse, store](const std::string& text) {
                std::string is_not;
                const T v = parse(text, is_not);
                if (!is_not.empty()) fail(command, flag + ": '" + text + "' is not " + is_not);
                store(v);
            },
            help)
        ->type_name(type_name);
}

}  // namespace

CLI::Option* add_int_option(CLI::App* cmd, const char* command, const std::string& names, int& dst,
                            const std::string& help) {
    auto parse = [](const std::string& text, std::string& is_not) {
        int v = 0;
        std::errc why{};
        if (!parse_whole(text, v, why))
            is_not = why == std::errc::result_out_of_range ? "in the range of an int" : "an integer";
        return v;
    };
    return add_parsed_option<int>(cmd, command, names, help, "INT", parse, [&dst](int v) { dst = v; });
}

CLI::Option* add_float_option(CLI::App* cmd, const char* command, const std::string& names, float& dst,
                              const std::string& help) {
    auto parse = [](const std::string& text, std::string& is_not) {
        float v = 0;
        std::errc why{};
        if (!parse_whole(text, v, why) || !std::isfinite(v)) is_not = "a finite number";
        return v;
    };
    return add_parsed_option<float>(cmd, command, names, help, "FLOAT", parse, [&dst](float v) { dst = v; });
}

CLI::Option* add_u64_option(CLI::App* cmd, const char* command, const std::string& names,
                            std::optional<uint64_t>& dst, const std::string& help) {
    auto parse = [](const std::string& text, std::string& is_not) {
        uint64_t v = 0;
        std::errc why{};
        if (text.empty() || text[0] == '-' || !parse_whole(text, v, why)) is_not = "an unsigned 64-bit integer";
        return v;
    };
    return add_parsed_option<uint64_t>(cmd, command, names, help, "UINT", parse, [&dst](uint64_t v) { dst = v; });
}

void add_model_flags(CLI::App* cmd, const char* command, ModelFlags& f, const std::string& ctx_help) {
    cmd->add_option("-m,--model", f.model,
                    std::string("GGUF model file (default: $TERN_MODEL, else ") + kDefaultModelFile +
                        " under the current directory or the tern checkout)")
        ->type_name("FILE");
    add_int_option(cmd, command, "-t,--threads", f.threads, "CPU threads (default 0: all cores)");
    add_int_option(cmd, command, "-c,--ctx", f.ctx, ctx_help);
    add_int_option(cmd, command, "-b,--batch", f.batch, "Tokens per forward pass when evaluating a prompt (default 512)");
    add_backend_flags(cmd, command, f);
    cmd->add_flag("-v,--verbose", f.verbose, "Print the model, settings and seed on stderr");
    cmd->allow_extras();
}

void add_backend_flags(CLI::App* cmd, const char* command, ModelFlags& f) {
    cmd->add_option_function<std::string>(
           "--backend",
           [command, &f](const std::string& name) {
               if (name != "auto" && name != "cpu" && name != "cuda")
                   fail(command, "--backend: unknown backend '" + name + "' (choose " + runtime::kBackendChoices + ")");
               f.backend = name;
           },
           "Compute backend: auto (CUDA when this build has it and a GPU is present, else CPU), cpu or cuda "
           "(default auto)")
        ->type_name("NAME");
    add_int_option(cmd, command, "--gpu", f.gpu, "GPU device index for the cuda backend (default 0)");
    add_int_option(cmd, command, "--tp", f.tp,
                   "Tensor parallelism: split the model over N GPUs (--gpu and the N-1 after it, joined by NCCL), "
                   "or over N CPU ranks with --backend cpu (default 1)");
}

void add_sampling_flags(CLI::App* cmd, const char* command, SamplingFlags& s) {
    runtime::SamplerParams& p = s.params;
    const auto dflt = [](double v) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", v);
        return std::string(buf);
    };
    add_float_option(cmd, command, "--temp", p.temperature,
                     "Sampling temperature; 0 = greedy (default " + dflt(p.temperature) + ")");
    add_int_option(cmd, command, "--top-k", p.top_k,
                   "Keep the K most likely tokens; 0 = all (default " + std::to_string(p.top_k) + ")");
    add_float_option(cmd, command, "--top-p", p.top_p,
                     "Nucleus sampling: smallest set with this much probability; 1 = off (default " + dflt(p.top_p) + ")");
    add_float_option(cmd, command, "--min-p", p.min_p,
                     "Drop tokens below this fraction of the best one's probability; 0 = off (default " +
                         dflt(p.min_p) + ")");
    add_float_option(cmd, command, "--repeat-penalty", p.repeat_penalty,
                     "Penalty on recently seen tokens; 1 = off (default " + dflt(p.repeat_penalty) + ")");
    add_int_option(cmd, command, "--repeat-last-n", p.repeat_last_n,
                   "How many recent tokens the penalties look at (default " + std::to_string(p.repeat_last_n) + ")");
    add_float_option(cmd, command, "--presence-penalty", p.presence_penalty,
                     "Subtracted from the logit of every seen token (default " + dflt(p.presence_penalty) + ")");
    add_float_option(cmd, command, "--frequency-penalty", p.frequency_penalty,
                     "Subtracted once per occurrence of a seen token (default " + dflt(p.frequency_penalty) + ")");
    add_u64_option(cmd, command, "-s,--seed", s.seed, "Random seed (default: random; --verbose prints it)");
}

void reject_extras(const char* command, const CLI::App& cmd) {
    const std::vector<std::string> extra = cmd.remaining();
    if (extra.empty()) return;
    const std::string& first = extra.front();
    if (first.size() > 1 && first[0] == '-')
        fail(command, "unknown option '" + first + "' (see tern " + command + " --help)");
    fail(command, "unexpected argument '" + first + "' (see tern " + command + " --help)");
}

std::string resolve_model_path(const char* command, const std::string& flag) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!flag.empty()) {
        if (!fs::exists(flag, ec)) fail(command, "model file not found: " + flag);
        return flag;
    }
    if (const char* env = std::getenv("TERN_MODEL"); env && *env) {
        if (!fs::exists(env, ec)) fail(command, std::string("model file not found: ") + env + " (from TERN_MODEL)");
        return env;
    }
    std::vector<fs::path> tried{fs::current_path(ec) / kDefaultModelFile};
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec && exe.has_parent_path()) tried.push_back(exe.parent_path().parent_path() / kDefaultModelFile);
    std::string places;
    for (const fs::path& p : tried) {
        if (fs::exists(p, ec)) return p.lexically_normal().string();
        places += (places.empty() ? "" : " or ") + p.lexically_normal().string();
    }
    fail(command, "no model given and the default model is not at " + places +
                      " (run scripts/setup to download it, or pass -m FILE)");
}

runtime::SamplerParams finish_sampling(const char* command, const SamplingFlags& flags) {
    runtime::SamplerParams p = flags.params;
    if (flags.seed) {
        p.seed = *flags.seed;
    } else {
        std::random_device rd;
        p.seed = (uint64_t(rd()) << 32) ^ uint64_t(rd());
    }
    if (Status s = p.validate(); !s.ok()) {
        // The sampler names its field ("sampler: top_p must be ..."); say the flag instead.
        static constexpr std::pair<const char*, const char*> kFlagOfField[] = {
            {"temperature", "--temp"}, {"top_k", "--top-k"}, {"top_p", "--top-p"}, {"min_p", "--min-p"},
            {"repeat_penalty", "--repeat-penalty"}, {"repeat_last_n", "--repeat-last-n"},
            {"presence_penalty", "--presence-penalty"}, {"frequency_penalty", "--frequency-penalty"}};
        std::string message = s.message();
        for (const auto& [field, flag] : kFlagOfField) {
            const std::string prefix = std::string("sampler: ") + field + " ";
            if (message.rfind(prefix, 0) == 0) {
                message = std::string(flag) + " " + message.substr(prefix.size());
                break;
            }
        }
        fail(command, "invalid sampling setting: " + message);
    }
    return p;
}

std::unique_ptr<runtime::Engine> open_engine(const char* command, const std::string& path, const ModelFlags& f,
                                             int n_ctx, int n_slots) {
    if (f.threads < 0) fail(command, "--threads must be 0 (all cores) or more (got " + std::to_string(f.threads) + ")");
    if (f.batch < 1) fail(command, "--batch must be at least 1 (got " + std::to_string(f.batch) + ")");
    if (n_ctx < 0) fail(command, "--ctx must be 0 (the model's default) or more (got " + std::to_string(n_ctx) + ")");
    if (f.gpu < 0) fail(command, "--gpu must be 0 or more (got " + std::to_string(f.gpu) + ")");
    if (f.tp < 1 || f.tp > 64) fail(command, "--tp must be between 1 and 64 (got " + std::to_string(f.tp) + ")");
    runtime::EngineOptions o;
    o.backend = f.backend;
    o.gpu = f.gpu;
    o.tp = f.tp;
    o.load_progress = load_progress_bar();
    o.threads = f.threads;
    o.n_ctx = n_ctx;
    o.n_slots = n_slots;
    o.max_batch = f.batch;
    auto engine = runtime::Engine::open(path, o);
    if (!engine.ok()) fail(command, "cannot load " + path + ": " + engine.error().message);
    return std::move(*engine);
}

model::LoadProgress load_progress_bar() {
    // Made at the first report, when the total is known; shared by the copies
    // of the callback the Engine may make.
    auto bar = std::make_shared<std::unique_ptr<ProgressBar>>();
    return [bar](size_t done, size_t total) {
        if (!*bar) *bar = std::make_unique<ProgressBar>("loading model", total);
        (*bar)->update(done);
        if (done >= total) (*bar)->finish();
    };
}

std::string backend_display_name(const runtime::Engine& engine) {
    std::string name = engine.backend_name();
    for (char& c : name) c = char(std::toupper(static_cast<unsigned char>(c)));
    return name;
}

void print_model_summary(const runtime::Engine& engine, const std::string& path) {
    const model::Hparams& hp = engine.model().hp;
    std::string backend = backend_display_name(engine);
    const size_t device_bytes = engine.device_bytes();
    const int gpu = engine.options().gpu, tp = engine.tp();
    if (backend == "CPU")
        backend += std::string(" (") + quant::simd_path_name(quant::simd_path_best()) + " kernels)";
    else
        backend += " (GPU " + (tp > 1 ? std::to_string(gpu) + "-" + std::to_string(gpu + tp - 1) : std::to_string(gpu)) +
                   ", " + format_bytes(device_bytes) + " of device memory)";
    if (tp > 1) backend += ", tensor parallel over " + std::to_string(tp) + " ranks";
    std::fprintf(stderr, "model: %s (%s, %d layers, %d embd, vocab %d), context %d, backend %s\n", path.c_str(),
                 hp.arch.c_str(), hp.n_layer, hp.n_embd, hp.n_vocab, engine.n_ctx(), backend.c_str());
}

std::vector<int32_t> tokenize_prompt(const text::Tokenizer& tok, std::string_view prompt, bool parse_special) {
    // Not encode(add_special): a vocabulary that appends EOS would end the
    // prompt with it, and generation must continue the text instead.
    std::vector<int32_t> ids = tok.encode(prompt, false, parse_special);
    if (tok.vocab().add_bos && tok.bos_id() >= 0) ids.insert(ids.begin(), tok.bos_id());
    return ids;
}

text::ChatFormat chat_format_of(const char* command, const runtime::Engine& engine) {
    const text::Tokenizer& tok = engine.tokenizer();
    auto text_of = [&](int32_t id) { return id >= 0 ? tok.token_to_piece(id) : std::string(); };
    text::ChatFormat format =
        text::ChatFormat::make(engine.chat_template(), text_of(tok.bos_id()), text_of(tok.vocab().eos_id));
    if (!format.warning().empty()) std::fprintf(stderr, "tern %s: warning: %s\n", command, format.warning().c_str());
    return format;
}

namespace {

// True when tokenizing `s` with special-token parsing would produce a control
// token, i.e. the text spells one.
bool spells_control_token(const text::Tokenizer& tok, std::string_view s) {
    for (int32_t id : tok.encode(s, false, true))
        if (tok.is_control(id)) return true;
    return false;
}

std::string_view trim_ws(std::string_view s) {
    const char* ws = " \t\r\n";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string_view::npos) return {};
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace

Result<ChatPrompt> tokenize_chat(const text::Tokenizer& tok, const text::ChatFormat& format,
                                 const text::ChatRequest& request) {
    const std::vector<text::ChatMessage>& messages = request.messages;
    auto rendered = format.render(request);
    if (!rendered.ok()) return rendered.error();
    ChatPrompt p;
    p.text = std::move(*rendered);

    // Spans of message contents that spell control tokens; they are tokenized
    // without special parsing. Contents are located in order (a template may
    // trim them); the usual case, no such content, tokenizes the text whole.
    std::vector<std::pair<size_t, size_t>> plain;  // [begin, end) in p.text
    size_t cursor = 0;
    for (const text::ChatMessage& m : messages) {
        std::string_view content = m.content;
        size_t at = content.empty() ? std::string::npos : p.text.find(content, cursor);
        if (at == std::string::npos) {
            content = trim_ws(content);
            at = content.empty() ? std::string::npos : p.text.find(content, cursor);
        }
        if (at == std::string::npos) continue;
        cursor = at + content.size();
        if (spells_control_token(tok, content)) plain.emplace_back(at, cursor);
    }
    const std::string_view all = p.text;
    if (plain.empty()) {
        p.tokens = tok.encode(all, false, true);
    } else {
        // Cutting the text at the content boundaries can change how the few
        // characters around a cut are merged; that only happens for contents
        // that spell control tokens, where keeping them plain matters more.
        size_t pos = 0;
        auto append = [&](std::string_view piece, bool parse_special) {
            if (piece.empty()) return;
            const std::vector<int32_t> ids = tok.encode(piece, false, parse_special);
            p.tokens.insert(p.tokens.end(), ids.begin(), ids.end());
        };
        for (const auto& [b, e] : plain) {
            append(all.substr(pos, b - pos), true);
            append(all.substr(b, e - b), false);
            pos = e;
        }
        append(all.substr(pos), true);
    }
    if (tok.vocab().add_bos && tok.bos_id() >= 0 && !format.includes_bos(p.text))
        p.tokens.insert(p.tokens.begin(), tok.bos_id());
    return p;
}

void print_timings(int n_prompt, double prompt_ms, int n_generated, double generate_ms) {
    auto line = [](const char* label, double ms, int n) {
        std::fprintf(stderr, "%s = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)\n", label, ms,
                     n, n > 0 ? ms / n : 0.0, ms > 0 ? n * 1000.0 / ms : 0.0);
    };
    std::fprintf(stderr, "\n");
    line("prompt eval time", prompt_ms, n_prompt);
    line("       eval time", generate_ms, n_generated);
    std::fprintf(stderr, "      total time = %10.2f ms / %5d tokens\n", prompt_ms + generate_ms, n_prompt + n_generated);
}

namespace {
volatile std::sig_atomic_t g_interrupted = 0;

extern "C" void on_sigint(int) {
    if (g_interrupted) {
        // Second press: nothing stopped in between, so leave as SIGINT would.
        std::signal(SIGINT, SIG_DFL);
        std::raise(SIGINT);
        return;
    }
    g_interrupted = 1;
}
}  // namespace

void install_interrupt_handler() {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a blocked read of stdin returns, so chat can end
    sigaction(SIGINT, &sa, nullptr);
}

bool interrupted() { return g_interrupted != 0; }
void clear_interrupt() { g_interrupted = 0; }

}  // namespace tern::tools
