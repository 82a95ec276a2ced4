// The roofline the Adam benchmark compares against: a pure streaming pass over exactly the bytes
// an Adam step of the same configuration moves, with the same access pattern (param, moments read
// and written in place, gradients read, copy-out and stale written) and the same thread slices.
#pragma once

#include "adam.hpp"

namespace zf::bench {

// Runs the pass over elements [lo, hi) of `t` with vector loads and stores of `isa`'s width.
// Values are written back unchanged, so the kernel's next step sees the same data. With
// `prefetch` it also reads ahead as the kernels do.
void stream_pass(const AdamTensor &t, GradType g, CopyType c, size_t lo, size_t hi, Isa isa,
                 bool prefetch);

} // namespace zf::bench
