// The forward pass (see forward.h): embedding, each layer as its family
// builds it (model/family.h), the output head.
#include "model/forward.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "model/family.h"

namespace tern::model {

using backend::Tensor;

backend::KvCacheShape Forward::kv_shape(const Model& model, int n_slots, int n_ctx, int kv_pages) {
    backend::KvCacheShape s;
    s.n_layers = model.hp.n_layer;
    s.n_slots = n_slots;
    s.n_ctx = n_ctx;
    s.n_kv_heads = model.hp.n_head_kv;
    s.head_dim = model.hp.head_dim;
    s.n_heads = model.hp.n_head;
    s.n_pages = kv_pages;
    return s;
}

namespace {

// The pool kKvPagesFit asks for: 0 (every slot's whole context) when free
// memory holds it or is unknown (0), else the pages that fit, -1 when they do
// not make one whole context.
int fitting_kv_pages(const backend::KvCacheShape& full, size_t free_bytes) {
    if (free_bytes == 0) return 0;
    const size_t room = free_bytes > kKvReserveBytes ? free_bytes - kKvReserveBytes : 0;
    if (full.bytes() <= room) return 0;
    const size_t pages = room / full.page_bytes();
    return pages < size_t(full.pages_per_slot()) ? -1 : int(pages);
}

}  // namespace

int64_t Forward::logits_rows(int64_t n_vocab, int64_t max_tokens) {
    const int64_t fit = int64_t(kLogitsBytes / (size_t(std::max<int64_t>(n_vocab, 1)) * sizeof(float)));
    return std::min(max_tokens, std::max(kLogitsMinRows, fit));
}

Result<std::unique_ptr<Forward>> Forward::create(const Model& model, backend::Backend& be, int max_tokens,
                                                 int n_slots, int n_ctx, int kv_pages) {
    if (max_tokens < 1) return Error{"forward: max_tokens must be at least 1"};
    if (n_slots < 1 || n_ctx < 1) return Error{"forward: the KV cache needs at least one slot and one position"};
    if (kv_pages < 0 && kv_pages != kKvPagesFit)
        return Error{"forward: the KV pool cannot have a negative number of pages"};
    const Family* family = find_family(model.hp.arch);
    if (!family) return Error{"forward: unsupported architecture '" + model.hp.arch + "'"};
    std::unique_ptr<Forward> f(new Forward(model, be, *family, max_tokens));
    const Hparams& h = model.hp;
    const int64_t n = max_tokens;
    f->logits_rows_ = logits_rows(model.output.rows, n);
    // A mixture of experts has n_expert_used FFN rows per token.
    const int64_t ff_rows = n * std::max(1, h.n_expert_used);
    struct Want { Tensor* t; int64_t rows, cols; };
    std::vector<Want> wants = {
        {&f->x_, n, h.n_embd},   {&f->h_, n, h.n_embd},
        {&f->q_, n, int64_t(h.n_head) * h.head_dim},
        {&f->k_, n, int64_t(h.n_head_kv) * h.head_dim},
        {&f->v_, n, int64_t(h.n_head_kv) * h.head_dim},
        {&f->att_, n, int64_t(h.n_head) * h.head_dim},
        {&f->gate_, ff_rows, h.n_ff},  {&f->up_, ff_rows, h.n_ff},
        {&f->sel_, f->logits_rows_, h.n_embd}, {&f->logits_, f->logits_rows_, model.output.rows},
    };
    if (h.n_expert > 0) {
        wants.push_back({&f->router_, n, h.n_expert});
        wants.push_back({&f->experts_out_, ff_rows, h.n_embd});
    }
    for (const Want& w : wants) {
        auto t = be.alloc(w.rows, w.cols);
        if (!t.ok()) return Error{"forward workspace: " + t.error().message};
        *w.t = *t;
    }
    // After the workspace, so a backend can size per-token scratch from it.
    if (kv_pages > 0) {
        const backend::KvCacheShape full = kv_shape(model, n_slots, n_ctx);
        if (kv_pages < full.pages_per_slot())
            return Error{"forward: a KV pool of " + std::to_string(int64_t(kv_pages) * full.page_size) +
                         " positions cannot hold one sequence of " + std::to_string(n_ctx)};
        if (kv_pages >= full.pool_pages()) kv_pages = 0;  // every slot's whole context: the same memory
    }
    if (kv_pages == kKvPagesFit) kv_pages = fitting_kv_pages(kv_shape(model, n_slots, n_ctx), be.free_device_bytes());
    if (kv_pages < 0) {
        const backend::KvCacheShape one = kv_shape(model, 1, n_ctx);
        return Error{"forward: the KV cache of one sequence of " + std::to_string(n_ctx) + " positions needs " +
                     std::to_string((one.bytes() + (1 << 20) - 1) >> 20) + " MiB, more than the " +
                     std::to_string(be.free_device_bytes() >> 20) + " MiB free on the device (keeping " +
                     std::to_string(kKvReserveBytes >> 20) + " MiB); use a shorter context"};
    }
    f->kv_ = kv_shape(model, n_slots, n_ctx, kv_pages);
    if (Status s = be.init_kv_cache(f->kv_); !s.ok()) return Error{s.message()};
    f->mapped_pages_.assign(size_t(n_slots), kv_pages == 0 ? f->kv_.pages_per_slot() : 0);
    return f;
}

Status Forward::map_kv_pages(int slot, const std::vector<int32_t>& pages) {
    if (Status s = be_.map_kv_pages(slot, pages); !s.ok()) return Error{"forward: " + s.message()};
    mapped_pages_[size_t(slot)] = int(pages.size());
    return {};
}

Status Forward::run(const Batch& batch, Logits& logits, Picks* picks) {
    const auto t_start = std::chrono::steady_clock::now();
    auto since_start = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count(); };
    const Hparams& h = m_.hp;
    const int64_t n = int64_t(batch.size());
    if (n == 0) return Error{"forward: empty batch"};
    if (n > max_tokens_)
        return Error{"forward: batch of " + std::to_string(n) + " tokens exceeds the workspace of " +
                     std::to_string(max_tokens_)};
    if (batch.pos.size() != batch.tokens.size() || batch.slot.size() != batch.tokens.size())
        return Error{"forward: batch arrays differ in length"};
    for (int32_t t : batch.tokens)
        if (t < 0 || t >= h.n_vocab) return Error{"forward: token id " + std::to_string(t) + " is outside the vocabulary"};
    for (size_t i = 0; i < batch.size(); ++i) {
        if (batch.slot[i] < 0 || batch.slot[i] >= kv_.n_slots)
            return Error{"forward: KV slot " + std::to_string(batch.slot[i]) + " does not exist"};
        if (batch.pos[i] < 0 || batch.pos[i] >= kv_.n_ctx)
            return Error{"forward: position " + std::to_string(batch.pos[i]) + " is outside the context of " +
                         std::to_string(kv_.n_ctx)};
        if (batch.pos[i] / kv_.page_size >= mapped_pages_[size_t(batch.slot[i])])
            return Error{"forward: position " + std::to_string(batch.pos[i]) + " of KV slot " +
                         std::to_string(batch.slot[i]) + " has no KV page mapped"};
    }
    for (int32_t i : batch.logits_for)
        if (i < 0 || i >= n) return Error{"forward: logits row " + std::to_string(i) + " is outside the batch"};
    if (picks && batch.pick_only.size() != batch.logits_for.size())
        return Error{"forward: the batch's pick flags differ in length from its logits rows"};

