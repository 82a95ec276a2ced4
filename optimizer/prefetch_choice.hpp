// The dispatcher's side of the run-time prefetch choice (prefetch_choice.cpp; the public side is
// in adam.hpp).
#pragma once

#include <zbadam/adam.hpp>
#include <zbadam/team_share.hpp>

#include <cstddef>
#include <cstdint>

namespace zb::opt {

// A call this large (elements) is far out of any cache: its chunks time the memory system.
inline constexpr size_t kCalibrationMinimum = size_t{64} * TeamShare::kChunk;

// After this many large calls timed on a team's first thread without kCalibrationPairs whole
// pairs (its chunks taken by others), the choice is off, as without software prefetch.
inline constexpr int kMaxAttempts = 8 * kCalibrationPairs;

// What makes two calls comparable: the same elements, streams and tensors.
struct Kind {
    size_t total = 0;
    GradType grad = GradType::f32;
    CopyType copy = CopyType::none;
    bool stale = false;
    size_t tensors = 0;
};

// Whether calls of this kind on a team of `threads` are timed while the choice is being made:
// large ones whose first thread has a slice of 16 chunks or more (the same answer on every
// thread of the team).
bool timed_kind(const Kind &kind, int threads);

// The mode a call runs with: the requested one, the run-time choice once made, or while it is
// being made, off for a call that is not timed and for one that is, the mode of its place in the
// calling thread's sequence of calls of its kind, `call` (UINT64_MAX for the others).
Prefetch call_prefetch(const Kind &kind, int threads, uint64_t &call);

// The first thread of call `call` of `kind` ran `elements` of it in `seconds` (its own chunks
// after its first; 0 elements: too few to time): a sample for the run-time choice (nothing for
// call UINT64_MAX). Never throws nor waits: a sample that finds another being taken is dropped
// (a pair it belonged to is not counted), as it runs inside zb_adam_step's C calls.
void record_call(const Kind &kind, uint64_t call, size_t elements, double seconds) noexcept;

} // namespace zb::opt
