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
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tern: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
