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

// The mode a call of `total` elements runs with: the requested one, the run-time choice once
// made, or while it is being made, off for a small call and for a large one the mode of its place
// in the calling thread's sequence of large calls, `call` (UINT64_MAX for the others).
Prefetch call_prefetch(size_t total, uint64_t &call);

// The first thread of large call `call` ran `elements` of it in `seconds` (its own chunks after its
// first): a sample for the run-time choice (none for call UINT64_MAX).
void record_call(uint64_t call, size_t elements, double seconds);

} // namespace zb::opt
