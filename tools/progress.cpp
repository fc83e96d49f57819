// Progress display for the tern subcommands; see progress.h.
#include "tools/progress.h"

#include <algorithm>
#include <cstdio>
#include <unistd.h>

namespace tern::tools {

std::string format_bytes(uint64_t n) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = double(n);
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        ++u;
    }
    char buf[32];
    if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
    else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
    return buf;
}

std::string format_count(uint64_t n) {
    char buf[32];
    if (n >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.2f B", double(n) / 1e9);
    else if (n >= 1000000ull) std::snprintf(buf, sizeof buf, "%.1f M", double(n) / 1e6);
    else if (n >= 1000ull) std::snprintf(buf, sizeof buf, "%.1f K", double(n) / 1e3);
    else std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n));
    return buf;
}

ProgressBar::ProgressBar(std::string label, uint64_t total, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      tty_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::~ProgressBar() {
    // An interrupted bar (an error mid-way) must not leave the cursor mid-line.
    std::lock_guard<std::mutex> lock(mutex_);
    if (tty_ && !finished_) std::fputc('\n', stderr);
}

void ProgressBar::update(uint64_t done) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    last_done_ = done;
    const auto now = std::chrono::steady_clock::now();
    // Logs get a line every 10 s; a terminal gets a redraw every 100 ms.
    const auto interval = tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(10000);
    if (now - last_draw_ < interval) return;
    last_draw_ = now;
    draw(done, false);
}

void ProgressBar::finish() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (finished_) return;
    finished_ = true;
    // Only a terminal shows the completed bar; a log already gets the summary line.
    if (tty_) draw(total_, true);
}

void ProgressBar::draw(uint64_t done, bool final) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double frac = total_ ? std::min(1.0, double(done) / double(total_)) : 1.0;
    const std::string amount = unit_ == "bytes"
                                   ? format_bytes(done) + " / " + format_bytes(total_)
                                   : format_count(done) + " / " + format_count(total_) + " " + unit_;
    char eta[48] = "";
    if (!final && frac > 0.01) std::snprintf(eta, sizeof eta, ", eta %.0f s", elapsed * (1.0 - frac) / frac);
    if (!tty_) {
        std::fprintf(stderr, "%s: %3.0f%% (%s, %.0f s%s)\n", label_.c_str(), frac * 100.0,
                     amount.c_str(), elapsed, eta);
        return;
    }
    constexpr int kWidth = 30;
    const int filled = int(frac * kWidth);
    std::string bar(size_t(filled), '#');
    bar.append(size_t(kWidth - filled), '.');
    std::fprintf(stderr, "\r\033[K%s [%s] %3.0f%% %s, %.1f s%s", label_.c_str(), bar.c_str(),
                 frac * 100.0, amount.c_str(), elapsed, eta);
    if (final) std::fputc('\n', stderr);
    std::fflush(stderr);
}

}  // namespace tern::tools
