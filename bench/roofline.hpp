// The roofline the Adam benchmark compares against: a plain streaming pass over exactly the bytes
// an Adam step of the same configuration moves (param and moments read and written back in place,
// the gradient read, copy-out and stale written), as the compiler writes a plain loop for the
// kernel's instruction set: no software prefetch, no blocking, no arithmetic.
#pragma once

#include <zbadam/adam.hpp>

namespace zb::opt::bench {

// The forms of the pass; the benchmark times each and holds the kernel to the fastest.
// (No form leaves vectorizing to the compiler: GCC does not vectorize the plain loop at -O2, and
// the scalar read-modify-writes it makes stream at 1.4-1.9 GB/s on 2 MiB-aligned buffers, AMD EPYC
// Zen 4, so it would only make the benchmark slow.)
enum class RoofForm : uint8_t {
    simd,  // the plain loop under `#pragma omp simd`: vector loads and stores of the ISA's width
    lines, // the loop in chunks of one 64-byte line of each fp32 stream, each stream's chunk an
           // `omp simd` loop of its own: every line is read or written whole before the next
    nt,    // `lines` in chunks of one line of every stream, with the streams it only writes
           // (copy-out, stale) stored non-temporally, as `omp simd nontemporal` asks for: GCC 12
           // ignores that clause, so this form alone spells the ISA's streaming store
    prefetched, // `nt` with the kernel's software prefetch (its distance, into L2): not a plain
                // pass, so never the roofline; a diagnostic of what prefetching gives plain code
};
inline constexpr RoofForm kRoofForms[] = {RoofForm::simd, RoofForm::lines, RoofForm::nt};
const char *roof_form_name(RoofForm f);

// Runs the pass over elements [lo, hi) of `t`, compiled for `isa` (the baseline x86-64 for
// scalar). Values are written back unchanged, so the kernel's next step sees the same data.
void stream_pass(const AdamTensor &t, GradType g, CopyType c, size_t lo, size_t hi, Isa isa,
                 RoofForm form);

} // namespace zb::opt::bench
