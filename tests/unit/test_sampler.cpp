// runtime/sampler: greedy and truncation sets checked exactly on hand-made
// distributions, penalties checked value by value, determinism per seed, and
// chi-square tests that the draws follow the distribution they claim.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backend/cpu/ops.h"
#include "runtime/sampler.h"
#include "tests/support/test_seed.h"

namespace {

using tern::runtime::apply_penalties;
using tern::runtime::Sampler;
using tern::runtime::SamplerParams;
using tern::runtime::TokenProb;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A fresh seed per test run, printed with any failure in the scope.
struct FreshSeed {
    uint64_t value;
    FreshSeed() {
        value = tern::test::run_seed();
    }
};
#define TRACE_SEED(s) SCOPED_TRACE("seed " + std::to_string((s).value))

SamplerParams plain(float temperature) {
    SamplerParams p;
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    return p;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
    double m = -std::numeric_limits<double>::infinity();
    for (float l : logits) m = std::max(m, double(l));
    std::vector<double> p(logits.size());
    double total = 0;
    for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp((logits[i] - m) / temperature);
    for (double& x : p) x /= total;
    return p;
}

std::vector<float> random_logits(std::mt19937_64& rng, size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

int first_argmax(const std::vector<float>& v) {
    return int(std::max_element(v.begin(), v.end()) - v.begin());  // first of equal maxima
}

std::set<int32_t> ids_of(const std::vector<TokenProb>& d) {
    std::set<int32_t> s;
    for (const TokenProb& t : d) s.insert(t.id);
    return s;
}

// Pearson's statistic of observed counts against expected probabilities.
double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
    double chi = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
        const double e = probs[i] * n;
        chi += (counts[i] - e) * (counts[i] - e) / e;
    }
    return chi;
}
// Upper-tail critical values of the chi-square distribution at probability
// 1e-7 (from the regularized incomplete gamma function): a correct sampler
// fails one of these tests about once in ten million runs.
constexpr double kChi2Df2 = 32.236;
constexpr double kChi2Df7 = 45.700;

// ---------------------------------------------------------------- validate

TEST(SamplerParams, DefaultsAreValid) { EXPECT_TRUE(SamplerParams{}.validate().ok()); }

TEST(SamplerParams, RejectsEachAbsurdFieldByName) {
    struct Case {
        const char* field;
        void (*mutate)(SamplerParams&);
    };
    const Case cases[] = {
        {"temperature", [](SamplerParams& p) { p.temperature = -0.1f; }},
        {"temperature", [](SamplerParams& p) { p.temperature = 100.5f; }},
        {"temperature", [](SamplerParams& p) { p.temperature = kNaN; }},
        {"temperature", [](SamplerParams& p) { p.temperature = kInf; }},
        {"top_k", [](SamplerParams& p) { p.top_k = -1; }},
        {"top_p", [](SamplerParams& p) { p.top_p = 0.0f; }},
        {"top_p", [](SamplerParams& p) { p.top_p = 1.01f; }},
        {"top_p", [](SamplerParams& p) { p.top_p = kNaN; }},
        {"min_p", [](SamplerParams& p) { p.min_p = -0.01f; }},
        {"min_p", [](SamplerParams& p) { p.min_p = 1.5f; }},
        {"min_p", [](SamplerParams& p) { p.min_p = kNaN; }},
        {"repeat_penalty", [](SamplerParams& p) { p.repeat_penalty = 0.0f; }},
        {"repeat_penalty", [](SamplerParams& p) { p.repeat_penalty = -1.0f; }},
        {"repeat_penalty", [](SamplerParams& p) { p.repeat_penalty = 101.0f; }},
        {"repeat_penalty", [](SamplerParams& p) { p.repeat_penalty = kInf; }},
        {"repeat_last_n", [](SamplerParams& p) { p.repeat_last_n = -1; }},
        {"presence_penalty", [](SamplerParams& p) { p.presence_penalty = 2.5f; }},
        {"presence_penalty", [](SamplerParams& p) { p.presence_penalty = -kInf; }},
        {"frequency_penalty", [](SamplerParams& p) { p.frequency_penalty = -2.01f; }},
        {"frequency_penalty", [](SamplerParams& p) { p.frequency_penalty = kNaN; }},
    };
    for (const Case& c : cases) {
        SamplerParams p;
        c.mutate(p);
        const tern::Status s = p.validate();
        ASSERT_FALSE(s.ok()) << c.field;
        EXPECT_NE(s.message().find(c.field), std::string::npos) << s.message();
        EXPECT_FALSE(Sampler::create(p, 10).ok()) << c.field;
    }
    // The edges of each range are accepted.
    SamplerParams edge;
    edge.temperature = 100.0f;
    edge.top_p = 1.0f;
    edge.min_p = 1.0f;
    edge.repeat_penalty = 100.0f;
    edge.presence_penalty = -2.0f;
    edge.frequency_penalty = 2.0f;
    edge.repeat_last_n = 0;
    EXPECT_TRUE(edge.validate().ok()) << edge.validate().message();
    EXPECT_FALSE(Sampler::create(SamplerParams{}, 0).ok());
}

