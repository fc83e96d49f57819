#include "model/blocks.h"

namespace tern::model {

using backend::Tensor;

namespace {
// The same memory seen as one row per (token, head).
Tensor per_head(Tensor t, int head_dim) { return Tensor{t.data, t.rows * (t.cols / head_dim), head_dim}; }
}  // namespace

void attention_block(const LayerPass& p, const Layer& L, int il, Tensor in, const backend::RopeParams& rope,
                     int window, Tensor out) {
    const Hparams& h = p.hp;
    p.be.matmul_shared(in, {{&L.wq, p.q, L.bq ? &L.bq : nullptr},
                            {&L.wk, p.k, L.bk ? &L.bk : nullptr},
                            {&L.wv, p.v, L.bv ? &L.bv : nullptr}});
    if (L.q_norm) {  // each head normalised on its own, before RoPE
        p.be.rms_norm(per_head(p.q, h.head_dim), L.q_norm, h.norm_eps, per_head(p.q, h.head_dim));
        p.be.rms_norm(per_head(p.k, h.head_dim), L.k_norm, h.norm_eps, per_head(p.k, h.head_dim));
    }
    p.be.rope(p.q, h.n_head, h.head_dim, rope);
    p.be.rope(p.k, h.n_head_kv, h.head_dim, rope);
    p.be.kv_store(il, p.k, p.v);
    p.be.attention(il, p.q, h.n_head, h.attn_scale, window, p.att);
    p.be.matmul(L.wo, p.att, out);
    if (p.shard) p.be.all_reduce_sum(out);
}

void gated_ffn(const LayerPass& p, const Layer& L, Tensor in, GateActivation act, Tensor out) {
    p.be.matmul_shared(in, {{&L.w_gate, p.gate}, {&L.w_up, p.up}});
    if (act == GateActivation::Silu)
        p.be.swiglu(p.gate, p.up);
    else
        p.be.geglu(p.gate, p.up);
    p.be.matmul(L.w_down, p.gate, out);
    if (p.shard) p.be.all_reduce_sum(out);
}

void moe_ffn(const LayerPass& p, const Layer& L, Tensor in, Tensor out) {
    const int64_t k = p.hp.n_expert_used;
    // Rows (token t, its j-th expert) at t*k + j.
    auto pairs = [&](Tensor t) { return Tensor{t.data, in.rows * k, t.cols}; };
    const Tensor gate = pairs(p.gate), up = pairs(p.up), y = pairs(p.experts_out);
    p.be.matmul(L.ffn_router, in, p.router);
    p.be.route_experts(p.router, int(k));
    p.be.matmul_experts_shared(in, {{&L.gate_exps, gate}, {&L.up_exps, up}});
    p.be.swiglu(gate, up);
    p.be.matmul_experts(L.down_exps, gate, y);
    p.be.combine_experts(y, out);
    if (p.shard) p.be.all_reduce_sum(out);
}

}  // namespace tern::model