    auto rows = [n](Tensor t) { t.rows = n; return t; };
    backend::RopeParams rope = h.rope;
    rope.freq_factors = rope_factors(m_, kv_.n_ctx);
    const LayerPass pass{be_, h, rope, shard_, rows(x_), rows(h_), rows(q_), rows(k_), rows(v_),
                         rows(att_), rows(gate_), rows(up_), rows(router_), experts_out_};
    const Tensor x = pass.x;

    // Before set_batch, which may begin a CUDA graph's capture: growing a
    // page-locked buffer is no call to make while a stream is captured.
    const int64_t m = int64_t(batch.logits_for.size());
    logits.resize(size_t(m) * size_t(m_.output.rows));  // every value written below: no clearing
    // A step the backend captures as a graph runs the head on a row per
    // token, the wanted rows first and the last of them repeated, so that one
    // graph serves a token count whatever number of its tokens want logits
    // (a step that wants none has a graph of its own). A row's logits do not
    // depend on the rows beside it.
    const int64_t head_rows = m > 0 && m <= n && n <= be_.graph_tokens() && n <= logits_rows_ ? n : m;
    be_.set_batch(backend::BatchLayout{batch.slot, batch.pos, int(head_rows)});
    // x = embedding rows of the tokens (scaled, for the families that do)
    be_.embed(m_.token_embd, batch.tokens, x);
    if (h.embd_scale != 0.0f) be_.scale(x, h.embd_scale);
    for (int il = 0; il < h.n_layer; ++il) family_->forward_layer(pass, m_.layers[size_t(il)], il);
    // logits for the selected tokens: W_out · n(x)
    if (m == 0) {
        issue_seconds_ = since_start();  // the run's one wait follows
        be_.synchronize();
        return be_.take_error();
    }
    // The head in pieces of logits_rows_ rows: a row's logits do not depend
    // on the rows beside it, so the pieces give the bits of one call. A piece
    // is copied back unless every row of it wants only its pick.
    if (picks) picks->assign(size_t(m), -1);
    std::vector<int32_t> piece;
    for (int64_t r0 = 0; r0 < m; r0 += logits_rows_) {
        const int64_t r = std::min(logits_rows_, m - r0);
        piece.assign(batch.logits_for.begin() + r0, batch.logits_for.begin() + r0 + r);
        if (head_rows > m) piece.resize(size_t(head_rows), piece.back());  // one piece: m <= n <= logits_rows_
        Tensor sel = sel_, out = logits_;
        sel.rows = int64_t(piece.size());
        out.rows = sel.rows;
        be_.gather_rows(x, piece, sel);
        be_.rms_norm(sel, m_.output_norm, h.norm_eps, sel);
        be_.matmul(m_.output, sel, out);
        out.rows = r;  // the wanted rows
        bool any_pick = false, any_row = !picks;
        for (int64_t j = r0; picks && j < r0 + r; ++j) (batch.pick_only[size_t(j)] ? any_pick : any_row) = true;
        // Every row wants its pick or its logits, so the first piece waits: the issue time ends there.
        if (r0 == 0) issue_seconds_ = since_start();
        if (any_pick) be_.argmax_rows(out, picks->data() + r0);
        if (any_row) be_.download(out, logits.data() + size_t(r0) * size_t(m_.output.rows));
    }
    return be_.take_error();
}

}  // namespace tern::model
