#include "model/blocks.h"

namespace tern::model {

using backend::Tensor;

namespace {

// A block's last product, made by `product(into)`, left in out as `how`
// says: added with the backend's joined call (`product_add(scratch)`) where
// nothing must come between, else written to scratch, summed over the
// shards where the layer is one, and added.
template <class Product, class ProductAdd>
void finish_block(const LayerPass& p, Tensor scratch, Tensor out, BlockOut how, Product product,
                  ProductAdd product_add) {
    if (how == BlockOut::Write) {
        product(out);
        if (p.shard) p.be.all_reduce_sum(out);
    } else if (p.shard) {
        product(scratch);
        p.be.all_reduce_sum(scratch);
        p.be.add(out, scratch);
    } else {
        product_add(scratch);
    }
}

}  // namespace

void attention_block(const LayerPass& p, const Layer& L, int il, Tensor in, const backend::RopeParams& rope,
                     int window, Tensor out, BlockOut how) {
    const Hparams& h = p.hp;
    p.be.matmul_shared(in, {{&L.wq, p.q, L.bq ? &L.bq : nullptr},
                            {&L.wk, p.k, L.bk ? &L.bk : nullptr},
                            {&L.wv, p.v, L.bv ? &L.bv : nullptr}});
    p.be.prepare_attention(il,
                           {p.q, p.k, p.v, h.n_head, h.n_head_kv, h.head_dim, L.q_norm ? &L.q_norm : nullptr,
                            L.k_norm ? &L.k_norm : nullptr, h.norm_eps},
                           rope);
    p.be.attention(il, p.q, h.n_head, h.attn_scale, window, p.att);
    finish_block(
        p, in, out, how, [&](Tensor y) { p.be.matmul(L.wo, p.att, y); },
        [&](Tensor scratch) { p.be.matmul_add(L.wo, p.att, out, scratch); });
}

void gated_ffn(const LayerPass& p, const Layer& L, Tensor in, GateActivation act, Tensor out, BlockOut how) {
    p.be.matmul_shared(in, {{&L.w_gate, p.gate}, {&L.w_up, p.up}});
    if (act == GateActivation::Silu)
        p.be.swiglu(p.gate, p.up);
    else
        p.be.geglu(p.gate, p.up);
    finish_block(
        p, in, out, how, [&](Tensor y) { p.be.matmul(L.w_down, p.gate, y); },
        [&](Tensor scratch) { p.be.matmul_add(L.w_down, p.gate, out, scratch); });
}

void moe_ffn(const LayerPass& p, const Layer& L, Tensor in, Tensor out, BlockOut how) {
    const int64_t k = p.hp.n_expert_used;
    // Rows (token t, its j-th expert) at t*k + j.
    auto pairs = [&](Tensor t) { return Tensor{t.data, in.rows * k, t.cols}; };
    const Tensor gate = pairs(p.gate), up = pairs(p.up), y = pairs(p.experts_out);
    p.be.matmul(L.ffn_router, in, p.router);
    p.be.route_experts(p.router, int(k));
    p.be.matmul_experts_swiglu(in, L.gate_exps, L.up_exps, gate, up);
    finish_block(
        p, in, out, how, [&](Tensor o) { p.be.matmul_experts_combine(L.down_exps, gate, y, o); },
        [&](Tensor scratch) { p.be.matmul_experts_combine_add(L.down_exps, gate, y, out, scratch); });
}

}  // namespace tern::model