// ---------------------------------------------------------------- greedy

TEST(Sampler, GreedyIsArgmaxWithTiesToLowestId) {
    FreshSeed seed;
    TRACE_SEED(seed);
    std::mt19937_64 rng(seed.value);
    Sampler s(plain(0.0f), 1000);
    for (int iter = 0; iter < 50; ++iter) {
        std::vector<float> l = random_logits(rng, 1000, -10, 10);
        EXPECT_EQ(s.sample(l.data()), first_argmax(l));
    }
    std::vector<float> tie(10, 0.0f);
    tie[7] = 3.0f;
    tie[4] = 3.0f;
    Sampler small(plain(0.0f), 10);
    EXPECT_EQ(small.sample(tie.data()), 4);
}

// Greedy without penalties takes one pass over the logits as they are; with
// penalties (none of which moves anything here: the penalised token's logit
// is 0) it takes the general path. Both pick the same token, NaN, infinities
// and ties included.
TEST(Sampler, GreedyFastPathPicksWhatTheGeneralPathPicks) {
    // A greedy sampler on the general path: a penalty on `token`, whose logit
    // the rows set to 0, changes nothing there.
    auto general_path = [](int n, int32_t token) {
        SamplerParams p = plain(0.0f);
        p.repeat_penalty = 1.5f;
        Sampler s(p, n);
        s.accept(token);
        return s;
    };
    FreshSeed seed;
    TRACE_SEED(seed);
    std::mt19937_64 rng(seed.value);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int iter = 0; iter < 300; ++iter) {
        const int n = 1 + int(rng() % 300);
        std::vector<float> l(static_cast<size_t>(n));
        for (float& x : l) {
            const float r = u(rng);
            x = r < 0.05f ? kNaN : r < 0.08f ? -kInf : r < (iter % 3 == 0 ? 0.1f : 0.08f) ? kInf
                                                                                          : std::round(u(rng) * 8.0f);
        }
        const int32_t zero = int32_t(rng() % uint64_t(n));
        l[size_t(zero)] = 0.0f;
        Sampler fast(plain(0.0f), n);
        Sampler general = general_path(n, zero);
        ASSERT_EQ(fast.sample(l.data()), general.sample(l.data())) << "row of " << n;
        const auto a = fast.distribution(l.data()), b = general.distribution(l.data());
        ASSERT_EQ(a.size(), 1u);
        ASSERT_EQ(a[0].id, b[0].id);
    }
    // Rows with nothing to draw: both give token 0.
    for (const std::vector<float>& row : {std::vector<float>(7, kNaN), std::vector<float>(7, -kInf),
                                          std::vector<float>{kNaN, -kInf, kNaN, -kInf, kNaN, -kInf, kNaN}}) {
        Sampler fast(plain(0.0f), 7);
        Sampler general = general_path(7, 3);
        EXPECT_EQ(fast.sample(row.data()), 0);
        EXPECT_EQ(general.sample(row.data()), 0);
    }
}

