// A progress bar for long subcommands (quantize, synth). It draws on stderr
// only when stderr is a terminal; in logs it prints a plain line now and then
// for long jobs and nothing for short ones, so test output stays clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace tern::tools {

class ProgressBar {
public:
    // `unit` names what is counted ("bytes" are shown as sizes, anything else as counts).
    ProgressBar(std::string label, uint64_t total, std::string unit = "bytes");
    ~ProgressBar();
    ProgressBar(const ProgressBar&) = delete;
    ProgressBar& operator=(const ProgressBar&) = delete;

    // Sets the amount done. Thread-safe; redraws at most ten times a second.
    void update(uint64_t done);
    // Draws the final state and ends the line (idempotent).
    void finish();

private:
    void draw(uint64_t done, bool final);

    std::string label_;
    std::string unit_;
    uint64_t total_;
    bool tty_;
    bool finished_ = false;
    uint64_t last_done_ = 0;
    std::chrono::steady_clock::time_point start_;
    std::chrono::steady_clock::time_point last_draw_;
    std::mutex mutex_;
};

// "3.80 GiB", "512.0 KiB", "17 B".
std::string format_bytes(uint64_t n);
// "6.74 B", "134.5 M", "1.7 M", "900".
std::string format_count(uint64_t n);

}  // namespace tern::tools
