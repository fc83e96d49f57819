#include "tests/support/reference_forward.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "quant/quant.h"

namespace tern::ref {

ReferenceForward::ReferenceForward(const gguf::File& file, const model::Hparams& hp, int n_ctx)
    : f_(file), hp_(hp), k_cache_(size_t(hp.n_layer)), v_cache_(size_t(hp.n_layer)), n_ctx_(n_ctx) {}

std::vector<float> ReferenceForward::rows_of(const std::vector<float>& w, size_t cols, size_t r0, size_t r1) {
    return std::vector<float>(w.begin() + int64_t(r0 * cols), w.begin() + int64_t(r1 * cols));
}

std::vector<float> ReferenceForward::weight(const std::string& name) const {
    const gguf::TensorInfo* t = f_.find_tensor(name);
    if (!t) return {};
    std::vector<float> out(size_t(t->n_elements));
    const int64_t row = t->ne[0], rows = t->n_elements / row;
    const size_t rb = quant::row_bytes(t->type(), row);
    for (int64_t r = 0; r < rows; ++r) {
        Status s = quant::dequantize_row(t->type(), t->data + size_t(r) * rb, out.data() + r * row, row);
        if (!s.ok()) throw std::runtime_error(s.message());
    }
    return out;
}

namespace {

void rms_norm_span(float* x, int n, const std::vector<float>& w, float eps) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int i = 0; i < n; ++i) x[i] = float(x[i] * inv) * w[size_t(i)];
}

void rms_norm(std::vector<float>& x, const std::vector<float>& w, float eps) {
    rms_norm_span(x.data(), int(x.size()), w, eps);
}

// y[r] = sum_k W[r][k] x[k], W rows of x.size()
std::vector<float> matvec(const std::vector<float>& W, const std::vector<float>& x) {
    const size_t cols = x.size(), rows = W.size() / cols;
    std::vector<float> y(rows);
    for (size_t r = 0; r < rows; ++r) {
        double acc = 0;
        for (size_t k = 0; k < cols; ++k) acc += double(W[r * cols + k]) * x[k];
        y[r] = float(acc);
    }
    return y;
}

void rope(std::vector<float>& v, int n_heads, int head_dim, int pos, const backend::RopeParams& rp,
          const std::vector<float>& factors) {
    const int half = rp.n_dims / 2;
    for (int h = 0; h < n_heads; ++h)
        for (int i = 0; i < half; ++i) {
            double freq = std::pow(double(rp.freq_base), -2.0 * i / rp.n_dims);
            if (!factors.empty()) freq /= factors[size_t(i)];
            const double a = double(pos) * rp.freq_scale * freq;
            const int ia = h * head_dim + (rp.neox ? i : 2 * i);
            const int ib = h * head_dim + (rp.neox ? i + half : 2 * i + 1);
            const double x0 = v[size_t(ia)], x1 = v[size_t(ib)];
            const double c = std::cos(a) * rp.attn_factor, s = std::sin(a) * rp.attn_factor;
            v[size_t(ia)] = float(x0 * c - x1 * s);
            v[size_t(ib)] = float(x0 * s + x1 * c);
        }
}

}  // namespace

