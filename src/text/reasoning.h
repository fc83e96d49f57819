// A reply's reasoning apart from its answer: the <think>...</think> section
// that Qwen3, DeepSeek-R1 and their kin write before answering, split off
// as the text streams. A reply that does not open with the section (after
// whitespace) is all answer; a prompt whose template already opened it
// (DeepSeek-R1's "<｜Assistant｜><think>\n") starts the reply inside it.
#pragma once

#include <string>
#include <string_view>

namespace tern::text {

class ReasoningSplitter {
public:
    // opened: the prompt ends inside a reasoning section.
    explicit ReasoningSplitter(bool opened = false);

    struct Pieces {
        std::string reasoning, content;
    };
    // The text that became final with this piece: a tag split across pieces,
    // and whitespace that may turn out to frame the reasoning, are held.
    Pieces push(std::string_view piece);
    // The end of the reply: what is still held (an unfinished section's
    // reasoning, or text that only looked like the start of a tag).
    Pieces finish();

private:
    enum class State { Start, Reasoning, Content };
    State state_;
    bool reasoning_started_ = false;  // non-whitespace reasoning seen: later whitespace is kept
    bool after_close_ = false;        // just past </think>: the whitespace before the answer is dropped
    std::string held_;
};

// Whether rendered prompt text ends inside a reasoning section: it ends
// with "<think>" and perhaps whitespace.
bool prompt_opens_reasoning(std::string_view prompt);

}  // namespace tern::text
