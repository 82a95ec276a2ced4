// Tuning profiles: where the Adam step saturates each NUMA node's memory bandwidth.
//
// File format (zenbind(1), PROFILE FORMAT): a first line "zenbind-profile 1", then one line per
// NUMA node "node N saturate S gbps G1,G2,...,Gn" (Gi: GB/s on i optimizer cores); '#' starts a
// comment line. Parsing is strict and bounded: the profile= key comes from users.
#include "bitmap.hpp"
#include "error.hpp"
#include "quote.hpp"
#include "text_file.hpp"
#include "topology.hpp"
#include <zbutil/decimal.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

struct zb_profile {
    struct Node {
        unsigned saturation = 0;
        std::vector<double> gb_per_s;
    };
    std::map<unsigned, Node> nodes;
};

namespace {

constexpr double kWithinBest = 0.95; // "within 5% of the best"
constexpr size_t kMaxFileBytes = 1 << 20;
constexpr unsigned kMaxCounts = 4096;
constexpr unsigned kMaxNode = ZB_CPULIST_MAX_ID;
// Throughputs a profile may hold, in GB/s: every one of them survives save() (three decimals)
// and load() unchanged in meaning, so a saved profile always loads back.
constexpr double kMinGbps = 0.001, kMaxGbps = 1e6;

unsigned saturation_of(const std::vector<double> &gbps) {
    const double best = *std::max_element(gbps.begin(), gbps.end());
    for (size_t i = 0; i < gbps.size(); ++i)
        if (gbps[i] >= kWithinBest * best) return static_cast<unsigned>(i + 1);
    return static_cast<unsigned>(gbps.size());
}

void check_gbps(const std::vector<double> &gbps, const std::string &where) {
    if (gbps.empty() || gbps.size() > kMaxCounts)
        zb::fail(ZB_EINVAL,
                 where + ": expected 1 to " + std::to_string(kMaxCounts) + " throughput figures");
    for (double g : gbps)
        if (!(g >= kMinGbps && g <= kMaxGbps))
            zb::fail(ZB_EINVAL,
                     where + ": throughput figures must be between 0.001 and 1000000 GB/s");
}

// Field `field` of a profile line, a whole number at most `max` (`limit` says why).
unsigned parse_uint(const std::string &word, unsigned max, const std::string &where,
                    const char *field, const std::string &limit) {
    if (!zb::util::is_decimal(word))
        zb::fail(ZB_EINVAL,
                 where + ": " + field + " " + zb::quote_input(word) + " is not a whole number");
    const auto v = zb::util::parse_decimal(word, max);
    if (!v) zb::fail(ZB_EINVAL, where + ": " + field + " " + word + " is more than " + limit);
    return static_cast<unsigned>(*v);
}

std::vector<double> parse_gbps(const std::string &word, const std::string &where) {
    std::vector<double> out;
    std::stringstream ss(word);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (item.empty() || item.size() > 32 ||
            item.find_first_not_of("0123456789.") != std::string::npos)
            zb::fail(ZB_EINVAL,
                     where + ": " + zb::quote_input(item) + " is not a throughput in GB/s");
        char *end = nullptr;
        out.push_back(std::strtod(item.c_str(), &end));
        if (*end != '\0')
            zb::fail(ZB_EINVAL, where + ": " + zb::quote_input(item) + " is not a number");
        if (out.size() > kMaxCounts) break;
    }
    check_gbps(out, where);
    return out;
}

zb_profile::Node parse_node_line(const std::string &line, const std::string &where,
                                 unsigned &node) {
    std::istringstream in(line);
    std::string kw_node, node_s, kw_sat, sat_s, kw_gbps, gbps_s, extra;
    in >> kw_node >> node_s >> kw_sat >> sat_s >> kw_gbps >> gbps_s;
    if (kw_node != "node" || kw_sat != "saturate" || kw_gbps != "gbps" || gbps_s.empty() ||
        (in >> extra))
        zb::fail(ZB_EINVAL, where + ": expected 'node N saturate S gbps G1,G2,...'");
    node = parse_uint(node_s, kMaxNode, where, "node", std::to_string(kMaxNode));
    zb_profile::Node n;
    n.gb_per_s = parse_gbps(gbps_s, where);
    n.saturation =
        parse_uint(sat_s, static_cast<unsigned>(n.gb_per_s.size()), where, "saturate",
                   "the " + std::to_string(n.gb_per_s.size()) + " throughput figures given");
    if (n.saturation == 0) zb::fail(ZB_EINVAL, where + ": saturate must be at least 1");
    return n;
}

void load(const char *path, zb_profile &profile) {
    if (!path || path[0] != '/') zb::fail(ZB_EINVAL, "profile path must be absolute");
    // Profiles are read by slurmstepd for the user who names them: the reader refuses FIFOs.
    std::istringstream lines(zb::require_text_file(path, kMaxFileBytes));
    std::string line;
    unsigned lineno = 0;
    bool header = false;
    while (std::getline(lines, line)) {
        ++lineno;
        const std::string where = std::string(path) + ":" + std::to_string(lineno);
        if (line.empty() || line[0] == '#') continue;
        if (!header) {
            if (line != "zenbind-profile 1")
                zb::fail(ZB_EINVAL,
                         where + ": not a zenbind profile (expected 'zenbind-profile 1')");
            header = true;
            continue;
        }
        unsigned node = 0;
        zb_profile::Node n = parse_node_line(line, where, node);
        if (!profile.nodes.emplace(node, std::move(n)).second)
            zb::fail(ZB_EINVAL, where + ": node " + std::to_string(node) + " appears twice");
    }
    if (!header) zb::fail(ZB_EINVAL, std::string("profile ") + path + " is empty");
}

