// Loops over independent iterations, on the OpenMP threads where there is
// enough work to share and on the calling thread alone where there is not.
// The check comes before OpenMP sees the loop: a parallel region whose `if`
// is false still goes through libgomp's team setup, about a third of a
// microsecond, and a decode step runs a few hundred small operations.
#pragma once

#include <omp.h>

#include <cstdint>

namespace tern::backend::cpu {

// body(i) for i in [0, n): contiguous ranges a thread (static schedule), on
// `threads` threads (0: OpenMP's default) when `parallel`.
template <class Body>
void parallel_for(int64_t n, bool parallel, const Body& body, int threads = 0) {
    if (!parallel) {
        for (int64_t i = 0; i < n; ++i) body(i);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads())
    for (int64_t i = 0; i < n; ++i) body(i);
}

// The same, iterations handed out one at a time (uneven work).
template <class Body>
void parallel_for_dynamic(int64_t n, bool parallel, const Body& body) {
    if (!parallel) {
        for (int64_t i = 0; i < n; ++i) body(i);
        return;
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace tern::backend::cpu
