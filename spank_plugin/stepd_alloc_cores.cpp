#include "stepd_alloc_cores.hpp"

#include <zenbind/hwloc.h>

#include <memory>

namespace zb::spank {

// Slurm numbers a node's cores 0..sockets*cores-1 in its credential, socket by socket, which is
// hwloc's logical core order (slurmd builds its abstract-to-machine map from hwloc the same way).
bool alloc_cores_to_cpus(const char *cores, const zb_topology_t *topology, zb_cpuset_t *out,
                         std::string &error) {
    if (!cores || !*cores) {
        error = "Slurm gave no S_STEP_ALLOC_CORES for this step";
        return false;
    }
    std::unique_ptr<zb_cpuset_t, void (*)(zb_cpuset_t *)> ids(zb_cpuset_alloc(), zb_cpuset_free);
    if (!ids || zb_cpulist_parse(cores, ids.get()) != ZB_OK) {
        error = std::string("cannot read S_STEP_ALLOC_CORES '") + cores + "': " + zb_last_error();
        return false;
    }
    hwloc_topology_t topo = zb_topology_hwloc(topology);
    const hwloc_bitmap_t cpus = zb_cpuset_hwloc(out);
    hwloc_bitmap_zero(cpus);
    for (int id = zb_cpuset_next(ids.get(), -1); id >= 0; id = zb_cpuset_next(ids.get(), id)) {
        hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, static_cast<unsigned>(id));
        if (!core) {
            error = "Slurm allocated core " + std::to_string(id) + " but this node has only " +
                    std::to_string(hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE)) +
                    " cores: slurm.conf does not describe this node as slurmd -C does";
            return false;
        }
        hwloc_bitmap_or(cpus, cpus, core->cpuset);
    }
    return true;
}

} // namespace zb::spank
