// tern: run GGUF language models. Dispatches to one subcommand per file.
#include <cstdio>
#include <exception>

#include "tools/commands.h"

int main(int argc, char** argv) {
    CLI::App app{"tern: runs GGUF language models (llama.cpp's files, faster on NVIDIA Hopper)"};
    app.set_version_flag("--version", tern::tools::version_text);
    app.require_subcommand(1);
    tern::tools::add_info_command(app);
    tern::tools::add_quantize_command(app);
    tern::tools::add_synth_command(app);
    tern::tools::add_run_command(app);
    tern::tools::add_chat_command(app);
    tern::tools::add_perplexity_command(app);
    tern::tools::add_bench_command(app);
    tern::tools::add_template_command(app);
#ifdef TERN_HAVE_SERVER
    tern::tools::add_serve_command(app);
#endif
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // Help and --version exit 0; every usage error exits 1 after CLI11's message.
        return app.exit(e) == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tern: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
