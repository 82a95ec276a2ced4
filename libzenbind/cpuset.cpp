// zb_cpuset_t, the sets of the C ABI: an hwloc bitmap inside (<zenbind/hwloc.h>), so that no
// hwloc type is part of <zenbind/zenbind.h> and a program that uses hwloc converts for free.
#include "error.hpp"

#include <zenbind/hwloc.h>

extern "C" {

zb_cpuset_t *zb_cpuset_alloc(void) {
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set) zb::set_last_error("zb_cpuset_alloc: out of memory");
    return zb_cpuset_from_hwloc(set);
}

void zb_cpuset_free(zb_cpuset_t *set) {
    hwloc_bitmap_free(zb_cpuset_hwloc(set));
}

int zb_cpuset_weight(const zb_cpuset_t *set) {
    return set ? hwloc_bitmap_weight(zb_cpuset_hwloc_const(set)) : 0;
}

int zb_cpuset_isset(const zb_cpuset_t *set, unsigned id) {
    return set && hwloc_bitmap_isset(zb_cpuset_hwloc_const(set), id) ? 1 : 0;
}

int zb_cpuset_next(const zb_cpuset_t *set, int prev) {
    return set ? hwloc_bitmap_next(zb_cpuset_hwloc_const(set), prev < -1 ? -1 : prev) : -1;
}

int zb_cpuset_isequal(const zb_cpuset_t *a, const zb_cpuset_t *b) {
    if (!a || !b) return a == b;
    return hwloc_bitmap_isequal(zb_cpuset_hwloc_const(a), zb_cpuset_hwloc_const(b)) ? 1 : 0;
}
}
