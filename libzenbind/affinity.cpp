#include "affinity.hpp"

#include "error.hpp"

#include <zbutil/openmp_binding.hpp>

#include <algorithm>
#include <cerrno>
#include <omp.h>
#include <sched.h>
#include <vector>

namespace zb {

void process_affinity(pid_t pid, hwloc_bitmap_t out) {
    // The kernel refuses a mask smaller than its CPU count, so grow until it fits.
    for (size_t ncpus = 1024; ncpus <= (1u << 22); ncpus *= 2) {
        cpu_set_t *mask = CPU_ALLOC(ncpus);
        if (!mask) throw std::bad_alloc();
        const size_t size = CPU_ALLOC_SIZE(ncpus);
        if (sched_getaffinity(pid, size, mask) == 0) {
            hwloc_bitmap_zero(out);
            for (size_t cpu = 0; cpu < ncpus; ++cpu)
                if (CPU_ISSET_S(cpu, size, mask)) hwloc_bitmap_set(out, static_cast<unsigned>(cpu));
            CPU_FREE(mask);
            return;
        }
        const int err = errno;
        CPU_FREE(mask);
        errno = err;
        if (err != EINVAL) fail_errno("sched_getaffinity(" + std::to_string(pid) + ")");
    }
    fail(ZB_ESYS, "sched_getaffinity: the kernel's CPU mask is larger than 4194304 CPUs");
}

void caller_cpus(hwloc_bitmap_t out) {
    const int places = util::openmp_binds() ? omp_get_num_places() : 0;
    if (places > 0) {
        hwloc_bitmap_zero(out);
        std::vector<int> ids;
        for (int p = 0; p < places; ++p) {
            ids.resize(static_cast<size_t>(std::max(omp_get_place_num_procs(p), 0)));
            omp_get_place_proc_ids(p, ids.data());
            for (const int id : ids)
                if (id >= 0) hwloc_bitmap_set(out, static_cast<unsigned>(id));
        }
        if (!hwloc_bitmap_iszero(out)) return;
    }
    process_affinity(0, out);
}

} // namespace zb
