// Running a sequence through a forward pass (one GPU, or tensor-parallel
// ranks) the way the whole-model GPU tests compare them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/forward.h"

namespace tern::gpu_test {

inline size_t argmax(const float* v, size_t n) { return size_t(std::max_element(v, v + n) - v); }

// Prefills `prompt` into `slot` with logits for every position, then decodes
// n_decode tokens one per call: follow[i] when given, else the argmax of the
// previous row (appended to follow). Appends prompt.size() + n_decode rows.
inline void run_sequence(model::Pass& f, int slot, const std::vector<int32_t>& prompt, int n_decode,
                         std::vector<int32_t>& follow, size_t nv, std::vector<float>& rows) {
    model::Batch b;
    for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], int32_t(i), slot, true);
    model::Logits out;
    const Status st = f.run(b, out);
    ASSERT_TRUE(st.ok()) << st.message();
    rows.insert(rows.end(), out.begin(), out.end());
    const bool choose = follow.empty();
    for (int i = 0; i < n_decode; ++i) {
        if (choose) follow.push_back(int32_t(argmax(rows.data() + rows.size() - nv, nv)));
        model::Batch one;
        one.add(follow[size_t(i)], int32_t(prompt.size()) + i, slot, true);
        const Status s = f.run(one, out);
        ASSERT_TRUE(s.ok()) << s.message();
        rows.insert(rows.end(), out.begin(), out.end());
    }
}

}  // namespace tern::gpu_test