// draws_argmax says when a backend's greedy pick can stand in for the row:
// exactly when sample() gives argmax_first of the row (0 where it is -1).
TEST(Sampler, DrawsArgmaxExactlyWhenSampleIsTheRowsFirstLargest) {
    FreshSeed seed;
    TRACE_SEED(seed);
    std::mt19937_64 rng(seed.value);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    SamplerParams penalised = plain(0.0f);
    penalised.presence_penalty = 0.5f;
    SamplerParams no_window = penalised;
    no_window.repeat_last_n = 0;
    struct Case {
        SamplerParams params;
        bool accepts;  // a token accepted into the history first
        bool want;
    };
    const Case cases[] = {{plain(0.0f), true, true},   {plain(0.7f), false, false},   {penalised, false, true},
                          {penalised, true, false},    {no_window, true, true}};
    for (const Case& c : cases) {
        const int n = 1 + int(rng() % 300);
        Sampler s(c.params, n);
        if (c.accepts) s.accept(int32_t(rng() % uint64_t(n)));
        ASSERT_EQ(s.draws_argmax(), c.want) << "temperature " << c.params.temperature << ", presence "
                                            << c.params.presence_penalty << ", accepted " << c.accepts;
        if (!c.want) continue;
        for (int iter = 0; iter < 50; ++iter) {
            std::vector<float> l(static_cast<size_t>(n));
            for (float& x : l) {
                const float r = u(rng);
                x = r < 0.05f ? kNaN : r < 0.1f ? -kInf : r < 0.11f ? kInf : std::round(u(rng) * 8.0f);
            }
            if (iter % 10 == 0) std::fill(l.begin(), l.end(), iter % 20 ? kNaN : -kInf);
            const int64_t pick = tern::backend::cpu::argmax_first(l.data(), n);
            ASSERT_EQ(s.sample(l.data()), pick >= 0 ? int32_t(pick) : 0) << "row of " << n;
        }
    }
}

TEST(Sampler, TopKOneIsGreedyAtAnyTemperature) {
    FreshSeed seed;
    TRACE_SEED(seed);
    std::mt19937_64 rng(seed.value);
    std::uniform_real_distribution<float> temp(0.05f, 100.0f);
    for (int iter = 0; iter < 100; ++iter) {
        SamplerParams p = plain(temp(rng));
        p.top_k = 1;
        p.seed = rng();
        Sampler s(p, 300);
        std::vector<float> l = random_logits(rng, 300, -3, 3);
        if (iter % 2) l[size_t(rng() % 300)] = l[size_t(first_argmax(l))];  // a tied maximum
        EXPECT_EQ(s.sample(l.data()), first_argmax(l)) << "temperature " << p.temperature;
    }
}

// ---------------------------------------------------------------- determinism

std::vector<int32_t> run_sequence(uint64_t seed, const std::vector<std::vector<float>>& rows) {
    SamplerParams p;  // defaults: top-k, top-p, min-p all active
    p.temperature = 1.3f;
    p.top_k = 100;
    p.repeat_penalty = 1.3f;
    p.frequency_penalty = 0.2f;
    p.presence_penalty = 0.1f;
    p.seed = seed;
    Sampler s(p, int(rows[0].size()));
    std::vector<int32_t> out;
    for (const auto& row : rows) {
        out.push_back(s.sample(row.data()));
        s.accept(out.back());
    }
    return out;
}

TEST(Sampler, SameSeedSameTokensDifferentSeedsDiffer) {
    FreshSeed seed;
    TRACE_SEED(seed);
    std::mt19937_64 rng(seed.value);
    std::vector<std::vector<float>> rows;
    for (int i = 0; i < 64; ++i) rows.push_back(random_logits(rng, 2000, -1, 1));
    const uint64_t a = rng(), b = a ^ 0x9e3779b97f4a7c15ull;
    const auto first = run_sequence(a, rows);
    EXPECT_EQ(first, run_sequence(a, rows));
    // Near-flat logits: two independent 64-token runs agree with odds far
    // below 1e-30.
    EXPECT_NE(first, run_sequence(b, rows));
}