std::vector<std::vector<float>> ReferenceForward::run(const std::vector<int32_t>& tokens) {
    const model::Hparams& h = hp_;
    const int hd = h.head_dim, kvw = h.n_head_kv * hd;
    const auto embd = weight("token_embd.weight");
    auto out_w = weight("output.weight");
    if (out_w.empty()) out_w = embd;
    const auto out_norm = weight("output_norm.weight");
    // llama3's divisors, else LongRoPE's long ones past the original context, else its short ones
    auto factors = weight("rope_freqs.weight");
    if (factors.empty()) factors = weight(n_ctx_ > h.rope_orig_ctx ? "rope_factors_long.weight" : "rope_factors_short.weight");
    std::vector<std::vector<float>> logits;
    std::vector<std::vector<float>> xs;
    for (int32_t tok : tokens) {
        xs.emplace_back(embd.begin() + int64_t(tok) * h.n_embd, embd.begin() + int64_t(tok + 1) * h.n_embd);
        if (h.embd_scale != 0.0f)
            for (float& e : xs.back()) e *= h.embd_scale;
    }

    for (int il = 0; il < h.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        const auto an = weight(p + "attn_norm.weight"), fn = weight(p + "ffn_norm.weight");
        auto wq = weight(p + "attn_q.weight"), wk = weight(p + "attn_k.weight");
        auto wv = weight(p + "attn_v.weight");
        const auto wo = weight(p + "attn_output.weight");
        if (const auto qkv = weight(p + "attn_qkv.weight"); !qkv.empty()) {  // phi3: q, k, v rows in turn
            const size_t e = size_t(h.n_embd), qd = size_t(h.n_head) * hd, kd = size_t(kvw);
            wq = rows_of(qkv, e, 0, qd);
            wk = rows_of(qkv, e, qd, qd + kd);
            wv = rows_of(qkv, e, qd + kd, qd + 2 * kd);
        }
        const auto bq = weight(p + "attn_q.bias"), bk = weight(p + "attn_k.bias"), bv = weight(p + "attn_v.bias");
        const auto qn = weight(p + "attn_q_norm.weight"), kn = weight(p + "attn_k_norm.weight");
        const auto router = weight(p + "ffn_gate_inp.weight");  // a mixture of experts, stacked [expert][row][col]
        const auto eg = weight(p + "ffn_gate_exps.weight"), eu = weight(p + "ffn_up_exps.weight");
        const auto ed = weight(p + "ffn_down_exps.weight");
        auto wg = weight(p + "ffn_gate.weight"), wu = weight(p + "ffn_up.weight");
        if (wg.empty() && router.empty()) {  // phi3: gate rows, then up rows, in ffn_up
            const auto both = wu;
            wg = rows_of(both, size_t(h.n_embd), 0, size_t(h.n_ff));
            wu = rows_of(both, size_t(h.n_embd), size_t(h.n_ff), 2 * size_t(h.n_ff));
        }
        const auto wd = weight(p + "ffn_down.weight");
        const auto pan = weight(p + "post_attention_norm.weight"), pfn = weight(p + "post_ffw_norm.weight");
        // gemma3: sliding-window layers see the last swa_window positions, with their own RoPE
        const bool local = h.slides(il);
        const backend::RopeParams& rp = local ? h.rope_swa : h.rope;
        for (size_t t = 0; t < xs.size(); ++t) {
            const int pos = n_past_ + int(t);
            std::vector<float> hbuf = xs[t];
            rms_norm(hbuf, an, h.norm_eps);
            auto q = matvec(wq, hbuf), k = matvec(wk, hbuf), v = matvec(wv, hbuf);
            for (size_t i = 0; i < bq.size(); ++i) q[i] += bq[i];
            for (size_t i = 0; i < bk.size(); ++i) k[i] += bk[i];
            for (size_t i = 0; i < bv.size(); ++i) v[i] += bv[i];
            if (!qn.empty()) {  // qwen3: each head normalised on its own
                for (int hh = 0; hh < h.n_head; ++hh) rms_norm_span(q.data() + size_t(hh) * hd, hd, qn, h.norm_eps);
                for (int hh = 0; hh < h.n_head_kv; ++hh) rms_norm_span(k.data() + size_t(hh) * hd, hd, kn, h.norm_eps);
            }
            rope(q, h.n_head, hd, pos, rp, local ? std::vector<float>{} : factors);
            rope(k, h.n_head_kv, hd, pos, rp, local ? std::vector<float>{} : factors);
            auto& kc = k_cache_[size_t(il)];
            auto& vc = v_cache_[size_t(il)];
            kc.insert(kc.end(), k.begin(), k.end());
            vc.insert(vc.end(), v.begin(), v.end());
            std::vector<float> att(size_t(h.n_head) * hd, 0.0f);
            const int from = local ? std::max(0, pos - h.swa_window + 1) : 0;
            const int n_pos = pos + 1 - from, group = h.n_head / h.n_head_kv;
            for (int hh = 0; hh < h.n_head; ++hh) {
                const int kvh = hh / group;
                std::vector<double> s(static_cast<size_t>(n_pos));
                double mx = -INFINITY;
                for (int j = 0; j < n_pos; ++j) {
                    double d = 0;
                    for (int i = 0; i < hd; ++i)
                        d += double(q[size_t(hh * hd + i)]) * kc[size_t((from + j) * kvw + kvh * hd + i)];
                    s[size_t(j)] = d * h.attn_scale;
                    mx = std::max(mx, s[size_t(j)]);
                }
                double sum = 0;
                for (double& e : s) sum += (e = std::exp(e - mx));
                for (int j = 0; j < n_pos; ++j)
                    for (int i = 0; i < hd; ++i)
                        att[size_t(hh * hd + i)] +=
                            float(s[size_t(j)] / sum * vc[size_t((from + j) * kvw + kvh * hd + i)]);
            }
            auto o = matvec(wo, att);
            if (!pan.empty()) rms_norm(o, pan, h.norm_eps);
            for (int i = 0; i < h.n_embd; ++i) xs[t][size_t(i)] += o[size_t(i)];
            hbuf = xs[t];
            rms_norm(hbuf, fn, h.norm_eps);
            const bool gelu = h.arch == "gemma3";
            auto ffn = [&](const std::vector<float>& Wg, const std::vector<float>& Wu, const std::vector<float>& Wd) {
                auto g = matvec(Wg, hbuf);
                const auto u = matvec(Wu, hbuf);
                for (size_t i = 0; i < g.size(); ++i) {
                    const double x = g[i];
                    const double act = gelu ? 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
                                            : x / (1.0 + std::exp(-x));
                    g[i] = float(act * u[i]);
                }
                return matvec(Wd, g);
            };
            std::vector<float> d;
            if (router.empty()) {
                d = ffn(wg, wu, wd);
            } else {
                // The k experts of largest router logit (ties: the lower index), weighted by the softmax over them.
                const auto logit = matvec(router, hbuf);
                const int k = h.n_expert_used;
                std::vector<int32_t> chosen;
                if (size_t(il) < forced_.size() && !forced_[size_t(il)].empty()) {
                    chosen.assign(forced_[size_t(il)].begin() + int64_t(t) * k,
                                  forced_[size_t(il)].begin() + int64_t(t + 1) * k);
                } else {
                    std::vector<int32_t> order(logit.size());
                    for (size_t e = 0; e < order.size(); ++e) order[e] = int32_t(e);
                    std::stable_sort(order.begin(), order.end(),
                                     [&](int32_t a, int32_t b) { return logit[size_t(a)] > logit[size_t(b)]; });
                    chosen.assign(order.begin(), order.begin() + k);
                }
                double wsum = 0;
                std::vector<double> w(static_cast<size_t>(k));
                for (int j = 0; j < k; ++j)
                    wsum += (w[size_t(j)] = std::exp(double(logit[size_t(chosen[size_t(j)])]) - logit[size_t(chosen[0])]));
                const size_t e_in = size_t(h.n_embd) * size_t(h.n_ff);  // floats of one expert's matrix
                d.assign(size_t(h.n_embd), 0.0f);
                for (int j = 0; j < k; ++j) {
                    const size_t e = size_t(chosen[size_t(j)]);
                    auto one = [&](const std::vector<float>& all) { return rows_of(all, 1, e * e_in, (e + 1) * e_in); };
                    const auto y = ffn(one(eg), one(eu), one(ed));
                    for (int i = 0; i < h.n_embd; ++i) d[size_t(i)] += float(w[size_t(j)] / wsum * y[size_t(i)]);
                }
            }
            if (!pfn.empty()) rms_norm(d, pfn, h.norm_eps);
            for (int i = 0; i < h.n_embd; ++i) xs[t][size_t(i)] += d[size_t(i)];
        }
    }
    for (auto& x : xs) {
        rms_norm(x, out_norm, h.norm_eps);
        logits.push_back(matvec(out_w, x));
    }
    n_past_ += int(tokens.size());
    forced_.clear();
    return logits;
}

}  // namespace tern::ref
