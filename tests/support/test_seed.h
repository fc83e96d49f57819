// The seed of a test binary's random inputs: fresh each run unless
// TERN_TEST_SEED is set, printed once so a failing run can be replayed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace tern::test {

inline uint32_t run_seed() {
    static const uint32_t s = [] {
        const char* env = std::getenv("TERN_TEST_SEED");
        const uint32_t v = env ? uint32_t(std::strtoul(env, nullptr, 10)) : std::random_device{}();
        std::fprintf(stderr, "random inputs: seed %u (set TERN_TEST_SEED to replay)\n", v);
        return v;
    }();
    return s;
}

}  // namespace tern::test
