// How a subcommand reports failure: one line on stderr naming the command and
// the problem, then exit status 1 through CLI11's error path.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

namespace tern::tools {

[[noreturn]] inline void fail(const char* command, const std::string& message) {
    std::fprintf(stderr, "tern %s: error: %s\n", command, message.c_str());
    throw CLI::RuntimeError(1);
}

}  // namespace tern::tools