TEST(Sampler, ResetRestartsTheSequence) {
    FreshSeed seed;
    TRACE_SEED(seed);
    std::mt19937_64 rng(seed.value);
    std::vector<float> l = random_logits(rng, 500, -1, 1);
    SamplerParams p = plain(1.0f);
    p.seed = rng();
    p.repeat_penalty = 1.5f;
    Sampler s(p, 500);
    std::vector<int32_t> a, b;
    for (int i = 0; i < 32; ++i) s.accept(a.emplace_back(s.sample(l.data())));
    s.reset();
    for (int i = 0; i < 32; ++i) s.accept(b.emplace_back(s.sample(l.data())));
    EXPECT_EQ(a, b);
}

// ---------------------------------------------------------------- statistics

TEST(Sampler, DrawFrequenciesMatchSoftmaxAtTemperature) {
    FreshSeed seed;
    TRACE_SEED(seed);
    std::mt19937_64 rng(seed.value);
    const std::vector<float> l = random_logits(rng, 8, -2, 2);
    const float temperature = std::uniform_real_distribution<float>(0.5f, 2.0f)(rng);
    SamplerParams p = plain(temperature);
    p.seed = rng();
    Sampler s(p, 8);
    const int n = 200000;
    std::vector<int> counts(8, 0);
    for (int i = 0; i < n; ++i) counts[size_t(s.sample(l.data()))]++;
    EXPECT_LT(chi_square(counts, softmax(l, temperature), n), kChi2Df7) << "T " << temperature;

    // The statistic can fail: the same counts against a wrong temperature.
    const std::vector<float> ramp = {0, 0.5f, 1, 1.5f, 2, 2.5f, 3, 3.5f};
    SamplerParams q = plain(2.0f);
    q.seed = rng();
    Sampler hot(q, 8);
    std::fill(counts.begin(), counts.end(), 0);
    for (int i = 0; i < n; ++i) counts[size_t(hot.sample(ramp.data()))]++;
    EXPECT_LT(chi_square(counts, softmax(ramp, 2.0), n), kChi2Df7);
    EXPECT_GT(chi_square(counts, softmax(ramp, 1.0), n), 100 * kChi2Df7);
}

TEST(Sampler, TopKDrawsFollowTheRenormalizedTopK) {
    FreshSeed seed;
    TRACE_SEED(seed);
    std::mt19937_64 rng(seed.value);
    std::vector<float> l = random_logits(rng, 50, -2, 2);
    SamplerParams p = plain(1.5f);
    p.top_k = 3;
    p.seed = rng();
    Sampler s(p, 50);
    std::vector<int> order(50);
    std::iota(order.begin(), order.end(), 0);
    // The sampler's order: equal logits go to the lower id (random floats tie now and then).
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b); });
    std::vector<float> top = {l[size_t(order[0])], l[size_t(order[1])], l[size_t(order[2])]};
    const int n = 150000;
    std::vector<int> counts(3, 0);
    for (int i = 0; i < n; ++i) {
        const int32_t t = s.sample(l.data());
        const auto at = std::find(order.begin(), order.begin() + 3, t);
        ASSERT_NE(at, order.begin() + 3) << "drew " << t << " outside the top 3";
        counts[size_t(at - order.begin())]++;
    }
    EXPECT_LT(chi_square(counts, softmax(top, 1.5), n), kChi2Df2);
}

