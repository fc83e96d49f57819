// load_vocab(): GGUF files written with gguf::Writer carrying good and bad
// tokenizer metadata; errors must name the offending key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "gguf/gguf.h"
#include "test_text_util.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

using namespace tern;
using namespace tern::text;
using namespace tern::text::testing_util;

namespace {

// Writes a tensor-less GGUF whose metadata `fill` sets, and loads its vocab.
Result<Vocab> vocab_from(const std::function<void(gguf::Writer&)>& fill) {
    static int calls = 0;  // a path of its own per call and per process
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("tern_vocab_" + std::to_string(::getpid()) + "_" + std::to_string(calls++) + ".gguf"))
                                 .string();
    gguf::Writer w;
    w.set_string("general.architecture", "llama");
    fill(w);
    Status s = w.begin(path);
    if (s) s = w.finish();
    if (!s) return Error{"writer: " + s.message()};
    auto file = gguf::File::open(path);
    std::filesystem::remove(path);
    if (!file) return Error{"reader: " + file.error().message};
    return load_vocab(**file);
}

void spm_basics(gguf::Writer& w) {
    w.set_string("tokenizer.ggml.model", "llama");
    w.set("tokenizer.ggml.tokens", gguf::Value::of_strings({"<unk>", "<s>", "</s>", "\xE2\x96\x81" "a", "a"}));
    w.set("tokenizer.ggml.scores", gguf::Value::of_f32s({0, 0, 0, -1, -2}));
    w.set("tokenizer.ggml.token_type", gguf::Value::of_i32s({2, 3, 3, 1, 1}));
}

void bpe_basics(gguf::Writer& w) {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.push_back(bpe_bytes_to_text(std::string(1, char(b))));
    tokens.push_back("ab");
    tokens.push_back("<|eot|>");
    std::vector<int32_t> types(tokens.size(), 1);
    types.back() = 3;
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "qwen2");
    w.set("tokenizer.ggml.tokens", gguf::Value::of_strings(tokens));
    w.set("tokenizer.ggml.token_type", gguf::Value::of_i32s(types));
    w.set("tokenizer.ggml.merges", gguf::Value::of_strings({"a b"}));
    w.set_u32("tokenizer.ggml.eos_token_id", 257);
    w.set_u32("tokenizer.ggml.eot_token_id", 257);
}

void expect_error(const Result<Vocab>& r, const std::string& needle) {
    ASSERT_FALSE(r.ok()) << "expected an error mentioning " << needle;
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
}

}  // namespace

TEST(TextVocab, SpmDefaults) {
    auto v = vocab_from(spm_basics);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_EQ(v->kind, VocabKind::Spm);
    EXPECT_EQ(v->size(), 5);
    EXPECT_EQ(v->bos_id, 1);
    EXPECT_EQ(v->eos_id, 2);
    EXPECT_EQ(v->unk_id, 0);
    EXPECT_TRUE(v->add_bos);
    EXPECT_TRUE(v->add_space_prefix);
    EXPECT_FALSE(v->add_eos);
    EXPECT_EQ(v->type(1), TokenType::Control);
    EXPECT_FLOAT_EQ(v->score(3), -1.0f);
    auto t = Tokenizer::create(std::move(v.value()));
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->encode("a", true, false), (std::vector<int32_t>{1, 3}));
}

TEST(TextVocab, SpmFlagsOverride) {
    auto v = vocab_from([](gguf::Writer& w) {
        spm_basics(w);
        w.set_bool("tokenizer.ggml.add_bos_token", false);
        w.set_bool("tokenizer.ggml.add_eos_token", true);
        w.set_bool("tokenizer.ggml.add_space_prefix", false);
        w.set_u32("tokenizer.ggml.padding_token_id", 0);
    });
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_FALSE(v->add_bos);
    EXPECT_TRUE(v->add_eos);
    EXPECT_FALSE(v->add_space_prefix);
    EXPECT_EQ(v->pad_id, 0);
}

TEST(TextVocab, BpeLoadsAndTokenizes) {
    auto v = vocab_from(bpe_basics);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_EQ(v->kind, VocabKind::Bpe);
    EXPECT_EQ(v->pre, "qwen2");
    EXPECT_EQ(v->bos_id, -1);
    EXPECT_FALSE(v->add_bos);
    EXPECT_EQ(v->merges.size(), 1u);
    auto t = Tokenizer::create(std::move(v.value()));
    ASSERT_TRUE(t.ok()) << t.error().message;
    EXPECT_EQ(t->encode("ab<|eot|>", false, true), (std::vector<int32_t>{256, 257}));
    EXPECT_TRUE(t->is_eog(257));
}

TEST(TextVocab, ErrorsNameTheKey) {
    expect_error(vocab_from([](gguf::Writer&) {}), "tokenizer.ggml.model");
    expect_error(vocab_from([](gguf::Writer& w) { w.set_string("tokenizer.ggml.model", "bert"); }), "bert");
    expect_error(vocab_from([](gguf::Writer& w) { w.set_string("tokenizer.ggml.model", "llama"); }),
                 "tokenizer.ggml.tokens");
    expect_error(vocab_from([](gguf::Writer& w) {
                     spm_basics(w);
                     w.set("tokenizer.ggml.scores", gguf::Value::of_f32s({0, 0}));
                 }),
                 "scores");
    expect_error(vocab_from([](gguf::Writer& w) {
                     spm_basics(w);
                     w.set("tokenizer.ggml.token_type", gguf::Value::of_i32s({1, 1, 1, 1, 9}));
                 }),
                 "token_type[4]");
    expect_error(vocab_from([](gguf::Writer& w) {
                     spm_basics(w);
                     w.set_string("tokenizer.ggml.bos_token_id", "one");
                 }),
                 "bos_token_id");
    expect_error(vocab_from([](gguf::Writer& w) {
                     spm_basics(w);
                     w.set_u32("tokenizer.ggml.eos_token_id", 99);
                 }),
                 "eos_token_id");
    expect_error(vocab_from([](gguf::Writer& w) {
                     spm_basics(w);
                     w.set_string("tokenizer.ggml.tokens", "not an array");
                 }),
                 "tokenizer.ggml.tokens");
    expect_error(vocab_from([](gguf::Writer& w) {
                     spm_basics(w);
                     w.set("tokenizer.ggml.tokens", gguf::Value::of_i32s({1, 2, 3, 4, 5}));
                 }),
                 "tokens[0]");
    expect_error(vocab_from([](gguf::Writer& w) {
                     bpe_basics(w);
                     w.set("tokenizer.ggml.merges", gguf::Value::of_i32s({}));
                 }),
                 "merges");
    expect_error(vocab_from([](gguf::Writer& w) {
                     spm_basics(w);
                     w.set_string("tokenizer.ggml.add_bos_token", "yes");
                 }),
                 "add_bos_token");
}
