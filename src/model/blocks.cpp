#include "model/blocks.h"

namespace tern::model {

using backend::Tensor;

void attention_block(const LayerPass& p, const Layer& L, int il, Tensor in, const backend::RopeParams& rope,
                     int window, Tensor out) {
    const Hparams& h = p.hp;
    p.be.matmul_shared(in, {{&L.wq, p.q, L.bq ? &L.bq : nullptr},
                            {&L.wk, p.k, L.bk ? &L.bk : nullptr},
                            {&L.wv, p.v, L.bv ? &L.bv : nullptr}});
    p.be.prepare_attention(il,
                           {p.q, p.k, p.v, h.n_head, h.n_head_kv, h.head_dim, L.q_norm ? &L.q_norm : nullptr,
                            L.k_norm ? &L.k_norm : nullptr, h.norm_eps},
                           rope);
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
    p.be.matmul_experts_swiglu(in, L.gate_exps, L.up_exps, gate, up);
    p.be.matmul_experts_combine(L.down_exps, gate, y, out);
    if (p.shard) p.be.all_reduce_sum(out);
}

}  // namespace tern::model