TEST(Sampler, DrawsFollowTheReportedDistributionWithAllFiltersOn) {
    FreshSeed seed;
    TRACE_SEED(seed);
    std::mt19937_64 rng(seed.value);
    SamplerParams p;
    p.temperature = 0.9f;
    p.top_k = 20;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.repeat_penalty = 1.2f;
    p.seed = rng();
    Sampler s(p, 400);
    s.accept(3);
    s.accept(17);
    std::vector<float> l = random_logits(rng, 400, -4, 4);
    const std::vector<TokenProb> dist = s.distribution(l.data());
    ASSERT_GE(dist.size(), 2u);
    ASSERT_LE(dist.size(), 20u);
    std::vector<double> probs;
    double sum = 0;
    for (const TokenProb& t : dist) sum += probs.emplace_back(t.p);
    EXPECT_NEAR(sum, 1.0, 1e-6);
    // One bin per token of at least 1%; the rest pooled into one bin, or
    // into the last large bin while the pool is under 1%, so that every
    // expected count is at least 2000 and the chi-square law holds.
    const int n = 200000;
    std::vector<int> bin_of(400, -1);
    std::vector<double> bin_p;
    double pooled = 0;
    for (const TokenProb& t : dist) pooled += t.p < 0.01 ? t.p : 0.0;
    for (const TokenProb& t : dist) {
        if (t.p >= 0.01) {
            bin_of[size_t(t.id)] = int(bin_p.size());
            bin_p.push_back(t.p);
        }
    }
    ASSERT_FALSE(bin_p.empty());
    const int pool_bin = pooled >= 0.01 ? int(bin_p.size()) : int(bin_p.size()) - 1;
    if (pooled >= 0.01) bin_p.push_back(0);
    for (const TokenProb& t : dist) {
        if (t.p < 0.01) {
            bin_of[size_t(t.id)] = pool_bin;
            bin_p[size_t(pool_bin)] += t.p;
        }
    }
    std::vector<int> counts(bin_p.size(), 0);
    for (int i = 0; i < n; ++i) {
        const int32_t t = s.sample(l.data());
        ASSERT_GE(bin_of[size_t(t)], 0) << "drew " << t << " outside the distribution";
        counts[size_t(bin_of[size_t(t)])]++;
    }
    // Critical values at 1e-7 for the degrees of freedom that can occur.
    const double crit[] = {0,     28.37, 32.24, 35.41, 38.24, 40.86, 43.34, 45.70, 47.97, 50.17,
                           52.31, 54.39, 56.43, 58.43, 60.40, 62.33, 64.23, 66.10, 67.95, 69.78};
    ASSERT_LT(bin_p.size() - 1, std::size(crit));
    EXPECT_LT(chi_square(counts, bin_p, n), crit[bin_p.size() - 1]);
}

// ---------------------------------------------------------------- truncation sets

// Probabilities 0.4, 0.25, 0.15, 0.1, 0.05, 0.05 on shuffled ids: the
// cumulative sums in descending order are 0.4, 0.65, 0.8, 0.9, 0.95, 1.
// The two 0.05 entries tie; ties go to the lower id first.
const std::vector<int32_t> kIdsByRank = {3, 0, 5, 1, 2, 4};
const std::vector<double> kProbByRank = {0.4, 0.25, 0.15, 0.1, 0.05, 0.05};

std::vector<float> hand_logits() {
    std::vector<float> l(6);
    for (size_t r = 0; r < 6; ++r) l[size_t(kIdsByRank[r])] = float(std::log(kProbByRank[r]));
    return l;
}

