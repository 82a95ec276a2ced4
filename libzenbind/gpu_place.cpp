#include "gpu_place.hpp"
#include "topology.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>

namespace zb {
namespace {

// Distances between NUMA nodes: hwloc's matrix when the topology has one (ACPI SLIT, an XML
// export), else hops in the topology tree from the nodes' parents to their common ancestor.
class Distances {
  public:
    explicit Distances(hwloc_topology_t topo) : topo_(topo) {
        // A latency matrix (larger is farther; a bandwidth one reads the other way). hwloc fills at
        // most the one slot given and sets nr to how many there are.
        unsigned nr = 1;
        hwloc_distances_s *d = nullptr;
        if (hwloc_distances_get_by_type(topo, HWLOC_OBJ_NUMANODE, &nr, &d,
                                        HWLOC_DISTANCES_KIND_MEANS_LATENCY, 0) == 0 &&
            nr >= 1)
            matrix_ = d;
    }
    ~Distances() {
        if (matrix_) hwloc_distances_release(topo_, matrix_);
    }
    Distances(const Distances &) = delete;
    Distances &operator=(const Distances &) = delete;

    unsigned long between(unsigned a, unsigned b) const {
        if (a == b) return 0;
        hwloc_obj_t na = hwloc_get_numanode_obj_by_os_index(topo_, a);
        hwloc_obj_t nb = hwloc_get_numanode_obj_by_os_index(topo_, b);
        if (!na || !nb) return ULONG_MAX;
        hwloc_uint64_t ab = 0, ba = 0;
        if (matrix_ && hwloc_distances_obj_pair_values(matrix_, na, nb, &ab, &ba) == 0)
            return static_cast<unsigned long>(ab);
        // Memory objects hang off a normal object; the deeper the common ancestor, the nearer.
        hwloc_obj_t common = hwloc_get_common_ancestor_obj(topo_, na->parent, nb->parent);
        const int depth = hwloc_topology_get_depth(topo_);
        return 1 + static_cast<unsigned long>(depth - (common ? common->depth : 0));
    }

  private:
    hwloc_topology_t topo_;
    hwloc_distances_s *matrix_ = nullptr;
};

std::string node_text(unsigned node) {
    return "NUMA node " + std::to_string(node);
}

// The node whose CPUs a GPU on node `g` is beside: `g` itself, or for a memory-only node (the
// GPU's own HBM on a Grace Hopper, which the driver may report as the GPU's node) the nearest DRAM
// node holding CPUs, the lowest number on a tie.
unsigned cpu_side(hwloc_topology_t topo, const Distances &d, unsigned g) {
    hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(topo, g);
    if (!node || is_dram(node)) return g;
    unsigned best = g;
    unsigned long best_distance = ULONG_MAX;
    for (hwloc_obj_t n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, nullptr); n;
         n = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, n)) {
        if (!is_dram(n) || hwloc_bitmap_iszero(n->cpuset)) continue;
        const unsigned long distance = d.between(g, n->os_index);
        if (distance < best_distance || (distance == best_distance && n->os_index < best)) {
            best = n->os_index;
            best_distance = distance;
        }
    }
    return best;
}

} // namespace

// How far share `s` is from GPU node `g`: its nearest node's distance, then fewer cores there
// is farther. Lexicographic, smaller is nearer.
std::pair<unsigned long, long> cost(const Distances &d, const ShareNodes &share, unsigned g) {
    std::pair<unsigned long, long> best{ULONG_MAX, 0};
    for (const auto &[node, cores] : share)
        best = std::min(best, std::make_pair(d.between(g, node), -static_cast<long>(cores)));
    return best;
}

GpuPlacement place_by_gpu(hwloc_topology_t topo, const std::vector<ShareNodes> &shares,
                          hwloc_const_nodeset_t step_nodes, const int *gpu_nodes) {
    const size_t n = shares.size();
    GpuPlacement p;
    p.share_of.assign(n, SIZE_MAX);
    std::vector<bool> taken(n, false);
    std::vector<int> gpu(n, -1);
    bool any = false;
    const Distances distances(topo);
    for (size_t t = 0; t < n; ++t) {
        if (gpu_nodes[t] < 0) continue;
        if (!hwloc_get_numanode_obj_by_os_index(topo, static_cast<unsigned>(gpu_nodes[t]))) {
            p.warnings.emplace_back(t, "GPU on " + node_text(static_cast<unsigned>(gpu_nodes[t])) +
                                           ", which is not in the topology: share taken in order");
            continue;
        }
        gpu[t] = static_cast<int>(cpu_side(topo, distances, static_cast<unsigned>(gpu_nodes[t])));
        any = true;
    }
    // The free share nearest task t's GPU, among those at distance 0 only when `local`.
    const auto nearest = [&](size_t t, bool local) {
        size_t best = SIZE_MAX;
        std::pair<unsigned long, long> best_cost;
        for (size_t s = 0; s < n; ++s) {
            if (taken[s]) continue;
            const auto c = cost(distances, shares[s], static_cast<unsigned>(gpu[t]));
            if ((!local || c.first == 0) && (best == SIZE_MAX || c < best_cost)) {
                best = s;
                best_cost = c;
            }
        }
        return best;
    };
    for (bool local : {true, false})
        for (size_t t = 0; t < n; ++t) {
            if (gpu[t] < 0 || p.share_of[t] != SIZE_MAX) continue;
            const size_t s = nearest(t, local);
            if (s == SIZE_MAX) continue;
            p.share_of[t] = s;
            taken[s] = true;
            if (local) continue;
            const unsigned g = static_cast<unsigned>(gpu_nodes[t]); // the node as reported
            std::string where;
            for (const auto &[node, cores] : shares[s])
                where += (where.empty() ? "" : ",") + std::to_string(node);
            p.warnings.emplace_back(
                t, "GPU on " + node_text(g) +
                       (hwloc_bitmap_isset(step_nodes, static_cast<unsigned>(gpu[t]))
                            ? ", whose shares went to earlier tasks"
                            : ", which has no CPU of the step") +
                       ": share on NUMA node " + where + ", the nearest left");
        }
    for (size_t t = 0, s = 0; t < n; ++t) {
        if (p.share_of[t] != SIZE_MAX) continue;
        while (taken[s])
            ++s;
        p.share_of[t] = s;
        taken[s] = true;
        if (any && gpu_nodes[t] < 0)
            p.warnings.emplace_back(t, "no GPU of a known NUMA node: share taken in order among "
                                       "those left");
    }
    return p;
}

} // namespace zb
