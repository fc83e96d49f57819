// Each subcommand lives in its own file and adds itself to the CLI here.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace tern::tools {

std::string version_text();

void add_info_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_synth_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_perplexity_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_template_command(CLI::App& app);

}  // namespace tern::tools