std::set<int32_t> top_ranks(size_t n) { return {kIdsByRank.begin(), kIdsByRank.begin() + n}; }

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
    const std::vector<float> l = hand_logits();
    const std::pair<float, size_t> cases[] = {{0.1f, 1}, {0.3f, 1},  {0.5f, 2},  {0.7f, 3},
                                              {0.85f, 4}, {0.92f, 5}, {0.97f, 6}, {1.0f, 6}};
    for (auto [top_p, kept] : cases) {
        SamplerParams p = plain(1.0f);
        p.top_p = top_p;
        Sampler s(p, 6);
        const std::vector<TokenProb> d = s.distribution(l.data());
        EXPECT_EQ(ids_of(d), top_ranks(kept)) << "top_p " << top_p;
        if (top_p == 1.0f) continue;  // top-p off: nothing sorted, ids stay in order
        // Survivors renormalized, in descending order.
        double mass = 0;
        for (size_t r = 0; r < kept; ++r) mass += kProbByRank[r];
        for (size_t r = 0; r < d.size() && r < kept; ++r) {
            EXPECT_EQ(d[r].id, kIdsByRank[r]);
            EXPECT_NEAR(d[r].p, kProbByRank[r] / mass, 1e-6);
        }
    }
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheMax) {
    const std::vector<float> l = hand_logits();
    // p_max = 0.4: thresholds 0.02, 0.08, 0.12, 0.2, 0.4.
    const std::pair<float, size_t> cases[] = {{0.05f, 6}, {0.2f, 4}, {0.3f, 3}, {0.5f, 2}, {1.0f, 1}};
    for (auto [min_p, kept] : cases) {
        SamplerParams p = plain(1.0f);
        p.min_p = min_p;
        Sampler s(p, 6);
        EXPECT_EQ(ids_of(s.distribution(l.data())), top_ranks(kept)) << "min_p " << min_p;
    }
    // min_p = 1 keeps every token tied at the maximum.
    std::vector<float> tied = {1, 3, 0, 3, 2};
    SamplerParams p = plain(1.0f);
    p.min_p = 1.0f;
    Sampler s(p, 5);
    EXPECT_EQ(ids_of(s.distribution(tied.data())), (std::set<int32_t>{1, 3}));
}

TEST(Sampler, TruncationRunsTopKThenTopPThenMinPThenTemperature) {
    const std::vector<float> l = hand_logits();
    // top_k = 3 leaves 0.4, 0.25, 0.15 -> renormalized 0.5, 0.3125, 0.1875;
    // top_p = 0.7 then stops after two (0.8125), where on the full set it
    // would keep three (0.4 + 0.25 < 0.7).
    SamplerParams p = plain(1.0f);
    p.top_k = 3;
    p.top_p = 0.7f;
    Sampler a(p, 6);
    EXPECT_EQ(ids_of(a.distribution(l.data())), top_ranks(2));

    // Temperature comes last: it reshapes the survivors, not the set.
    p = plain(0.5f);
    p.top_p = 0.7f;
    Sampler b(p, 6);
    const std::vector<TokenProb> d = b.distribution(l.data());
    ASSERT_EQ(ids_of(d), top_ranks(3));
    const double z = 0.4 * 0.4 + 0.25 * 0.25 + 0.15 * 0.15;  // p^(1/T) with T = 0.5
    for (size_t r = 0; r < 3; ++r) EXPECT_NEAR(d[r].p, kProbByRank[r] * kProbByRank[r] / z, 1e-6);

    // min-p after top-p: relative to the max of what top-p kept.
    p = plain(1.0f);
    p.top_p = 0.85f;  // four survive
    p.min_p = 0.3f;   // 0.1 < 0.3 * 0.4 drops the fourth
    Sampler c(p, 6);
    EXPECT_EQ(ids_of(c.distribution(l.data())), top_ranks(3));
}

TEST(Sampler, TopKKeepsTheKBestWithTiesToTheLowestIds) {
    FreshSeed seed;
    TRACE_SEED(seed);
    std::mt19937_64 rng(seed.value);
    for (int iter = 0; iter < 50; ++iter) {
        const size_t n = 1000;
        std::vector<float> l(n);
        for (float& x : l) x = float(rng() % 12);  // many ties at every level
        if (iter % 3 == 0) l[rng() % n] = -kInf;
        std::vector<int32_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
        SamplerParams p = plain(1.0f);
        p.top_k = 1 + int(rng() % 200);
        Sampler s(p, int(n));
        const std::vector<TokenProb> d = s.distribution(l.data());
        ASSERT_EQ(d.size(), size_t(p.top_k));
        for (size_t i = 0; i < d.size(); ++i) ASSERT_EQ(d[i].id, order[i]) << "k " << p.top_k;
    }
}

