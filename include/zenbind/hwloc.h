/* hwloc.h: libzenbind for programs that use hwloc themselves.
 *
 * <zenbind/zenbind.h> names no hwloc type, so that its ABI does not follow hwloc's. A zb_cpuset_t
 * is an hwloc bitmap inside; these convert without copying, for a program built against the
 * hwloc this libzenbind was built with. A converted set stays owned where it was: free a
 * zb_cpuset_alloc() set with zb_cpuset_free(), an hwloc_bitmap_alloc() one with
 * hwloc_bitmap_free().
 */
#ifndef ZENBIND_HWLOC_H
#define ZENBIND_HWLOC_H

#include <hwloc.h>
#include <zenbind/zenbind.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline hwloc_bitmap_t zb_cpuset_hwloc(zb_cpuset_t *set) {
    return (hwloc_bitmap_t)(void *)set;
}
static inline hwloc_const_bitmap_t zb_cpuset_hwloc_const(const zb_cpuset_t *set) {
    return (hwloc_const_bitmap_t)(const void *)set;
}
static inline zb_cpuset_t *zb_cpuset_from_hwloc(hwloc_bitmap_t set) {
    return (zb_cpuset_t *)(void *)set;
}
static inline const zb_cpuset_t *zb_cpuset_from_hwloc_const(hwloc_const_bitmap_t set) {
    return (const zb_cpuset_t *)(const void *)set;
}

/* The hwloc topology `topology` holds (owned by it). */
hwloc_topology_t zb_topology_hwloc(const zb_topology_t *topology);

#ifdef __cplusplus
}
#endif

#endif /* ZENBIND_HWLOC_H */
