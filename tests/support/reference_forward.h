// A straightforward f32 forward pass for every family (llama with or without experts, qwen2/3,
// qwen3moe, gemma3, phi3), independent of the
// backend code: every weight dequantized with the reference dequantizer, plain
// loops, full softmax attention over an f32 cache. Slow and obvious on purpose:
// the engine's forward pass is checked against it.
#pragma once

#include <cstdint>
#include <vector>

#include "gguf/gguf.h"
#include "model/model.h"

namespace tern::ref {

class ReferenceForward {
public:
    // hp as read by model::read_hparams; the file must outlive this object.
    // n_ctx: the engine's cache length, which picks LongRoPE's long or short factors.
    ReferenceForward(const gguf::File& file, const model::Hparams& hp, int n_ctx = 0);

    // Appends `tokens` to the single sequence and returns the logits of each (rows of n_vocab).
    std::vector<std::vector<float>> run(const std::vector<int32_t>& tokens);

    // Mixtures of experts: the next run() routes token t of layer il to
    // experts[il][t*k .. t*k + k) instead of the top k of its own router
    // logits (weights still from its own logits). For comparing a quantized
    // engine, whose activations are rounded, where a near tie of two logits
    // could pick another expert than the exact arithmetic does.
    void force_experts(std::vector<std::vector<int32_t>> experts) { forced_ = std::move(experts); }

private:
    std::vector<float> weight(const std::string& name) const;  // dequantized, row-major
    // Rows r0..r1 of a dequantized matrix of `cols` columns.
    static std::vector<float> rows_of(const std::vector<float>& w, size_t cols, size_t r0, size_t r1);
    const gguf::File& f_;
    model::Hparams hp_;
    std::vector<std::vector<float>> k_cache_, v_cache_;  // per layer: [pos][n_kv*head_dim]
    int n_past_ = 0;
    int n_ctx_ = 0;
    std::vector<std::vector<int32_t>> forced_;
};

}  // namespace tern::ref