TEST(Sampler, TopPOnALargeVocabularyMatchesAFullSortReference) {
    FreshSeed seed;
    TRACE_SEED(seed);
    std::mt19937_64 rng(seed.value);
    const size_t n = 150000;
    std::normal_distribution<float> normal(0.0f, 1.5f);
    std::vector<float> l(n);
    for (float& x : l) x = normal(rng);
    for (float top_p : {0.05f, 0.5f, 0.95f}) {
        std::vector<int32_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
            return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b);
        });
        const double m = l[size_t(order[0])];
        double total = 0;
        for (float x : l) total += std::exp(x - m);
        size_t keep = 0;
        for (double cum = 0; keep < n;) {
            cum += std::exp(l[size_t(order[keep++])] - m);
            if (cum / total >= top_p) break;
        }
        SamplerParams p = plain(1.0f);
        p.top_p = top_p;
        Sampler s(p, int(n));
        const std::vector<TokenProb> d = s.distribution(l.data());
        ASSERT_EQ(d.size(), keep) << "top_p " << top_p;
        for (size_t i = 0; i < keep; ++i) ASSERT_EQ(d[i].id, order[i]) << i;
    }
}

// ---------------------------------------------------------------- penalties

TEST(Sampler, PenaltiesChangeLogitsExactlyAsDefined) {
    SamplerParams p = plain(1.0f);
    p.repeat_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    std::vector<float> l = {2.0f, -2.0f, 0.5f, 1.0f, 0.0f, 3.0f};
    const std::vector<int32_t> recent = {0, 1, 1, 3, 4, 99, -5};  // 99 and -5 are skipped
    apply_penalties(l, recent, p);
    EXPECT_EQ(l[0], 2.0f / 2 - 0.5f * 1 - 0.25f);   // positive: divided
    EXPECT_EQ(l[1], -2.0f * 2 - 0.5f * 2 - 0.25f);  // negative: multiplied, counted twice
    EXPECT_EQ(l[2], 0.5f);                          // not in the history
    EXPECT_EQ(l[3], 1.0f / 2 - 0.5f - 0.25f);
    EXPECT_EQ(l[4], 0.0f * 2 - 0.5f - 0.25f);       // zero counts as non-positive
    EXPECT_EQ(l[5], 3.0f);

    // Negative presence/frequency (OpenAI allows them) raise the logits.
    SamplerParams q = plain(1.0f);
    q.frequency_penalty = -1.0f;
    q.presence_penalty = -2.0f;
    std::vector<float> m = {1.0f, 1.0f};
    const std::vector<int32_t> twice = {1, 1};
    apply_penalties(m, twice, q);
    EXPECT_EQ(m[0], 1.0f);
    EXPECT_EQ(m[1], 1.0f + 2.0f + 2.0f);
}

TEST(Sampler, PenaltiesUseOnlyTheLastRepeatLastNAcceptedTokens) {
    SamplerParams p = plain(1.0f);
    p.repeat_penalty = 4.0f;
    p.repeat_last_n = 3;
    Sampler s(p, 6);
    for (int32_t t : {0, 5, 1, 1, 2}) s.accept(t);  // window: 1, 1, 2
    s.accept(6);    // out of range: ignored, so the window stays 1, 1, 2
    s.accept(-1);
    const std::vector<float> l = {1, 1, 1, 1, 1, 1};
    std::vector<float> expected = l;
    expected[1] = 0.25f;
    expected[2] = 0.25f;
    const std::vector<double> want = softmax(expected, 1.0);
    const std::vector<TokenProb> d = s.distribution(l.data());
    ASSERT_EQ(d.size(), 6u);
    for (const TokenProb& t : d) EXPECT_NEAR(t.p, want[size_t(t.id)], 1e-6) << t.id;

    // Greedy sees the penalties too: the penalized maximum loses.
    SamplerParams g = plain(0.0f);
    g.repeat_penalty = 1.5f;
    Sampler greedy(g, 3);
    const std::vector<float> row = {1.0f, 1.2f, 0.9f};
    EXPECT_EQ(greedy.sample(row.data()), 1);
    greedy.accept(1);  // 1.2 / 1.5 = 0.8
    EXPECT_EQ(greedy.sample(row.data()), 0);
    greedy.reset();
    EXPECT_EQ(greedy.sample(row.data()), 1);
}

