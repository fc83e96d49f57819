// The quantization mix (src/quant/mix): per-tensor types of whole models under
// each file type, checked against the tensor-type counts real quantized files
// show (Llama 2 7B Q4_K_M: 65 f32, 193 q4_K, 33 q6_K), the fallback rules for
// row lengths that do not fit a block (SmolLM2's width of 576), and a
// randomized check that every choice can actually store its rows.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "quant/mix.h"
#include "tests/support/test_seed.h"

namespace tern::quant {
namespace {

struct Tensor {
    std::string name;
    std::vector<int64_t> ne;
};

struct Shape {
    std::string arch = "llama";
    int64_t vocab, embd, layers, heads, kv_heads, ff;
    bool tied = false;
};

// The llama tensor layout (as GGUF files name it) for a shape.
std::vector<Tensor> llama_tensors(const Shape& s) {
    const int64_t kv = s.kv_heads * (s.embd / s.heads);
    std::vector<Tensor> t{{"token_embd.weight", {s.embd, s.vocab}}};
    for (int64_t l = 0; l < s.layers; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        t.push_back({p + "attn_norm.weight", {s.embd}});
        t.push_back({p + "attn_q.weight", {s.embd, s.embd}});
        t.push_back({p + "attn_k.weight", {s.embd, kv}});
        t.push_back({p + "attn_v.weight", {s.embd, kv}});
        t.push_back({p + "attn_output.weight", {s.embd, s.embd}});
        t.push_back({p + "ffn_norm.weight", {s.embd}});
        t.push_back({p + "ffn_gate.weight", {s.embd, s.ff}});
        t.push_back({p + "ffn_up.weight", {s.embd, s.ff}});
        t.push_back({p + "ffn_down.weight", {s.ff, s.embd}});
    }
    t.push_back({"output_norm.weight", {s.embd}});
    if (!s.tied) t.push_back({"output.weight", {s.embd, s.vocab}});
    return t;
}

const Shape kLlama2_7B{"llama", 32000, 4096, 32, 32, 32, 11008};
const Shape kLlama3_8B{"llama", 128256, 4096, 32, 32, 8, 14336};
const Shape kSmolLM2_135M{"llama", 49152, 576, 30, 9, 3, 1536, /*tied=*/true};

MixModel mix_for(const Shape& s, FileType f) {
    MixModel m;
    m.ftype = f;
    m.arch = s.arch;
    m.n_layers = int(s.layers);
    m.n_head = int(s.heads);
    m.n_head_kv = int(s.kv_heads);
    m.has_output = !s.tied;
    return m;
}

// name -> chosen type for a whole model whose tensors start as `source`.
std::map<std::string, TensorType> types_of(const Shape& s, FileType f,
                                           TensorType source = TensorType::F32) {
    const MixModel m = mix_for(s, f);
    std::map<std::string, TensorType> out;
    for (const Tensor& t : llama_tensors(s))
        out[t.name] = choose_tensor_type(m, t.name, t.ne.data(), int(t.ne.size()), source);
    return out;
}

std::map<TensorType, int> counts(const std::map<std::string, TensorType>& types) {
    std::map<TensorType, int> c;
    for (const auto& [name, type] : types) ++c[type];
    return c;
}

std::string layer(int i, const char* tensor) { return "blk." + std::to_string(i) + "." + tensor; }

// use_more_bits(i, 32): the first and last four layers and every third in between.
const std::set<int> kMoreBits32 = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};

TEST(Mix, UseMoreBitsPattern) {
    std::set<int> got32, got30;
    for (int i = 0; i < 32; ++i)
        if (use_more_bits(i, 32)) got32.insert(i);
    for (int i = 0; i < 30; ++i)
        if (use_more_bits(i, 30)) got30.insert(i);
    EXPECT_EQ(got32, kMoreBits32);
    EXPECT_EQ(got30, (std::set<int>{0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29}));
}

TEST(Mix, Llama2_7B_Q4_K_M) {
    const auto types = types_of(kLlama2_7B, FileType::Q4_K_M);
    ASSERT_EQ(types.size(), 291u);
    const auto c = counts(types);
    EXPECT_EQ(c.at(TensorType::F32), 65);
    EXPECT_EQ(c.at(TensorType::Q4_K), 193);
    EXPECT_EQ(c.at(TensorType::Q6_K), 33);
    EXPECT_EQ(c.size(), 3u);
    EXPECT_EQ(types.at("output.weight"), TensorType::Q6_K);
    EXPECT_EQ(types.at("token_embd.weight"), TensorType::Q4_K);
    for (int i = 0; i < 32; ++i) {
        const TensorType more = kMoreBits32.count(i) ? TensorType::Q6_K : TensorType::Q4_K;
        EXPECT_EQ(types.at(layer(i, "attn_v.weight")), more) << i;
        EXPECT_EQ(types.at(layer(i, "ffn_down.weight")), more) << i;
        EXPECT_EQ(types.at(layer(i, "attn_q.weight")), TensorType::Q4_K) << i;
        EXPECT_EQ(types.at(layer(i, "attn_norm.weight")), TensorType::F32) << i;
    }
}

TEST(Mix, Llama2_7B_Q5_K_M_And_Q6_K_And_Q8_0) {
    auto c = counts(types_of(kLlama2_7B, FileType::Q5_K_M));
    EXPECT_EQ(c.at(TensorType::Q5_K), 193);
    EXPECT_EQ(c.at(TensorType::Q6_K), 33);
    c = counts(types_of(kLlama2_7B, FileType::Q6_K));
    EXPECT_EQ(c.at(TensorType::Q6_K), 226);
    EXPECT_EQ(c.at(TensorType::F32), 65);
    // q8_0 keeps its own type for the output too.
    c = counts(types_of(kLlama2_7B, FileType::Q8_0));
    EXPECT_EQ(c.at(TensorType::Q8_0), 226);
    EXPECT_EQ(c.size(), 2u);
}

TEST(Mix, Llama2_7B_Q5_K_S_HasOnlyTheOutputRule) {
    const auto types = types_of(kLlama2_7B, FileType::Q5_K_S);
    const auto c = counts(types);
    EXPECT_EQ(c.at(TensorType::Q5_K), 225);
    EXPECT_EQ(c.at(TensorType::Q6_K), 1);
    EXPECT_EQ(types.at("output.weight"), TensorType::Q6_K);
}

TEST(Mix, Llama2_7B_Q4_K_S) {
    const auto types = types_of(kLlama2_7B, FileType::Q4_K_S);
    for (int i = 0; i < 32; ++i) {
        const TensorType early = i < 4 ? TensorType::Q5_K : TensorType::Q4_K;
        EXPECT_EQ(types.at(layer(i, "attn_v.weight")), early) << i;
        EXPECT_EQ(types.at(layer(i, "ffn_down.weight")), early) << i;  // n/8 = 4
    }
    EXPECT_EQ(types.at("output.weight"), TensorType::Q6_K);
}

TEST(Mix, Llama2_7B_Q3_K_Family) {
    auto types = types_of(kLlama2_7B, FileType::Q3_K_M);
    for (int i = 0; i < 32; ++i) {
        const TensorType early = i < 2 ? TensorType::Q5_K : TensorType::Q4_K;
        EXPECT_EQ(types.at(layer(i, "attn_v.weight")), early) << i;
        EXPECT_EQ(types.at(layer(i, "ffn_down.weight")), early) << i;  // n/16 = 2
        EXPECT_EQ(types.at(layer(i, "attn_output.weight")), TensorType::Q4_K) << i;
        EXPECT_EQ(types.at(layer(i, "ffn_up.weight")), TensorType::Q3_K) << i;
    }
    types = types_of(kLlama2_7B, FileType::Q3_K_L);
    EXPECT_EQ(types.at(layer(7, "attn_v.weight")), TensorType::Q5_K);
    EXPECT_EQ(types.at(layer(7, "ffn_down.weight")), TensorType::Q5_K);
    EXPECT_EQ(types.at(layer(7, "attn_output.weight")), TensorType::Q5_K);
    EXPECT_EQ(types.at(layer(7, "attn_q.weight")), TensorType::Q3_K);
    const auto c = counts(types_of(kLlama2_7B, FileType::Q3_K_S));
    EXPECT_EQ(c.at(TensorType::Q3_K), 225);
    EXPECT_EQ(c.at(TensorType::Q6_K), 1);
}

TEST(Mix, Q2_K_DependsOnGroupedQueryRatio) {
    auto types = types_of(kLlama2_7B, FileType::Q2_K);  // 32 / 32 heads
    EXPECT_EQ(types.at(layer(5, "attn_v.weight")), TensorType::Q3_K);
    EXPECT_EQ(types.at(layer(5, "ffn_down.weight")), TensorType::Q3_K);
    EXPECT_EQ(types.at(layer(5, "attn_output.weight")), TensorType::Q3_K);
    EXPECT_EQ(types.at(layer(5, "ffn_gate.weight")), TensorType::Q2_K);
    EXPECT_EQ(types.at("output.weight"), TensorType::Q6_K);
    types = types_of(kLlama3_8B, FileType::Q2_K);  // 32 / 8 heads
    EXPECT_EQ(types.at(layer(5, "attn_v.weight")), TensorType::Q4_K);
}

TEST(Mix, LegacyTypesGetQ6_KOutput) {
    for (FileType f : {FileType::Q4_0, FileType::Q4_1, FileType::Q5_0, FileType::Q5_1}) {
        const auto types = types_of(kLlama2_7B, f);
        const auto c = counts(types);
        EXPECT_EQ(c.at(file_type_base_type(f)), 225);
        EXPECT_EQ(types.at("output.weight"), TensorType::Q6_K);
        EXPECT_EQ(types.at(layer(0, "attn_v.weight")), file_type_base_type(f));
    }
}

TEST(Mix, FloatFileTypesConvertEveryMatrixAndKeepTheRest) {
    for (auto [f, t] : {std::pair{FileType::F16, TensorType::F16}, {FileType::BF16, TensorType::BF16},
                        {FileType::ALL_F32, TensorType::F32}}) {
        const auto types = types_of(kLlama2_7B, f, TensorType::F16);
        EXPECT_EQ(types.at("output.weight"), t);
        EXPECT_EQ(types.at("token_embd.weight"), t);
        EXPECT_EQ(types.at(layer(3, "ffn_down.weight")), t);
        // Norms are not converted: they keep the type they came in.
        EXPECT_EQ(types.at(layer(3, "ffn_norm.weight")), TensorType::F16);
    }
}

// SmolLM2-135M: width 576 is not a multiple of 256, so every K-quant whose rows
// are 576 long falls back (q4_K -> q5_0, q6_K -> q8_0); ffn_down (rows of 1536)
// keeps K-quants; the tied token embedding is the output and gets q8_0.
TEST(Mix, SmolLM2_Q4_K_M_FallsBack) {
    const auto types = types_of(kSmolLM2_135M, FileType::Q4_K_M);
    ASSERT_EQ(types.size(), 272u);
    const auto c = counts(types);
    EXPECT_EQ(c.at(TensorType::F32), 61);
    EXPECT_EQ(c.at(TensorType::Q8_0), 15);   // token_embd + 14 more-bits attn_v
    EXPECT_EQ(c.at(TensorType::Q5_0), 166);  // q, k, o, gate, up of 30 layers + 16 attn_v
    EXPECT_EQ(c.at(TensorType::Q6_K), 14);   // more-bits ffn_down
    EXPECT_EQ(c.at(TensorType::Q4_K), 16);   // other ffn_down
    EXPECT_EQ(types.at("token_embd.weight"), TensorType::Q8_0);
    EXPECT_EQ(types.at(layer(0, "attn_v.weight")), TensorType::Q8_0);
    EXPECT_EQ(types.at(layer(3, "attn_v.weight")), TensorType::Q5_0);
}

TEST(Mix, SmolLM2_OtherTypes) {
    auto types = types_of(kSmolLM2_135M, FileType::Q5_K_M);
    EXPECT_EQ(types.at(layer(3, "attn_q.weight")), TensorType::Q5_1);  // q5_K -> q5_1
    EXPECT_EQ(types.at(layer(3, "ffn_down.weight")), TensorType::Q5_K);
    types = types_of(kSmolLM2_135M, FileType::Q2_K);
    // q2_K / q3_K fall back to q4_0 (tern's stand-in for iq4_nl).
    EXPECT_EQ(types.at(layer(3, "attn_q.weight")), TensorType::Q4_0);
    EXPECT_EQ(types.at(layer(3, "attn_v.weight")), TensorType::Q4_0);  // 9 / 3 heads -> q3_K -> q4_0
    EXPECT_EQ(types.at(layer(3, "ffn_down.weight")), TensorType::Q3_K);
    const auto c = counts(types_of(kSmolLM2_135M, FileType::Q8_0));
    EXPECT_EQ(c.at(TensorType::Q8_0), 211);
}

TEST(Mix, RowsThatFitNoBlockBecomeF16) {
    const Shape odd{"llama", 1000, 100, 2, 2, 2, 96};  // rows of 100 fit no 32-element block
    for (FileType f : {FileType::Q4_0, FileType::Q8_0, FileType::Q6_K, FileType::Q4_K_M, FileType::Q2_K}) {
        const auto types = types_of(odd, f);
        EXPECT_EQ(types.at(layer(0, "attn_q.weight")), TensorType::F16) << int(f);
        EXPECT_EQ(types.at("output.weight"), TensorType::F16) << int(f);  // q6_K -> q8_0 -> f16
        // ffn_down rows are 96 long: a multiple of 32.
        EXPECT_NE(types.at(layer(0, "ffn_down.weight")), TensorType::F16) << int(f);
    }
}

TEST(Mix, SeventyBillionClassGivesAttnVMoreBits) {
    const Shape llama70{"llama", 32000, 8192, 80, 64, 8, 28672};
    auto types = types_of(llama70, FileType::Q4_K_M);
    EXPECT_EQ(types.at(layer(20, "attn_v.weight")), TensorType::Q5_K);  // not a more-bits layer
    EXPECT_EQ(types.at(layer(0, "attn_v.weight")), TensorType::Q6_K);
    EXPECT_EQ(types.at(layer(20, "ffn_down.weight")), TensorType::Q4_K);
    const Shape llama65{"llama", 32000, 8192, 80, 64, 64, 22016};  // no GQA: not the 70B class
    types = types_of(llama65, FileType::Q4_K_M);
    EXPECT_EQ(types.at(layer(20, "attn_v.weight")), TensorType::Q4_K);
}

TEST(Mix, FusedQkvAndFalcon) {
    MixModel m = mix_for(kLlama2_7B, FileType::Q4_K_M);
    const int64_t ne[2] = {4096, 12288};
    EXPECT_EQ(choose_tensor_type(m, "blk.0.attn_qkv.weight", ne, 2, TensorType::F16), TensorType::Q5_K);
    m.ftype = FileType::Q5_K_M;
    EXPECT_EQ(choose_tensor_type(m, "blk.0.attn_qkv.weight", ne, 2, TensorType::F16), TensorType::Q6_K);
    m.ftype = FileType::Q4_K_M;
    m.arch = "falcon";
    const int64_t out_ne[2] = {4096, 65024};
    EXPECT_EQ(choose_tensor_type(m, "output.weight", out_ne, 2, TensorType::F16), TensorType::Q8_0);
}

TEST(Mix, WhatIsQuantizable) {
    EXPECT_TRUE(is_quantizable("token_embd.weight", 2));
    EXPECT_TRUE(is_quantizable("blk.0.ffn_down_exps.weight", 3));
    EXPECT_FALSE(is_quantizable("blk.0.attn_norm.weight", 1));
    EXPECT_FALSE(is_quantizable("blk.0.attn_norm.weight", 2));  // norms stay exact at any rank
    EXPECT_FALSE(is_quantizable("blk.0.attn_q.bias", 2));
    EXPECT_FALSE(is_quantizable("blk.0.attn_q.weight", 1));
    EXPECT_FALSE(is_quantizable("blk.0.ffn_gate_inp.weight", 2));
    EXPECT_FALSE(is_quantizable("rope_freqs", 2));
}

TEST(Mix, LayerIndexFromName) {
    EXPECT_EQ(layer_index_from_name("blk.0.attn_v.weight"), 0);
    EXPECT_EQ(layer_index_from_name("blk.31.ffn_down.weight"), 31);
    EXPECT_EQ(layer_index_from_name("output.weight"), -1);
    EXPECT_EQ(layer_index_from_name("blk.x.attn_v.weight"), -1);
    EXPECT_EQ(layer_index_from_name("blk.7"), -1);
    EXPECT_EQ(layer_index_from_name("blk.-1.attn_v.weight"), -1);
    EXPECT_EQ(layer_index_from_name("blk.99999999999999.a"), -1);  // overflows int
}

TEST(Mix, FileTypeNames) {
    EXPECT_EQ(file_type_from_name("q4_k_m"), FileType::Q4_K_M);
    EXPECT_EQ(file_type_from_name("Q8_0"), FileType::Q8_0);
    EXPECT_EQ(file_type_from_name("f32"), FileType::ALL_F32);
    EXPECT_EQ(file_type_from_name("bf16"), FileType::BF16);
    EXPECT_FALSE(file_type_from_name("IQ2_XS"));  // known, but tern cannot write it
    EXPECT_FALSE(file_type_from_name("q4_k_mm"));
    EXPECT_FALSE(file_type_from_name(""));
    EXPECT_EQ(file_type_name(15), "Q4_K_M");
    EXPECT_EQ(file_type_name(32), "BF16");
    EXPECT_EQ(file_type_name(20), "IQ2_XS");
    EXPECT_FALSE(file_type_name(5));
    EXPECT_FALSE(file_type_name(1000));
    // The enum carries the numbers GGUF files store.
    EXPECT_EQ(uint32_t(FileType::F16), 1u);
    EXPECT_EQ(uint32_t(FileType::Q8_0), 7u);
    EXPECT_EQ(uint32_t(FileType::Q6_K), 18u);
    for (const std::string& name : writable_file_type_names()) {
        auto f = file_type_from_name(name);
        ASSERT_TRUE(f) << name;
        EXPECT_EQ(file_type_name(uint32_t(*f)), name);
    }
}

// Whatever the shape and file type, the chosen type stores the rows whole, a
// quantizable tensor is converted (unless F32 is asked for), and the rest is
// left alone.
TEST(Mix, RandomShapesAlwaysGetAStorableType) {
    const uint64_t seed = tern::test::run_seed() + 1;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const auto names = writable_file_type_names();
    const char* tensor_names[] = {"output.weight", "token_embd.weight", "blk.3.attn_v.weight",
                                  "blk.3.ffn_down.weight", "blk.3.attn_output.weight",
                                  "blk.3.attn_qkv.weight", "blk.3.ffn_up.weight", "blk.3.attn_norm.weight",
                                  "blk.3.attn_q.bias"};
    for (int iter = 0; iter < 5000; ++iter) {
        MixModel m;
        m.ftype = *file_type_from_name(names[rng() % names.size()]);
        m.arch = rng() % 4 ? "llama" : (rng() % 2 ? "qwen2" : "falcon");
        m.n_layers = 4 + int(rng() % 100);
        m.n_head = 1 + int(rng() % 64);
        m.n_head_kv = 1 + int(rng() % m.n_head);
        m.has_output = rng() % 2;
        const int64_t ne[2] = {int64_t(1 + rng() % 3000) * (rng() % 2 ? 32 : 1), int64_t(1 + rng() % 64)};
        const std::string name = tensor_names[rng() % std::size(tensor_names)];
        const int n_dims = rng() % 5 ? 2 : 1;
        const TensorType source = rng() % 2 ? TensorType::F32 : TensorType::F16;
        const TensorType t = choose_tensor_type(m, name, ne, n_dims, source);
        auto info = tensor_type_info(uint32_t(t));
        ASSERT_TRUE(info) << name;
        EXPECT_EQ(ne[0] % int64_t(info->block_elems), 0) << name << " " << tensor_type_name(uint32_t(t));
        if (!is_quantizable(name, n_dims)) {
            EXPECT_EQ(t, source) << name;
        } else if (m.ftype != FileType::ALL_F32) {
            EXPECT_NE(t, TensorType::F32) << name;
        }
    }
}

}  // namespace
}  // namespace tern::quant
