// Synthetic models (src/model/synth): preset shapes against the parameter
// counts of the real checkpoints, shape validation, the seeded weights
// (determinism, independence from chunking, statistics), both tokenizer
// layouts (uniqueness, UTF-8, byte tokens, merge consistency, special ids) and
// whole files read back through the GGUF reader.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "gguf/gguf.h"
#include "model/synth.h"
#include "quant/quant.h"
#include "tests/support/test_seed.h"

namespace tern::model {
namespace {

uint64_t param_count(const SynthShape& s) {
    uint64_t n = 0;
    for (const SynthTensor& t : synth_tensors(s)) n += uint64_t(t.n_elements());
    return n;
}

bool valid_utf8(const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        if (len == 0 || i + len > s.size()) return false;
        for (size_t k = 1; k < len; ++k)
            if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
        i += len;
    }
    return true;
}

std::string temp_path(const std::string& name) {
    return (std::filesystem::path(::testing::TempDir()) /
            (name + "-" + std::to_string(::getpid()) + ".gguf")).string();
}

std::string read_all(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(Synth, PresetsMatchTheRealParameterCounts) {
    EXPECT_EQ(param_count(*synth_preset("llama2-7b")), 6738415616u);
    EXPECT_EQ(param_count(*synth_preset("llama3-8b")), 8030261248u);
    EXPECT_EQ(param_count(*synth_preset("qwen2-7b")), 7615616512u);
    EXPECT_EQ(param_count(*synth_preset("qwen3-8b")), 8190735360u);  // Qwen3-8B
    EXPECT_EQ(synth_tensors(*synth_preset("qwen3-8b")).size(), 36u * 11 + 3);  // q/k norms, no biases
    // Gemma 3 270M: the sum over the tensors of the published GGUF; its tensor
    // count too (13 per layer, tied output). Gemma 3 4B's text model, from its
    // published configuration (2560 wide, 34 layers, 8/4 heads of 256, FFN
    // 10240, 262,208 tokens).
    EXPECT_EQ(param_count(*synth_preset("gemma3-270m")), 268098176u);
    EXPECT_EQ(synth_tensors(*synth_preset("gemma3-270m")).size(), 236u);
    EXPECT_EQ(param_count(*synth_preset("gemma3-4b")), 3880263168u);
    EXPECT_EQ(param_count(*synth_preset("phi3-mini")), 3821079552u);  // Phi-3-mini
    EXPECT_EQ(synth_tensors(*synth_preset("phi3-mini")).size(), 32u * 6 + 3);  // fused qkv and gate/up
    // The mixtures of experts: Qwen3-30B-A3B (128 experts of 768, 8 used) and
    // Mixtral 8x7B (8 of 14336, 2 used), their published parameter counts; a
    // layer's experts are three stacked tensors beside the router.
    EXPECT_EQ(param_count(*synth_preset("qwen3-30b-a3b")), 30532122624u);
    EXPECT_EQ(synth_tensors(*synth_preset("qwen3-30b-a3b")).size(), 48u * 12 + 3);
    EXPECT_EQ(param_count(*synth_preset("mixtral-8x7b")), 46702792704u);
    EXPECT_EQ(synth_tensors(*synth_preset("mixtral-8x7b")).size(), 32u * 10 + 3);
    EXPECT_EQ(synth_tensors(*synth_preset("llama2-7b")).size(), 291u);
    EXPECT_EQ(synth_tensors(*synth_preset("qwen2-7b")).size(), 28u * 12 + 3);
    for (const std::string& name : synth_preset_names()) {
        auto s = synth_preset(name);
        ASSERT_TRUE(s) << name;
        EXPECT_TRUE(check_synth_shape(*s).ok()) << name;
    }
    EXPECT_FALSE(synth_preset("llama4-400b"));
}

TEST(Synth, TensorShapesFollowTheLlamaLayout) {
    const SynthShape s = *synth_preset("llama3-8b");
    std::map<std::string, std::vector<int64_t>> ne;
    for (const SynthTensor& t : synth_tensors(s)) ne[t.name] = t.ne;
    EXPECT_EQ(ne.at("token_embd.weight"), (std::vector<int64_t>{4096, 128256}));
    EXPECT_EQ(ne.at("blk.0.attn_q.weight"), (std::vector<int64_t>{4096, 4096}));
    EXPECT_EQ(ne.at("blk.0.attn_k.weight"), (std::vector<int64_t>{4096, 1024}));
    EXPECT_EQ(ne.at("blk.31.attn_v.weight"), (std::vector<int64_t>{4096, 1024}));
    EXPECT_EQ(ne.at("blk.0.ffn_gate.weight"), (std::vector<int64_t>{4096, 14336}));
    EXPECT_EQ(ne.at("blk.0.ffn_down.weight"), (std::vector<int64_t>{14336, 4096}));
    EXPECT_EQ(ne.at("output_norm.weight"), (std::vector<int64_t>{4096}));
    EXPECT_EQ(ne.at("output.weight"), (std::vector<int64_t>{4096, 128256}));
    EXPECT_FALSE(ne.count("blk.0.attn_q.bias"));
    const SynthShape q = *synth_preset("qwen2-7b");
    ne.clear();
    for (const SynthTensor& t : synth_tensors(q)) ne[t.name] = t.ne;
    EXPECT_EQ(ne.at("blk.0.attn_k.bias"), (std::vector<int64_t>{512}));
    EXPECT_EQ(ne.at("blk.0.attn_q.bias"), (std::vector<int64_t>{3584}));
    SynthShape tied = *synth_preset("tiny");
    tied.tied_output = true;
    for (const SynthTensor& t : synth_tensors(tied)) EXPECT_NE(t.name, "output.weight");
}

TEST(Synth, ShapeChecksNameTheProblem) {
    SynthShape s = *synth_preset("tiny");
    s.n_head = 3;  // 256 % 3 != 0
    EXPECT_NE(check_synth_shape(s).message().find("n_head"), std::string::npos);
    s = *synth_preset("tiny");
    s.n_head_kv = 3;
    EXPECT_NE(check_synth_shape(s).message().find("n_head_kv"), std::string::npos);
    s = *synth_preset("tiny");
    s.n_embd = 4 * 33;  // head size 33
    EXPECT_NE(check_synth_shape(s).message().find("odd"), std::string::npos);
    s = *synth_preset("tiny");
    s.n_layer = 0;
    EXPECT_NE(check_synth_shape(s).message().find("n_layer"), std::string::npos);
    s = *synth_preset("tiny");
    s.arch = "gpt-j";
    EXPECT_NE(check_synth_shape(s).message().find("gpt-j"), std::string::npos);
    s = *synth_preset("tiny");
    s.n_vocab = 100;
    auto v = synth_vocab(s);
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.error().message.find("too small"), std::string::npos);
}

TEST(Synth, WeightsAreSeededPerRow) {
    const uint64_t seed = test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    const SynthTensor t{"blk.1.ffn_up.weight", {512, 64}, SynthInit::Normal};
    std::vector<float> whole(512 * 64), pieces(512 * 64), again(512 * 64), other(512 * 64);
    synth_fill_rows(seed, t, 0, 64, whole.data());
    // Any split into row ranges gives the same numbers.
    for (int64_t r = 0; r < 64;) {
        const int64_t n = std::min<int64_t>(64 - r, 1 + int64_t(seed % 7) + r % 5);
        synth_fill_rows(seed, t, r, n, pieces.data() + r * 512);
        r += n;
    }
    synth_fill_rows(seed, t, 0, 64, again.data());
    synth_fill_rows(seed + 1, t, 0, 64, other.data());
    EXPECT_EQ(whole, pieces);
    EXPECT_EQ(whole, again);
    size_t same = 0;
    for (size_t i = 0; i < whole.size(); ++i) same += whole[i] == other[i];
    EXPECT_LT(same, whole.size() / 100);
    // A different tensor name gives different numbers too.
    const SynthTensor u{"blk.1.ffn_gate.weight", {512, 64}, SynthInit::Normal};
    synth_fill_rows(seed, u, 0, 64, other.data());
    EXPECT_NE(whole, other);
}

TEST(Synth, WeightStatistics) {
    const uint64_t seed = test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    for (SynthInit init : {SynthInit::Normal, SynthInit::NearOne}) {
        const SynthTensor t{"w", {1000, 400}, init};
        std::vector<float> x(1000 * 400);
        synth_fill_rows(seed, t, 0, 400, x.data());
        double sum = 0, sq = 0, fourth = 0;
        for (float v : x) sum += v;
        const double mean = sum / double(x.size());
        for (float v : x) {
            const double d = v - mean;
            sq += d * d;
            fourth += d * d * d * d;
        }
        const double var = sq / double(x.size());
        EXPECT_NEAR(mean, init == SynthInit::NearOne ? 1.0 : 0.0, 2e-4);
        EXPECT_NEAR(std::sqrt(var), 0.02, 2e-4);
        EXPECT_NEAR(fourth / double(x.size()) / (var * var), 3.0, 0.05);  // Gaussian kurtosis
    }
}

TEST(Synth, SentencePieceVocabulary) {
    const SynthShape s = *synth_preset("llama2-7b");
    auto v = synth_vocab(s);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_EQ(v->model, "llama");
    ASSERT_EQ(v->tokens.size(), 32000u);
    ASSERT_EQ(v->scores.size(), 32000u);
    ASSERT_EQ(v->token_types.size(), 32000u);
    EXPECT_TRUE(v->merges.empty());
    EXPECT_EQ(v->tokens[0], "<unk>");
    EXPECT_EQ(v->tokens[1], "<s>");
    EXPECT_EQ(v->tokens[2], "</s>");
    EXPECT_EQ(v->tokens[3 + 0x41], "<0x41>");
    EXPECT_EQ(v->tokens[3 + 0xFF], "<0xFF>");
    EXPECT_EQ(v->token_types[0], kTokenUnknown);
    EXPECT_EQ(v->token_types[1], kTokenControl);
    for (int b = 0; b < 256; ++b) EXPECT_EQ(v->token_types[3 + b], kTokenByte);
    EXPECT_EQ(std::set<std::string>(v->tokens.begin(), v->tokens.end()).size(), 32000u);
    for (size_t i = 259; i < 32000; ++i) {
        ASSERT_EQ(v->token_types[i], kTokenNormal) << i;
        ASSERT_TRUE(valid_utf8(v->tokens[i])) << i;
        ASSERT_FALSE(v->tokens[i].empty());
        if (i > 259) {
            ASSERT_LT(v->scores[i], v->scores[i - 1]) << i;
        }
    }
    EXPECT_EQ(v->tokens[259], "\xE2\x96\x81");  // the word marker alone
    EXPECT_EQ(v->bos_id, 1);
    EXPECT_EQ(v->eos_id, 2);
    EXPECT_EQ(v->unk_id, 0);
    EXPECT_TRUE(v->add_bos);
}

// The inverse of the byte-to-symbol table: which byte a base token stands for.
std::map<std::string, int> base_symbol_bytes(const std::vector<std::string>& tokens) {
    std::map<std::string, int> out;
    for (int i = 0; i < 256; ++i) {
        const std::string& t = tokens[size_t(i)];
        // Decode the single code point.
        const unsigned char c = static_cast<unsigned char>(t[0]);
        const uint32_t cp = c < 0x80 ? c : (uint32_t(c & 0x1F) << 6) | (static_cast<unsigned char>(t[1]) & 0x3F);
        out[t] = cp < 256 ? int(cp) : -int(cp);
    }
    return out;
}

TEST(Synth, ByteLevelBpeVocabularies) {
    for (const char* preset : {"llama3-8b", "qwen2-7b"}) {
        SCOPED_TRACE(preset);
        const SynthShape s = *synth_preset(preset);
        auto v = synth_vocab(s);
        ASSERT_TRUE(v.ok()) << v.error().message;
        const size_t n = size_t(s.n_vocab);
        EXPECT_EQ(v->model, "gpt2");
        ASSERT_EQ(v->tokens.size(), n);
        ASSERT_EQ(v->token_types.size(), n);
        EXPECT_TRUE(v->scores.empty());
        EXPECT_EQ(std::unordered_set<std::string>(v->tokens.begin(), v->tokens.end()).size(), n);
        // 256 one-code-point symbols; printable bytes stand for themselves.
        const auto bytes = base_symbol_bytes(v->tokens);
        EXPECT_EQ(bytes.size(), 256u);
        EXPECT_EQ(v->tokens[0], "!");
        EXPECT_EQ(bytes.at("A"), 'A');
        EXPECT_EQ(bytes.count(" "), 0u);  // the space is a mapped symbol, never itself
        EXPECT_EQ(bytes.at("\xC4\xA0"), -0x120);
        // Every merge joins two earlier tokens into the next token.
        std::unordered_map<std::string, size_t> id;
        for (size_t i = 0; i < n; ++i) id[v->tokens[i]] = i;
        for (size_t k = 0; k < v->merges.size(); ++k) {
            const std::string& m = v->merges[k];
            const size_t sp = m.find(' ');
            ASSERT_NE(sp, std::string::npos) << m;
            ASSERT_EQ(m.find(' ', sp + 1), std::string::npos) << m;
            const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
            ASSERT_LT(id.at(a), 256 + k) << m;
            ASSERT_LT(id.at(b), 256 + k) << m;
            ASSERT_EQ(v->tokens[256 + k], a + b) << k;
            ASSERT_TRUE(valid_utf8(v->tokens[256 + k]));
        }
        EXPECT_FALSE(v->chat_template.empty());
    }
    auto l3 = synth_vocab(*synth_preset("llama3-8b"));
    EXPECT_EQ(l3->merges.size(), 128000u - 256u);
    EXPECT_EQ(l3->tokens[128000], "<|begin_of_text|>");
    EXPECT_EQ(l3->tokens[128009], "<|eot_id|>");
    EXPECT_EQ(l3->tokens[128255], "<|reserved_special_token_250|>");
    EXPECT_EQ(l3->token_types[128100], kTokenControl);
    EXPECT_EQ(l3->bos_id, 128000);
    EXPECT_EQ(l3->eos_id, 128009);
    EXPECT_EQ(l3->pre, "llama-bpe");
    auto qw = synth_vocab(*synth_preset("qwen2-7b"));
    EXPECT_EQ(qw->merges.size(), 151643u - 256u);
    EXPECT_EQ(qw->tokens[151643], "<|endoftext|>");
    EXPECT_EQ(qw->tokens[151645], "<|im_end|>");
    EXPECT_EQ(qw->token_types[151646], kTokenUnused);
    EXPECT_EQ(qw->token_types[152063], kTokenUnused);
    EXPECT_EQ(qw->eos_id, 151645);
    EXPECT_EQ(qw->pre, "qwen2");
    EXPECT_FALSE(qw->add_bos);
}

// Builds a tiny model and reads it back: metadata, tensor types by the mix,
// and the stored values against synth_fill_rows.
TEST(Synth, WritesAFileTheReaderAccepts) {
    const uint64_t seed = test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    SynthOptions opt;
    opt.shape = *synth_preset("tiny");
    opt.ftype = quant::FileType::Q8_0;
    opt.seed = seed;
    opt.n_threads = 2;
    uint64_t last_done = 0, last_total = 0;
    opt.on_progress = [&](uint64_t done, uint64_t total) { last_done = done; last_total = total; };
    const std::string path = temp_path("synth-tiny");
    auto summary = write_synth_model(path, opt);
    ASSERT_TRUE(summary.ok()) << summary.error().message;
    EXPECT_EQ(summary->n_params, 1705216u);
    EXPECT_EQ(last_done, summary->n_params);
    EXPECT_EQ(last_total, summary->n_params);

    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok()) << file.error().message;
    const gguf::File& f = **file;
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_string("general.name"), "synthetic tiny");
    EXPECT_EQ(f.get_int("general.file_type"), 7);
    EXPECT_EQ(f.get_int("llama.embedding_length"), 256);
    EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 2);
    EXPECT_EQ(f.get_int("llama.rope.dimension_count"), 64);
    EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
    EXPECT_EQ(f.find("tokenizer.ggml.tokens")->items.size(), 1024u);
    ASSERT_EQ(f.tensors().size(), 21u);

    const std::vector<SynthTensor> tensors = synth_tensors(opt.shape);
    for (size_t i = 0; i < tensors.size(); ++i) {
        const gguf::TensorInfo& info = f.tensors()[i];
        const SynthTensor& t = tensors[i];
        ASSERT_EQ(info.name, t.name);
        const TensorType want = t.ne.size() == 1 ? TensorType::F32 : TensorType::Q8_0;
        ASSERT_EQ(info.type(), want) << t.name;
        // Row 0 and the last row decode to the generated values within q8_0's step.
        for (int64_t row : {int64_t(0), t.n_rows() - 1}) {
            std::vector<float> expect(size_t(t.row_length())), got(size_t(t.row_length()));
            synth_fill_rows(seed, t, row, 1, expect.data());
            const size_t rb = quant::row_bytes(info.type(), t.row_length());
            ASSERT_TRUE(quant::dequantize_row(info.type(), info.data + size_t(row) * rb, got.data(),
                                              t.row_length()).ok());
            for (size_t k = 0; k < got.size(); ++k)
                ASSERT_NEAR(got[k], expect[k], want == TensorType::F32 ? 0.0 : 0.0013) << t.name << " " << k;
        }
    }
    std::filesystem::remove(path);
}

