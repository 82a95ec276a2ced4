// How many threads an OpenMP region of libzenbind may start: libgomp's threads do not survive
// fork(2), and in a child of a process that ran a region of more than one thread, another such
// region waits for them forever. The regions here (zb_adam_step, zb_adam_grad_stats, the state
// copies) ask this first; in such a child they run on one thread.
#pragma once

namespace zb {

// `wanted` (>= 1), or 1 in a forked child of a process whose libzenbind ran a team; records
// this process as one that did when it returns more than 1.
int team_threads(int wanted);

} // namespace zb