void save(const zb_profile &profile, const char *path) {
    if (!path || !*path) zb::fail(ZB_EINVAL, "profile path is empty");
    const std::string tmp = std::string(path) + ".tmp." + std::to_string(getpid());
    FILE *f = std::fopen(tmp.c_str(), "w");
    if (!f) zb::fail_errno("cannot create " + tmp);
    std::fprintf(f, "zenbind-profile 1\n# node N saturate S gbps G1,...,Gn: Adam GB/s on 1..n "
                    "optimizer cores; S = fewest cores within 5%% of the best\n");
    for (const auto &[node, n] : profile.nodes) {
        std::fprintf(f, "node %u saturate %u gbps ", node, n.saturation);
        for (size_t i = 0; i < n.gb_per_s.size(); ++i)
            std::fprintf(f, "%s%.3f", i ? "," : "", n.gb_per_s[i]);
        std::fputc('\n', f);
    }
    const bool ok = std::fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (std::fclose(f) != 0 || !ok) {
        std::remove(tmp.c_str());
        zb::fail_errno("cannot write " + tmp);
    }
    if (std::rename(tmp.c_str(), path) != 0) {
        const int err = errno;
        std::remove(tmp.c_str());
        errno = err;
        zb::fail_errno(std::string("cannot rename ") + tmp + " to " + path);
    }
}

unsigned ceil_div(unsigned a, unsigned b) {
    return (a + b - 1) / b;
}

void apply(const zb_profile &profile, hwloc_topology_t topo, hwloc_const_cpuset_t allowed,
           unsigned ntasks, zb_options &options) {
    if (options.set & (ZB_SET_OPT | ZB_SET_TRAIN)) return; // the user's split wins
    if (ntasks == 0) zb::fail(ZB_EINVAL, "the task count must be at least 1");
    // The home nodes (OS numbers) of the allowed CPUs, as the planner places tasks on them.
    const std::vector<hwloc_obj_t> nodes = zb::cpu_nodes(topo);
    std::vector<unsigned> used;
    int cpu = -1;
    while ((cpu = hwloc_bitmap_next(allowed, cpu)) >= 0) {
        zb::Bitmap one;
        hwloc_bitmap_only(one, static_cast<unsigned>(cpu));
        const int home = zb::home_node(nodes, one);
        if (home >= 0 && std::find(used.begin(), used.end(), nodes[home]->os_index) == used.end())
            used.push_back(nodes[home]->os_index);
    }
    if (used.empty()) return;
    const unsigned per_node = ceil_div(ntasks, static_cast<unsigned>(used.size()));
    unsigned opt = 0;
    for (unsigned node : used) {
        auto it = profile.nodes.find(node);
        if (it != profile.nodes.end())
            opt = std::max(opt, std::max(1u, ceil_div(it->second.saturation, per_node)));
    }
    if (opt) options.opt_cores = opt;
}

} // namespace

extern "C" {

zb_status zb_profile_load(const char *path, zb_profile_t **out) {
    return zb::guard([&] {
        if (!out) zb::fail(ZB_EINVAL, "zb_profile_load: out is NULL");
        auto p = std::make_unique<zb_profile>();
        load(path, *p);
        *out = p.release();
    });
}

zb_status zb_profile_create(zb_profile_t **out) {
    return zb::guard([&] {
        if (!out) zb::fail(ZB_EINVAL, "zb_profile_create: out is NULL");
        *out = new zb_profile;
    });
}

void zb_profile_free(zb_profile_t *profile) {
    delete profile;
}

zb_status zb_profile_add_node(zb_profile_t *profile, unsigned node, const double *gb_per_s,
                              unsigned ncounts) {
    return zb::guard([&] {
        if (!profile || !gb_per_s) zb::fail(ZB_EINVAL, "zb_profile_add_node: NULL argument");
        if (node > kMaxNode) zb::fail(ZB_EINVAL, "zb_profile_add_node: node out of range");
        std::vector<double> g(gb_per_s, gb_per_s + ncounts);
        check_gbps(g, "node " + std::to_string(node));
        profile->nodes[node] = {saturation_of(g), std::move(g)};
    });
}

zb_status zb_profile_save(const zb_profile_t *profile, const char *path) {
    return zb::guard([&] {
        if (!profile) zb::fail(ZB_EINVAL, "zb_profile_save: profile is NULL");
        save(*profile, path);
    });
}

unsigned zb_profile_saturation(const zb_profile_t *profile, unsigned node) {
    if (!profile) return 0;
    auto it = profile->nodes.find(node);
    return it == profile->nodes.end() ? 0 : it->second.saturation;
}

zb_status zb_profile_apply(const zb_profile_t *profile, const zb_topology_t *topology,
                           const zb_cpuset_t *allowed, unsigned ntasks, zb_options *options) {
    return zb::guard([&] {
        if (!profile || !topology || !allowed || !options)
            zb::fail(ZB_EINVAL, "zb_profile_apply: NULL argument");
        zb::check_size(options->size, sizeof *options, "zb_profile_apply", "options",
                       "zb_options_init");
        apply(*profile, zb_topology_hwloc(topology), zb_cpuset_hwloc_const(allowed), ntasks,
              *options);
    });
}
}
