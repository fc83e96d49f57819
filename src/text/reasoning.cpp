#include "text/reasoning.h"

namespace tern::text {
namespace {

constexpr std::string_view kOpen = "<think>";
constexpr std::string_view kClose = "</think>";

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// The length of the longest suffix of s that is a proper prefix of tag.
size_t partial_tag(std::string_view s, std::string_view tag) {
    for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
        if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
    return 0;
}

}  // namespace

ReasoningSplitter::ReasoningSplitter(bool opened) : state_(opened ? State::Reasoning : State::Start) {}

ReasoningSplitter::Pieces ReasoningSplitter::push(std::string_view piece) {
    Pieces out;
    held_ += piece;
    for (;;) {
        if (state_ == State::Start) {
            size_t i = 0;
            while (i < held_.size() && is_space(held_[i])) ++i;
            const std::string_view rest = std::string_view(held_).substr(i);
            if (rest.size() >= kOpen.size() && rest.substr(0, kOpen.size()) == kOpen) {
                held_.erase(0, i + kOpen.size());
                state_ = State::Reasoning;
                continue;
            }
            if (kOpen.substr(0, rest.size()) == rest) return out;  // all whitespace, or the tag's start: wait
            state_ = State::Content;
            continue;
        }
        if (state_ == State::Content) {
            if (after_close_) {
                size_t i = 0;
                while (i < held_.size() && is_space(held_[i])) ++i;
                held_.erase(0, i);
                if (held_.empty()) return out;
                after_close_ = false;
            }
            out.content += held_;
            held_.clear();
            return out;
        }
        // Reasoning: up to </think>; leading whitespace dropped, trailing held.
        if (!reasoning_started_) {
            size_t i = 0;
            while (i < held_.size() && is_space(held_[i])) ++i;
            held_.erase(0, i);
        }
        const size_t close = held_.find(kClose);
        if (close != std::string::npos) {
            size_t end = close;
            while (end > 0 && is_space(held_[end - 1])) --end;
            out.reasoning += held_.substr(0, end);
            held_.erase(0, close + kClose.size());
            state_ = State::Content;
            after_close_ = true;
            continue;
        }
        size_t keep = partial_tag(held_, kClose);
        size_t end = held_.size() - keep;
        while (end > 0 && is_space(held_[end - 1])) --end;  // whitespace that may precede </think>
        if (end > 0) reasoning_started_ = true;
        out.reasoning += held_.substr(0, end);
        held_.erase(0, end);
        return out;
    }
}

ReasoningSplitter::Pieces ReasoningSplitter::finish() {
    Pieces out;
    if (state_ == State::Reasoning) {
        out.reasoning = std::move(held_);
    } else if (!(state_ == State::Content && after_close_)) {
        out.content = std::move(held_);  // Start: text that only looked like a tag's beginning
    }
    held_.clear();
    return out;
}

bool prompt_opens_reasoning(std::string_view prompt) {
    size_t end = prompt.size();
    while (end > 0 && is_space(prompt[end - 1])) --end;
    return end >= kOpen.size() && prompt.substr(end - kOpen.size(), kOpen.size()) == kOpen;
}

}  // namespace tern::text