// ---------------------------------------------------------------- hostile logits

TEST(Sampler, NaNAndInfinityNeverMisbehave) {
    FreshSeed seed;
    TRACE_SEED(seed);
    std::mt19937_64 rng(seed.value);

    SamplerParams hot = plain(1.0f);
    hot.seed = rng();
    Sampler s(hot, 5);
    const std::vector<float> all_nan(5, kNaN), all_neg(5, -kInf);
    EXPECT_EQ(s.sample(all_nan.data()), 0);
    EXPECT_EQ(s.sample(all_neg.data()), 0);
    EXPECT_EQ(s.distribution(all_nan.data()).size(), 1u);

    const std::vector<float> pos_inf = {0, kInf, kNaN, kInf, 5};
    std::set<int32_t> seen;
    for (int i = 0; i < 200; ++i) seen.insert(s.sample(pos_inf.data()));
    EXPECT_EQ(seen, (std::set<int32_t>{1, 3}));  // uniform over the +inf tokens: both appear

    Sampler greedy(plain(0.0f), 5);
    EXPECT_EQ(greedy.sample(pos_inf.data()), 1);
    EXPECT_EQ(greedy.sample(all_nan.data()), 0);

    // Random rows salted with NaN and infinities under random settings: the
    // token is in range and never one whose logit was NaN or -inf while a
    // usable token existed.
    std::uniform_real_distribution<float> u01(0.0f, 1.0f);
    for (int iter = 0; iter < 2000; ++iter) {
        const int n = 1 + int(rng() % 64);
        std::vector<float> l = random_logits(rng, size_t(n), -30, 30);
        for (float& x : l) {
            const float r = u01(rng);
            if (r < 0.2f) x = kNaN;
            else if (r < 0.35f) x = -kInf;
            else if (r < 0.37f) x = kInf;
            else if (r < 0.4f) x = std::numeric_limits<float>::max();
        }
        SamplerParams p;
        p.temperature = u01(rng) < 0.2f ? 0.0f : 100.0f * u01(rng) * u01(rng);
        p.top_k = int(rng() % 5);
        p.top_p = std::max(u01(rng), 1e-3f);
        p.min_p = u01(rng) * u01(rng);
        p.repeat_penalty = 0.01f + 10 * u01(rng);
        p.frequency_penalty = 4 * u01(rng) - 2;
        p.presence_penalty = 4 * u01(rng) - 2;
        p.seed = rng();
        ASSERT_TRUE(p.validate().ok()) << p.validate().message();
        Sampler t(p, n);
        for (int k = 0; k < 8; ++k) t.accept(int32_t(rng() % uint64_t(n)));
        bool any_usable = false;
        for (float x : l) any_usable |= x > -kInf;
        const int32_t tok = t.sample(l.data());
        ASSERT_GE(tok, 0);
        ASSERT_LT(tok, n);
        if (any_usable) {
            ASSERT_TRUE(l[size_t(tok)] > -kInf) << "picked a NaN/-inf token " << tok;
        }
    }
}

TEST(Sampler, ClampsParamsThatSkippedValidation) {
    SamplerParams p;
    p.temperature = kNaN;  // becomes greedy
    p.top_p = kNaN;
    p.min_p = -3;
    p.repeat_penalty = -1;
    p.repeat_last_n = -7;
    Sampler s(p, 4);
    EXPECT_TRUE(s.params().validate().ok()) << s.params().validate().message();
    const std::vector<float> l = {0, 2, 1, 2};
    EXPECT_EQ(s.sample(l.data()), 1);
}

}  // namespace
