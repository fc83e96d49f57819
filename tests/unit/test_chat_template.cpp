// text/chat_template: every family against strings written out from its
// official template, detection on real template texts, the SmolLM2 default
// system prompt, validation, and the BOS/stop-string contracts. And
// text/chat_format: the model's own template rendered, the family format
// only as the fallback.
//
// The expected strings were written by hand from each official template and
// then checked by rendering those templates with the jinja2 package the way
// transformers does (trim_blocks and lstrip_blocks on).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "text/chat_format.h"
#include "text/chat_template.h"
#include "tests/support/test_seed.h"

namespace {

using namespace tern::text;

const std::vector<ChatMessage> kConversation = {
    {"system", "You are a terse assistant."},
    {"user", "Hello!"},
    {"assistant", " Hi, how can I help?\n"},  // the space and newline show who trims
    {"user", "What is 2+2?"},
};
const std::vector<ChatMessage> kNoSystem(kConversation.begin() + 1, kConversation.end());

std::string render(ChatFamily f, const std::vector<ChatMessage>& m, bool gen, std::string_view bos) {
    tern::Result<std::string> r = render_chat(f, m, gen, bos);
    EXPECT_TRUE(r.ok()) << chat_family_name(f) << ": " << (r.ok() ? "" : r.error().message);
    return r.ok() ? r.value() : std::string();
}

// ---------------------------------------------------------------- families

TEST(ChatTemplate, ChatML) {
    EXPECT_EQ(render(ChatFamily::ChatML, kConversation, true, "<s>"),
              "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n"
              "<|im_start|>user\nHello!<|im_end|>\n"
              "<|im_start|>assistant\n Hi, how can I help?\n<|im_end|>\n"
              "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
              "<|im_start|>assistant\n");
    EXPECT_EQ(render(ChatFamily::ChatML, kNoSystem, false, ""),
              "<|im_start|>user\nHello!<|im_end|>\n"
              "<|im_start|>assistant\n Hi, how can I help?\n<|im_end|>\n"
              "<|im_start|>user\nWhat is 2+2?<|im_end|>\n");
}

TEST(ChatTemplate, Llama2) {
    // meta-llama/Llama-2-7b-chat-hf: the system block joins the first user
    // turn, each turn is stripped, no generation prompt exists.
    const std::string expected =
        "<s>[INST] <<SYS>>\nYou are a terse assistant.\n<</SYS>>\n\nHello! [/INST]"
        " Hi, how can I help? </s>"
        "<s>[INST] What is 2+2? [/INST]";
    EXPECT_EQ(render(ChatFamily::Llama2, kConversation, true, "<s>"), expected);
    EXPECT_EQ(render(ChatFamily::Llama2, kConversation, false, "<s>"), expected);
    // The strip covers the whole turn: an empty user message eats the
    // blank line after <</SYS>>.
    EXPECT_EQ(render(ChatFamily::Llama2, {{"system", "S"}, {"user", " "}}, true, "<s>"),
              "<s>[INST] <<SYS>>\nS\n<</SYS>> [/INST]");
}

TEST(ChatTemplate, Llama3) {
    EXPECT_EQ(render(ChatFamily::Llama3, kConversation, true, "<|begin_of_text|>"),
              "<|begin_of_text|>"
              "<|start_header_id|>system<|end_header_id|>\n\nYou are a terse assistant.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nHi, how can I help?<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    // Jinja's trim is Python's strip: Unicode spaces go, undecodable bytes stay.
    EXPECT_EQ(render(ChatFamily::Llama3, {{"user", "\u3000\u00a0 hi\u2003\r\n"}}, false, "B"),
              "B<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");
    EXPECT_EQ(render(ChatFamily::Llama3, {{"user", " \xff \x80 "}}, false, ""),
              "<|start_header_id|>user<|end_header_id|>\n\n\xff \x80<|eot_id|>");
    // The template writes BOS with the first message; no message, no BOS.
    EXPECT_EQ(render(ChatFamily::Llama3, {}, true, "B"),
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Mistral) {
    // mistralai/Mistral-7B-Instruct-v0.2 (original template): no space
    // between [/INST] and the reply, content untrimmed.
    EXPECT_EQ(render(ChatFamily::Mistral, kNoSystem, true, "<s>"),
              "<s>[INST] Hello! [/INST] Hi, how can I help?\n</s>[INST] What is 2+2? [/INST]");
    // That template refuses a system message; here it joins the first user
    // message as in the later v1 template.
    EXPECT_EQ(render(ChatFamily::Mistral, kConversation, true, "<s>"),
              "<s>[INST] You are a terse assistant.\n\nHello! [/INST] Hi, how can I help?\n</s>"
              "[INST] What is 2+2? [/INST]");
}

TEST(ChatTemplate, MistralV1) {
    EXPECT_EQ(render(ChatFamily::MistralV1, kConversation, true, "<s>"),
              "<s> [INST] You are a terse assistant.\n\nHello! [/INST]  Hi, how can I help?\n</s>"
              " [INST] What is 2+2? [/INST]");
    EXPECT_EQ(render(ChatFamily::MistralV1, kNoSystem, false, "<s>"),
              "<s> [INST] Hello! [/INST]  Hi, how can I help?\n</s> [INST] What is 2+2? [/INST]");
}

TEST(ChatTemplate, Gemma) {
    // google/gemma-3 template: system text (untrimmed) + blank line at the
    // start of the first turn, turns trimmed, assistant called "model".
    EXPECT_EQ(render(ChatFamily::Gemma, kConversation, true, "<bos>"),
              "<bos><start_of_turn>user\nYou are a terse assistant.\n\nHello!<end_of_turn>\n"
              "<start_of_turn>model\nHi, how can I help?<end_of_turn>\n"
              "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
              "<start_of_turn>model\n");
    // Without a system message this is also exactly Gemma 1/2's template.
    EXPECT_EQ(render(ChatFamily::Gemma, kNoSystem, false, "<bos>"),
              "<bos><start_of_turn>user\nHello!<end_of_turn>\n"
              "<start_of_turn>model\nHi, how can I help?<end_of_turn>\n"
              "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n");
}

TEST(ChatTemplate, Zephyr) {
    EXPECT_EQ(render(ChatFamily::Zephyr, kConversation, true, "<s>"),
              "<|system|>\nYou are a terse assistant.</s>\n"
              "<|user|>\nHello!</s>\n"
              "<|assistant|>\n Hi, how can I help?\n</s>\n"
              "<|user|>\nWhat is 2+2?</s>\n"
              "<|assistant|>\n");
    // The prompt is printed inside the message loop: none without messages.
    EXPECT_EQ(render(ChatFamily::Zephyr, {}, true, "<s>"), "");
}

TEST(ChatTemplate, Phi3) {
    // microsoft/Phi-3.5-mini-instruct: empty system skipped, and without a
    // generation prompt the text ends with the EOS.
    EXPECT_EQ(render(ChatFamily::Phi3, kConversation, true, "<s>"),
              "<|system|>\nYou are a terse assistant.<|end|>\n"
              "<|user|>\nHello!<|end|>\n"
              "<|assistant|>\n Hi, how can I help?\n<|end|>\n"
              "<|user|>\nWhat is 2+2?<|end|>\n"
              "<|assistant|>\n");
    EXPECT_EQ(render(ChatFamily::Phi3, {{"system", ""}, {"user", "Hi"}}, false, "<s>"),
              "<|user|>\nHi<|end|>\n<|endoftext|>");
}

TEST(ChatTemplate, DeepSeekR1) {
    const std::string bos = "<｜begin▁of▁sentence｜>";
    EXPECT_EQ(render(ChatFamily::DeepSeekR1, kConversation, true, bos),
              bos + "You are a terse assistant.<｜User｜>Hello!<｜Assistant｜> Hi, how can I help?\n"
                    "<｜end▁of▁sentence｜><｜User｜>What is 2+2?<｜Assistant｜><think>\n");
    // Reasoning before the last </think> is dropped from past replies; the
    // last system message wins wherever it is.
    const std::vector<ChatMessage> m = {{"system", "A"}, {"user", "q"},
                                        {"assistant", "<think>x</think>y</think>z"},
                                        {"system", "B"}};
    EXPECT_EQ(render(ChatFamily::DeepSeekR1, m, false, bos),
              bos + "B<｜User｜>q<｜Assistant｜>z<｜end▁of▁sentence｜>");
    // Older R1 templates end the prompt at <｜Assistant｜>.
    ChatTemplate t = default_chat_template(ChatFamily::DeepSeekR1);
    t.generation_opens_think = false;
    EXPECT_EQ(render_chat(t, {{"user", "q"}}, true, bos).value(), bos + "<｜User｜>q<｜Assistant｜>");
}

TEST(ChatTemplate, ContentIsInsertedLiterally) {
    const std::vector<ChatMessage> m = {{"user", "<|im_end|>\n<|im_start|>system\n{{ x }}"}};
    EXPECT_EQ(render(ChatFamily::ChatML, m, false, ""),
              "<|im_start|>user\n<|im_end|>\n<|im_start|>system\n{{ x }}<|im_end|>\n");
}

// ---------------------------------------------------------------- SmolLM2

// tokenizer.chat_template of SmolLM2-135M-Instruct, as read from its GGUF.
const char* const kSmolLM2Template =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

TEST(ChatTemplate, SmolLM2TemplateIsChatMLWithItsDefaultSystemPrompt) {
    bool recognized = false;
    EXPECT_EQ(detect_chat_family(kSmolLM2Template, &recognized), ChatFamily::ChatML);
    EXPECT_TRUE(recognized);
    const ChatTemplate t = inspect_chat_template(kSmolLM2Template);
    EXPECT_EQ(t.family, ChatFamily::ChatML);
    EXPECT_TRUE(t.recognized);
    EXPECT_EQ(t.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");

    // What jinja2 renders from the template above for this conversation
    // (rendered once with the jinja2 package and pasted here).
    EXPECT_EQ(render_chat(t, kNoSystem, true, "").value(),
              "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
              "Face<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n Hi, how "
              "can I help?\n<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>"
              "assistant\n");
    // A system message of the caller's replaces the default; an empty
    // conversation prints only the prompt (the default sits inside the loop).
    EXPECT_EQ(render_chat(t, kConversation, true, "").value(),
              render(ChatFamily::ChatML, kConversation, true, ""));
    EXPECT_EQ(render_chat(t, {}, true, "").value(), "<|im_start|>assistant\n");
}

TEST(ChatTemplate, DefaultSystemPromptFromEscapedAndJoinedLiterals) {
    // Shaped like Qwen2.5's template: escapes written as \n, a default in an
    // else branch, and a system literal joined to message content (which is
    // not a default).
    const char* qwen =
        "{%- if messages[0]['role'] == 'system' %}"
        "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{%- else %}"
        "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
        "message.content + '<|im_end|>' + '\\n' }}{%- endfor %}";
    EXPECT_EQ(inspect_chat_template(qwen).default_system,
              "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    // Adjacent literals joined with + count as one printed text; escapes
    // \t, \x41, \u00e9 and quotes decode as Python does.
    const char* joined =
        "{% if messages[0]['role'] != 'system' %}{{ \"<|im_start|>system\\n\" + 'Be \\'brief\\'\\t"
        "\\x41\\u00e9' + \"<|im_end|>\\n\" -}}{% endif %}<|im_start|>";
    EXPECT_EQ(inspect_chat_template(joined).default_system, "Be 'brief'\tA\xc3\xa9");
    // No messages[0] test, or the literal only inside {% %}: no default.
    EXPECT_EQ(inspect_chat_template("{{ '<|im_start|>system\\nX<|im_end|>\\n' }}").default_system, "");
    EXPECT_EQ(inspect_chat_template("{% set s = '<|im_start|>system\\nX<|im_end|>\\n' %}"
                                    "{{ messages[0] }}")
                  .default_system,
              "");
    // Plain ChatML has none.
    EXPECT_EQ(inspect_chat_template("{% for message in messages %}{{'<|im_start|>' + "
                                    "message['role'] + '\\n' + message['content'] + "
                                    "'<|im_end|>' + '\\n'}}{% endfor %}")
                  .default_system,
              "");
}

// ---------------------------------------------------------------- detection

struct DetectCase {
    const char* what;
    const char* text;
    ChatFamily family;
    bool recognized;
};

TEST(ChatTemplate, DetectsFamiliesFromOfficialTemplates) {
    const DetectCase cases[] = {
        {"Llama 2 chat",
         "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
         "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
         "{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
         "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
         "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = "
         "message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + "
         "'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
         "' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
         ChatFamily::Llama2, true},
        {"Llama 3 instruct",
         "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
         "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
         "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
         "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
         "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
         ChatFamily::Llama3, true},
        {"Mistral 7B v0.2",
         "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ "
         "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' "
         "%}{{ message['content'] + eos_token}}{% endif %}{% endfor %}",
         ChatFamily::Mistral, true},
        {"Mistral v1",
         "{{- bos_token }}{%- for message in loop_messages %}{%- if message['role'] == 'user' %}"
         "{{- ' [INST] ' + message['content'] + ' [/INST]' }}{%- elif message['role'] == "
         "'assistant' %}{{- ' ' + message['content'] + eos_token}}{%- endif %}{%- endfor %}",
         ChatFamily::MistralV1, true},
        {"Mistral Small 3 (v7)",
         "{{- bos_token }}{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}"
         "{{- '[INST]' + message['content'] + '[/INST]' }}",
         ChatFamily::Mistral, false},
        {"Gemma",
         "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + role + '\n' + "
         "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}",
         ChatFamily::Gemma, true},
        {"Zephyr",
         "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
         "message['content'] + eos_token }}\n{% endif %}\n{% endfor %}",
         ChatFamily::Zephyr, true},
        {"Zephyr with literal </s>", "<|user|>\n{{ content }}</s>", ChatFamily::Zephyr, true},
        {"Phi-3.5",
         "{% for message in messages %}{% if message['role'] == 'user' %}{{'<|user|>\n' + "
         "message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt "
         "%}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
         ChatFamily::Phi3, true},
        {"DeepSeek-R1",
         "{{bos_token}}{{ns.system_prompt}}{{'<｜User｜>' + message['content']}}"
         "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{{'<｜Assistant｜><think>\\n'}}",
         ChatFamily::DeepSeekR1, true},
        {"Phi-4", "{{'<|im_start|>' + message['role'] + '<|im_sep|>' + message['content']}}",
         ChatFamily::ChatML, false},
        {"ChatGLM", "[gMASK]<sop>{% for item in messages %}<|user|>\n{{ item['content'] }}",
         ChatFamily::ChatML, false},
        {"empty", "", ChatFamily::ChatML, false},
        {"unknown", "{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}",
         ChatFamily::ChatML, false},
    };
    for (const DetectCase& c : cases) {
        bool recognized = !c.recognized;
        EXPECT_EQ(detect_chat_family(c.text, &recognized), c.family) << c.what;
        EXPECT_EQ(recognized, c.recognized) << c.what;
        const ChatTemplate t = inspect_chat_template(c.text);
        EXPECT_EQ(t.family, c.family) << c.what;
        EXPECT_EQ(t.recognized, c.recognized) << c.what;
    }
    EXPECT_EQ(detect_chat_family("<|im_start|>", nullptr), ChatFamily::ChatML);
    EXPECT_TRUE(inspect_chat_template(cases[9].text).generation_opens_think);
    EXPECT_FALSE(inspect_chat_template("<｜User｜><｜Assistant｜>").generation_opens_think);
}

// ---------------------------------------------------------------- validation

const ChatFamily kAll[] = {ChatFamily::ChatML,    ChatFamily::Llama2, ChatFamily::Llama3,
                           ChatFamily::Mistral,   ChatFamily::MistralV1, ChatFamily::Gemma,
                           ChatFamily::Zephyr,    ChatFamily::Phi3,   ChatFamily::DeepSeekR1};

TEST(ChatTemplate, RejectsUnknownRolesByName) {
    for (ChatFamily f : kAll) {
        const std::vector<ChatMessage> m = {{"user", "a"}, {"wizard", "b"}};
        tern::Result<std::string> r = render_chat(f, m, true, "");
        ASSERT_FALSE(r.ok()) << chat_family_name(f);
        EXPECT_NE(r.error().message.find("messages[1]"), std::string::npos) << r.error().message;
        EXPECT_NE(r.error().message.find("'wizard'"), std::string::npos) << r.error().message;
    }
    // Roles are case-sensitive; odd bytes are escaped in the message.
    tern::Result<std::string> r = render_chat(ChatFamily::ChatML, {{"User\n\x01", "a"}}, true, "");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("'User\\x0a\\x01'"), std::string::npos) << r.error().message;
}

// The families have no tool format: tool results and calls are refused, not
// rendered as if they were ordinary turns.
TEST(ChatTemplate, ToolTurnsNeedTheModelsOwnTemplate) {
    for (ChatFamily f : kAll) {
        tern::Result<std::string> r = render_chat(f, {{"user", "a"}, {"tool", "42"}}, true, "");
        ASSERT_FALSE(r.ok()) << chat_family_name(f);
        EXPECT_NE(r.error().message.find("messages[1] is a tool result"), std::string::npos) << r.error().message;
        std::vector<ChatMessage> m = {{"user", "a"}, {"assistant", ""}};
        m[1].tool_calls.push_back({"call_1", "get_time", tern::text::jinja::Value(tern::text::jinja::Dict{})});
        r = render_chat(f, m, true, "");
        ASSERT_FALSE(r.ok()) << chat_family_name(f);
        EXPECT_NE(r.error().message.find("messages[1] is a tool call"), std::string::npos) << r.error().message;
    }
}

TEST(ChatTemplate, SystemAfterTheFirstMessageOnlyWhereTheFormatHasASystemTurn) {
    const std::vector<ChatMessage> m = {{"user", "a"}, {"system", "s"}, {"user", "b"}};
    for (ChatFamily f : kAll) {
        tern::Result<std::string> r = render_chat(f, m, true, "");
        const bool refused = f == ChatFamily::Llama2 || f == ChatFamily::Mistral ||
                             f == ChatFamily::MistralV1 || f == ChatFamily::Gemma;
        EXPECT_EQ(!r.ok(), refused) << chat_family_name(f);
        if (!r.ok()) {
            EXPECT_NE(r.error().message.find("messages[1]"), std::string::npos) << r.error().message;
        }
    }
    EXPECT_EQ(render(ChatFamily::ChatML, m, false, ""),
              "<|im_start|>user\na<|im_end|>\n<|im_start|>system\ns<|im_end|>\n"
              "<|im_start|>user\nb<|im_end|>\n");
}

// ---------------------------------------------------------------- contracts

// Random conversations of the shape every official template accepts (an
// optional system message, then user/assistant alternating): rendering
// succeeds, and each message's text appears in order, verbatim or (for the
// families whose template trims) trimmed.
TEST(ChatTemplate, RandomConversationsKeepEveryMessageInOrder) {
    const unsigned seed = tern::test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const char* const pieces[] = {"word", " ", "\n", "\t", "\xe3\x80\x80", "<|im_end|>", "[INST]",
                                  "</s>", "\xff", "{{ x }}", "\xc3\xa9", "<start_of_turn>"};
    const auto random_text = [&] {
        std::string s = "m" + std::to_string(rng() % 1000000);  // unique, never trimmed away
        for (unsigned k = rng() % 5; k > 0; --k) s += pieces[rng() % std::size(pieces)];
        return s;
    };
    for (int iter = 0; iter < 300; ++iter) {
        std::vector<ChatMessage> m;
        if (rng() % 2) m.push_back({"system", random_text()});
        for (unsigned i = 0, n = 1 + rng() % 5; i < n; ++i)
            m.push_back({i % 2 ? "assistant" : "user", random_text()});
        for (ChatFamily f : kAll) {
            const std::string text = render(f, m, rng() % 2, "<s>");
            const bool trims = f == ChatFamily::Llama2 || f == ChatFamily::Llama3 || f == ChatFamily::Gemma;
            size_t at = 0;
            for (const ChatMessage& msg : m) {
                std::string want = msg.content;
                if (trims) {
                    // Leading text is a unique marker, so only the tail can be trimmed.
                    while (!want.empty() && (want.back() == ' ' || want.back() == '\n' ||
                                             want.back() == '\t'))
                        want.pop_back();
                    if (want.size() >= 3 && want.compare(want.size() - 3, 3, "\xe3\x80\x80") == 0)
                        continue;  // ends in an ideographic space: covered by the Llama3 test
                }
                const size_t found = text.find(want, at);
                ASSERT_NE(found, std::string::npos) << chat_family_name(f) << " lost: " << want;
                at = found + want.size();
            }
        }
    }
}

TEST(ChatTemplate, BosIsInTheTextExactlyWhenTheFamilySaysSo) {
    const std::string bos = "<BOS-MARK>";
    for (ChatFamily f : kAll) {
        const std::string text = render(f, kConversation, true, bos);
        const size_t count = [&] {
            size_t n = 0;
            for (size_t at = text.find(bos); at != std::string::npos; at = text.find(bos, at + 1)) ++n;
            return n;
        }();
        if (template_includes_bos(f)) {
            EXPECT_EQ(text.rfind(bos, 0), 0u) << chat_family_name(f) << " should start with BOS";
            // Llama 2 opens every user turn with BOS; the rest write it once.
            EXPECT_EQ(count, f == ChatFamily::Llama2 ? 2u : 1u) << chat_family_name(f);
        } else {
            EXPECT_EQ(count, 0u) << chat_family_name(f);
        }
    }
}

TEST(ChatTemplate, TheFirstStopStringEndsEveryAssistantTurn) {
    const std::string reply = "the reply";
    for (ChatFamily f : kAll) {
        const std::vector<std::string> stops = chat_stop_strings(f);
        ASSERT_FALSE(stops.empty()) << chat_family_name(f);
        const std::string text = render(f, {{"user", "q"}, {"assistant", reply}}, false, "<s>");
        const size_t at = text.find(reply);
        ASSERT_NE(at, std::string::npos) << chat_family_name(f);
        // What follows the reply (after the format's spacing) is the stop string.
        const std::string after = text.substr(at + reply.size());
        EXPECT_NE(after.find(stops[0]), std::string::npos) << chat_family_name(f) << ": " << after;
        EXPECT_LE(after.find(stops[0]), 1u) << chat_family_name(f) << ": " << after;
    }
}

TEST(ChatTemplate, FamilyNamesAreDistinct) {
    std::vector<std::string_view> names;
    for (ChatFamily f : kAll) {
        const std::string_view n = chat_family_name(f);
        EXPECT_FALSE(n.empty());
        EXPECT_EQ(std::find(names.begin(), names.end(), n), names.end()) << n;
        names.push_back(n);
    }
}

// ---- ChatFormat: the model's own template first ----------------------------------

ChatRequest request_of(std::vector<ChatMessage> messages, bool gen = true) {
    ChatRequest r;
    r.messages = std::move(messages);
    r.add_generation_prompt = gen;
    return r;
}

TEST(ChatFormat, RendersTheModelsTemplateAsItsFamilyDoes) {
    // SmolLM2's own template, rendered by the interpreter, agrees with the
    // ChatML family renderer written from it: with and without a system
    // message, with and without the generation prompt.
    const ChatFormat f = ChatFormat::make(kSmolLM2Template, "<|im_start|>", "<|im_end|>");
    EXPECT_TRUE(f.uses_template());
    EXPECT_TRUE(f.warning().empty()) << f.warning();
    EXPECT_EQ(f.family(), ChatFamily::ChatML);
    const ChatTemplate t = inspect_chat_template(kSmolLM2Template);
    for (const auto* m : {&kConversation, &kNoSystem})
        for (bool gen : {true, false})
            EXPECT_EQ(f.render(request_of(*m, gen)).value(), render_chat(t, *m, gen, "").value());
    EXPECT_EQ(f.stop_strings(), chat_stop_strings(ChatFamily::ChatML));
}

TEST(ChatFormat, TemplatesSeeToolsToolCallsAndExtraVariables) {
    const char* source =
        "{%- if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}|{% endif -%}"
        "{%- for m in messages -%}"
        "[{{ m.role }}]{{ m.content }}"
        "{%- if m.tool_calls is defined %}{% for c in m.tool_calls %} call {{ c.id }} {{ c.type }} "
        "{{ c.function.name }}({{ c.function.arguments | tojson }}){% endfor %}{% endif -%}"
        "{%- if m.tool_call_id is defined %} for {{ m.tool_call_id }}{% endif -%}"
        "{%- if m.reasoning_content is defined %} thought {{ m.reasoning_content }}{% endif %}|"
        "{%- endfor -%}"
        "{%- if enable_thinking is defined %}thinking {{ enable_thinking }}{% endif -%}"
        "{%- if add_generation_prompt %}[assistant]{% endif %}";
    const ChatFormat f = ChatFormat::make(source, "<s>", "</s>");
    ASSERT_TRUE(f.uses_template());
    EXPECT_TRUE(f.stop_strings().empty());  // a template tern does not recognize: EOS ends a turn

    ChatRequest r;
    r.messages = {{"user", "What time is it in Paris?"}, {"assistant", ""}, {"tool", "09:30"}};
    tern::text::jinja::Dict args;
    args.set("city", tern::text::jinja::Value("Paris"));
    r.messages[1].tool_calls.push_back({"call_7", "get_time", tern::text::jinja::Value(std::move(args))});
    r.messages[1].reasoning_content = "Use the tool.";
    r.messages[2].tool_call_id = "call_7";
    tern::text::jinja::Dict fn, tool;
    fn.set("name", tern::text::jinja::Value("get_time"));
    tool.set("type", tern::text::jinja::Value("function"));
    tool.set("function", tern::text::jinja::Value(std::move(fn)));
    r.tools = tern::text::jinja::Value(tern::text::jinja::List{tern::text::jinja::Value(std::move(tool))});
    r.extra.set("enable_thinking", tern::text::jinja::Value(false));
    EXPECT_EQ(f.render(r).value(),
              "tools: get_time|[user]What time is it in Paris?|[assistant] call call_7 function "
              "get_time({\"city\": \"Paris\"}) thought Use the tool.|[tool]09:30 for call_7|thinking "
              "False[assistant]");

    // Variables the conversation sets cannot be replaced by extra ones.
    r.extra.set("messages", tern::text::jinja::Value(tern::text::jinja::List{}));
    tern::Result<std::string> bad = f.render(r);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().message.find("'messages'"), std::string::npos) << bad.error().message;
}

TEST(ChatFormat, TemplateErrorsAreErrorsNotFallbacks) {
    // A template that parses but raises renders nothing: the caller gets the
    // template's own message.
    const ChatFormat f = ChatFormat::make(
        "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with the user') }}"
        "{% endif %}{{ messages[0].content }}",
        "", "");
    EXPECT_EQ(f.render(request_of({{"user", "hi"}})).value(), "hi");
    tern::Result<std::string> r = f.render(request_of({{"assistant", "hi"}}));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("Conversations must start with the user"), std::string::npos)
        << r.error().message;
}

TEST(ChatFormat, FallsBackToTheFamilyOnlyWithoutAUsableTemplate) {
    const ChatFormat none = ChatFormat::make("", "<s>", "</s>");
    EXPECT_FALSE(none.uses_template());
    EXPECT_NE(none.warning().find("no chat template"), std::string::npos) << none.warning();
    EXPECT_EQ(none.render(request_of(kConversation)).value(), render(ChatFamily::ChatML, kConversation, true, "<s>"));

    // A Llama 3 template with a syntax error: the Llama 3 format it resembles,
    // with a warning naming the error.
    const ChatFormat broken = ChatFormat::make(
        "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
        "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{% endfi %}",
        "<|begin_of_text|>", "<|eot_id|>");
    EXPECT_FALSE(broken.uses_template());
    EXPECT_EQ(broken.family(), ChatFamily::Llama3);
    EXPECT_NE(broken.warning().find("does not parse"), std::string::npos) << broken.warning();
    EXPECT_NE(broken.warning().find("endfi"), std::string::npos) << broken.warning();
    EXPECT_EQ(broken.render(request_of(kConversation)).value(),
              render(ChatFamily::Llama3, kConversation, true, "<|begin_of_text|>"));
}

TEST(ChatFormat, BosIsAddedOnlyWhenTheRenderedTextLacksIt) {
    const ChatFormat with = ChatFormat::make("{{ bos_token }}{{ messages[0].content }}", "<bos>", "<eos>");
    const std::string text = with.render(request_of({{"user", "hi"}})).value();
    EXPECT_EQ(text, "<bos>hi");
    EXPECT_TRUE(with.includes_bos(text));
    const ChatFormat without = ChatFormat::make("{{ messages[0].content }}", "<bos>", "<eos>");
    EXPECT_FALSE(without.includes_bos(without.render(request_of({{"user", "hi"}})).value()));
    EXPECT_FALSE(ChatFormat::make("{{ messages[0].content }}", "", "").includes_bos("hi"));
}

TEST(ChatFormat, StrftimeNowReadsTheFixedClock) {
    ChatFormat f = ChatFormat::make("{{ strftime_now('%d %b %Y') }}", "", "");
    f.set_now(tern::text::jinja::parse_iso_time("2026-12-02T10:00:00"));
    EXPECT_EQ(f.render(request_of({{"user", "x"}})).value(), "02 Dec 2026");
}

}  // namespace
