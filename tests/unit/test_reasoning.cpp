// text/reasoning: replies split into reasoning and answer, the same however
// the text is cut into streamed pieces.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "test_text_util.h"
#include "text/reasoning.h"

namespace {

using tern::text::ReasoningSplitter;

struct Split {
    std::string reasoning, content;
};

Split split(const std::string& reply, bool opened, std::mt19937* rng) {
    ReasoningSplitter s(opened);
    Split out;
    for (size_t i = 0; i < reply.size();) {
        const size_t n = rng ? 1 + (*rng)() % 4 : reply.size();
        const auto p = s.push(std::string_view(reply).substr(i, n));
        out.reasoning += p.reasoning;
        out.content += p.content;
        i += n;
    }
    const auto p = s.finish();
    out.reasoning += p.reasoning;
    out.content += p.content;
    return out;
}

TEST(Reasoning, SplitsTheThinkingFromTheAnswerHoweverItStreams) {
    struct Case {
        const char* reply;
        bool opened;
        const char* reasoning;
        const char* content;
    };
    const Case cases[] = {
        {"<think>\nI should add.\n</think>\n\nThe answer is 4.", false, "I should add.", "The answer is 4."},
        {"  <think>a <b> c\n\nd</think>b", false, "a <b> c\n\nd", "b"},
        {"Let me think.\n</think>\n\nDone.", true, "Let me think.", "Done."},
        {"<think></think>Answer", false, "", "Answer"},
        {"<think>\n\n</think>\n\n", false, "", ""},
        {"<think>still going when the tokens ran out", false, "still going when the tokens ran out", ""},
        {"Just an answer <think>x</think>", false, "", "Just an answer <think>x</think>"},
        {"  Hello", false, "", "  Hello"},
        {"<thin", false, "", "<thin"},
        {"<think>x</thinking> y", false, "x</thinking> y", ""},
        {"<think>é 日本</think>ü", false, "é 日本", "ü"},
    };
    std::mt19937 rng(tern::test::run_seed());
    for (const Case& c : cases) {
        SCOPED_TRACE(c.reply);
        const Split whole = split(c.reply, c.opened, nullptr);
        EXPECT_EQ(whole.reasoning, c.reasoning);
        EXPECT_EQ(whole.content, c.content);
        for (int i = 0; i < 50; ++i) {
            const Split cut = split(c.reply, c.opened, &rng);
            ASSERT_EQ(cut.reasoning, c.reasoning);
            ASSERT_EQ(cut.content, c.content);
        }
    }
}

TEST(Reasoning, PromptsThatOpenTheSection) {
    EXPECT_TRUE(tern::text::prompt_opens_reasoning("<｜Assistant｜><think>\n"));
    EXPECT_TRUE(tern::text::prompt_opens_reasoning("<|im_start|>assistant\n<think>"));
    EXPECT_FALSE(tern::text::prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    EXPECT_FALSE(tern::text::prompt_opens_reasoning("<|im_start|>assistant\n"));
}

}  // namespace