TEST(Synth, OutputDoesNotDependOnThreadCountButOnSeed) {
    const uint64_t seed = test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    SynthOptions opt;
    opt.shape = *synth_preset("tiny");
    opt.shape.n_layer = 1;
    opt.ftype = quant::FileType::Q4_K_M;
    opt.seed = seed;
    const std::string a = temp_path("synth-a"), b = temp_path("synth-b"), c = temp_path("synth-c");
    opt.n_threads = 1;
    ASSERT_TRUE(write_synth_model(a, opt).ok());
    opt.n_threads = 3;
    ASSERT_TRUE(write_synth_model(b, opt).ok());
    opt.seed = seed + 1;
    ASSERT_TRUE(write_synth_model(c, opt).ok());
    const std::string da = read_all(a), db = read_all(b), dc = read_all(c);
    EXPECT_EQ(da.size(), dc.size());
    EXPECT_TRUE(da == db);
    EXPECT_FALSE(da == dc);
    for (const std::string& p : {a, b, c}) std::filesystem::remove(p);
}

TEST(Synth, RefusesBadShapesWithoutWritingAFile) {
    SynthOptions opt;
    opt.shape = *synth_preset("tiny");
    opt.shape.n_head_kv = 3;
    const std::string path = temp_path("synth-bad");
    auto r = write_synth_model(path, opt);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("n_head_kv"), std::string::npos);
    EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace tern::model
