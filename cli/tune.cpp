// `zenbind tune`: find, on each NUMA node of this machine, how many optimizer cores saturate its
// memory bandwidth for the Adam step, and write a profile the plugin's profile= key reads.
//
// For each node with allowed CPUs: buffers several times larger than the node's caches are
// placed on that node, then the real Adam kernel runs on 1..n of its physical cores (one pinned
// thread per core). The saturation point is the fewest cores within 5% of the best throughput;
// past it, more optimizer threads only add synchronisation (zb_profile_add_node applies the rule).
#include "tune.hpp"

#include "common.hpp"

#include <zenbind/hwloc.h>
#include <zenbind/zenbind.h>

#include <zbadam/adam.hpp>
#include <zbadam/team_share.hpp>
#include <zbutil/decimal.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <numa.h>
#include <omp.h>
#include <sched.h>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace {

struct TuneArgs {
    std::string output;
    std::string target;  // the file written: output, or the file its symbolic link names
    size_t elements = 0; // 0: sized from the node's caches
    unsigned steps = 5;
    unsigned max_cores = 0; // 0: every core of the node
    bool json = false;
};

constexpr size_t kMinElements = size_t(16) << 20; // 16 Mi elements = 256 MiB of fp32 state
constexpr size_t kBytesPerElement = 28;           // fp32 AdamW: read p,g,m,v, write p,m,v

int usage_error(const char *message) {
    std::fprintf(stderr, "zenbind: tune: %s\n", message);
    std::fprintf(stderr, "usage: zenbind tune --output FILE [--elements N] [--steps K] "
                         "[--max-cores N] [--json]\n");
    return 2;
}

bool parse_count(const char *text, size_t max, size_t &out) {
    const auto n = text ? zb::util::parse_decimal(text, max) : std::nullopt;
    if (!n || *n < 1) return false;
    out = static_cast<size_t>(*n);
    return true;
}

int parse_args(int argc, char **argv, TuneArgs &a) {
    std::vector<std::string> seen;
    for (int i = 0; i < argc; ++i) {
        const std::string arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : nullptr;
        size_t n = 0;
        if (arg == "--json") {
            a.json = true;
            continue;
        }
        if (arg != "--output" && arg != "--elements" && arg != "--steps" && arg != "--max-cores")
            return usage_error(("unknown argument '" + arg + "'").c_str());
        if (!value) return usage_error((arg + " needs a value").c_str());
        // A second value would silently replace the first.
        if (std::find(seen.begin(), seen.end(), arg) != seen.end())
            return usage_error((arg + " is given twice").c_str());
        seen.push_back(arg);
        ++i;
        if (arg == "--output") {
            a.output = value;
        } else if (arg == "--elements") {
            // Smaller buffers would fit in the caches and measure them, not memory.
            if (!parse_count(value, size_t(1) << 34, n) || n < kMinElements)
                return usage_error("--elements takes a count from 16777216 (16 Mi) to 2^34");
            a.elements = n;
        } else if (arg == "--steps") {
            if (!parse_count(value, 1000, n)) return usage_error("--steps takes 1 to 1000");
            a.steps = static_cast<unsigned>(n);
        } else {
            if (!parse_count(value, 4096, n)) return usage_error("--max-cores takes 1 to 4096");
            a.max_cores = static_cast<unsigned>(n);
        }
    }
    if (a.output.empty()) return usage_error("--output FILE is required");
    return 0;
}

// The profile is written only after minutes of measuring: find out first whether it can be, and
// where. It replaces its file by renaming a new one over it: over a symbolic link that would
// replace the link and leave the file it names (a profile kept elsewhere, linked from /etc/slurm)
// as it was, and over a device or a pipe (/dev/stdout, /dev/null) the device node itself.
bool output_writable(TuneArgs &a) {
    const char *output = a.output.c_str();
    a.target = a.output;
    struct stat st {};
    // What it leads to first: /dev/stdout's link names a pipe that realpath cannot resolve
    if (stat(output, &st) == 0 && !S_ISREG(st.st_mode)) {
        std::fprintf(stderr, "zenbind: tune: --output %s is %s\n", output,
                     S_ISDIR(st.st_mode) ? "a directory" : "not a regular file");
        return false;
    }
    if (lstat(output, &st) == 0 && S_ISLNK(st.st_mode)) {
        char *real = realpath(output, nullptr);
        if (!real) {
            std::fprintf(stderr,
                         "zenbind: tune: --output %s: cannot follow its symbolic link: %s\n",
                         output, std::strerror(errno));
            return false;
        }
        a.target = real;
        std::free(real);
    }
    // The file the profile is written to before its rename, made and removed now: a test of
    // the directory's permissions alone passes for root where the file cannot be made (/proc, a
    // read-only or full file system)
    const std::string tmp = a.target + ".tmp." + std::to_string(getpid());
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        std::fprintf(stderr, "zenbind: tune: cannot write %s: cannot create %s: %s\n", output,
                     tmp.c_str(), std::strerror(errno));
        return false;
    }
    close(fd);
    unlink(tmp.c_str());
    return true;
}

// The 1-minute load average: on a node that is not idle, another job's memory traffic lowers
// what the optimizer gets and moves the saturation point.
double load_average() {
    double load = 0;
    if (FILE *f = std::fopen("/proc/loadavg", "r")) {
        if (std::fscanf(f, "%lf", &load) != 1) load = 0;
        std::fclose(f);
    }
    return load;
}

constexpr double kBusyLoad = 0.5;

// One CPU (the first allowed hardware thread) of each physical core of `node`.
std::vector<unsigned> node_core_cpus(hwloc_topology_t topo, hwloc_obj_t node,
                                     hwloc_const_cpuset_t allowed) {
    std::vector<unsigned> cpus;
    const int depth = hwloc_get_type_or_below_depth(topo, HWLOC_OBJ_CORE);
    for (hwloc_obj_t core = hwloc_get_next_obj_by_depth(topo, depth, nullptr); core;
         core = hwloc_get_next_obj_by_depth(topo, depth, core)) {
        if (!hwloc_bitmap_isincluded(core->cpuset, node->cpuset)) continue;
        hwloc_bitmap_t mine = hwloc_bitmap_dup(core->cpuset);
        hwloc_bitmap_and(mine, mine, allowed);
        const int first = hwloc_bitmap_first(mine);
        hwloc_bitmap_free(mine);
        if (first >= 0) cpus.push_back(static_cast<unsigned>(first));
    }
    return cpus;
}

// Bytes of the last-level caches that serve `node`'s CPUs.
size_t node_cache_bytes(hwloc_topology_t topo, hwloc_obj_t node) {
    size_t bytes = 0;
    for (hwloc_obj_type_t t : {HWLOC_OBJ_L3CACHE, HWLOC_OBJ_L2CACHE}) {
        for (hwloc_obj_t c = hwloc_get_next_obj_by_type(topo, t, nullptr); c;
             c = hwloc_get_next_obj_by_type(topo, t, c))
            if (c->cpuset && hwloc_bitmap_intersects(c->cpuset, node->cpuset))
                bytes += c->attr->cache.size;
        if (bytes) break;
    }
    return bytes;
}

// fp32 Adam state on one NUMA node; pages placed there by libnuma and touched by pinned threads.
class NodeBuffers {
  public:
    NodeBuffers(size_t n, unsigned node) : n_(n) {
        for (float *&p : arrays_) {
            p = static_cast<float *>(numa_alloc_onnode(n * sizeof(float), static_cast<int>(node)));
            if (!p) throw std::bad_alloc();
        }
    }
    ~NodeBuffers() {
        for (float *p : arrays_)
            numa_free(p, n_ * sizeof(float));
    }
    NodeBuffers(const NodeBuffers &) = delete;
    NodeBuffers &operator=(const NodeBuffers &) = delete;

    zb::opt::AdamTensor tensor(const zb::opt::AdamHyper *hyper) const {
        zb::opt::AdamTensor t;
        t.param = arrays_[0];
        t.grad = arrays_[1];
        t.exp_avg = arrays_[2];
        t.exp_avg_sq = arrays_[3];
        t.n = n_;
        t.hyper = hyper;
        return t;
    }
    size_t size() const { return n_; }
    float *array(int i) const { return arrays_[i]; }

  private:
    size_t n_;
    float *arrays_[4] = {};
};

// Bytes of `node` the buffers may take without the OOM killer ending a process of the node's
// (another job's, on a node tuned while in use): its free memory and the file pages it can drop
// first (MemFree + Inactive(file) in sysfs' node meminfo), or less if the memory cgroup of this
// process (a job's, under srun) has less headroom; `why` says which bound. SIZE_MAX when the
// node's meminfo cannot be read (a kernel without it: no bound known).
size_t node_room(unsigned node, std::string &why) {
    char path[96];
    std::snprintf(path, sizeof path, "/sys/devices/system/node/node%u/meminfo", node);
    size_t room = SIZE_MAX;
    if (FILE *f = std::fopen(path, "r")) {
        unsigned long long kb = 0, free_kb = 0, inactive_kb = 0;
        char line[256], name[64];
        unsigned id = 0;
        int found = 0;
        while (std::fgets(line, sizeof line, f))
            if (std::sscanf(line, "Node %u %63s %llu", &id, name, &kb) == 3) {
                if (!std::strcmp(name, "MemFree:")) free_kb = kb, found |= 1;
                if (!std::strcmp(name, "Inactive(file):")) inactive_kb = kb, found |= 2;
            }
        std::fclose(f);
        if (found == 3) {
            room = static_cast<size_t>((free_kb + inactive_kb) << 10);
            why = "free memory and reclaimable page cache of node " + std::to_string(node);
        }
    }
    uint64_t headroom = 0;
    char source[256] = "";
    if (zb_cgroup_memory_headroom(nullptr, 0, &headroom, nullptr, nullptr, source, sizeof source) ==
            ZB_OK &&
        headroom < room) {
        room = static_cast<size_t>(headroom);
        why = std::string("headroom under the memory cgroup limit of ") + source;
    }
    return room;
}

// Whether `elements` of fp32 Adam state fit on `node`, saying why not. A margin stays for the
// rest of the process and the kernel.
bool fits(size_t elements, unsigned node) {
    constexpr size_t kMargin = size_t(64) << 20;
    std::string why;
    const size_t room = node_room(node, why);
    const size_t need = elements * 16;
    if (room == SIZE_MAX || (room > kMargin && need <= room - kMargin)) return true;
    const size_t most = room > kMargin ? (room - kMargin) / 16 : 0;
    std::fprintf(stderr,
                 "zenbind: tune: %zu elements need %zu MiB on node %u, which has %zu MiB to give "
                 "(%s): ",
                 elements, need >> 20, node, room >> 20, why.c_str());
    if (most >= kMinElements)
        std::fprintf(stderr, "give --elements %zu or fewer\n", most);
    else
        std::fprintf(stderr, "tuning needs at least %zu MiB there\n",
                     (kMinElements * 16 + kMargin) >> 20);
    return false;
}

void pin_self(unsigned cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

// Throughput in GB/s of the Adam step on cpus[0..count), median of `steps` timed steps; `team`
// is the number of threads OpenMP gave (fewer than `count` under OMP_THREAD_LIMIT, for one).
double measure(const NodeBuffers &buf, const std::vector<unsigned> &cpus, unsigned count,
               unsigned steps, unsigned &team) {
    zb::opt::AdamHyper hyper;
    hyper.weight_decay = 0.01f;
    const zb::opt::AdamTensor tensor = buf.tensor(&hyper);
    zb::opt::AdamBatch batch;
    batch.tensors = &tensor;
    batch.count = 1;
    std::vector<double> seconds;
    zb::opt::TeamShare share;
    for (unsigned s = 0; s <= steps; ++s) { // step 0 warms up
        hyper.step = s + 1;
        const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(static_cast <int>(count))
        {
            if (omp_get_thread_num() == 0) team = static_cast<unsigned>(omp_get_num_threads());
            pin_self(cpus[static_cast<size_t>(omp_get_thread_num())]);
            zb::opt::adam_step_in_team(batch, share);
        }
        const auto t1 = std::chrono::steady_clock::now();
        if (s > 0) seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    std::sort(seconds.begin(), seconds.end());
    const double median = seconds[seconds.size() / 2];
    return static_cast<double>(buf.size() * kBytesPerElement) / median / 1e9;
}

void first_touch(const NodeBuffers &buf, const std::vector<unsigned> &cpus) {
    const size_t n = buf.size();
#pragma omp parallel num_threads(static_cast <int>(cpus.size()))
    {
        pin_self(cpus[static_cast<size_t>(omp_get_thread_num())]);
#pragma omp for schedule(static)
        for (size_t i = 0; i < n; ++i) {
            buf.array(0)[i] = 1.0f;
            buf.array(1)[i] = 1e-3f;
            buf.array(2)[i] = 0.0f;
            buf.array(3)[i] = 0.0f;
        }
    }
}

struct NodeResult {
    unsigned node;
    std::vector<unsigned> cpus;
    std::vector<double> gbps;
    size_t elements;
};

// Why the measurements cannot be trusted ("" when they can).
struct Trust {
    std::string why;
    void distrust(const std::string &reason) {
        std::fprintf(stderr, "zenbind: tune: warning: %s\n", reason.c_str());
        if (why.empty()) why = reason;
    }
};

// Memory bandwidth does not fall when cores are added to a stream on an idle node: a drop says
// that something else used the node meanwhile.
void check_monotonic(const NodeResult &r, Trust &trust) {
    double best = 0;
    for (size_t c = 0; c < r.gbps.size(); ++c) {
        if (best > 0 && r.gbps[c] < 0.9 * best) {
            char why[200];
            std::snprintf(why, sizeof why,
                          "node %u: %.1f GB/s on %zu cores after %.1f GB/s on fewer: another job "
                          "probably used the node",
                          r.node, r.gbps[c], c + 1, best);
            trust.distrust(why);
            return;
        }
        best = std::max(best, r.gbps[c]);
    }
}

// `path` as an absolute one, as profile= takes it: the working directory before a relative one
// (links are kept, not resolved).
std::string absolute(const std::string &path) {
    if (!path.empty() && path[0] == '/') return path;
    char *cwd = getcwd(nullptr, 0);
    const std::string out = cwd ? std::string(cwd) + "/" + path : path;
    std::free(cwd);
    return out;
}

int run(const TuneArgs &a) {
    zb_topology_t *topology = nullptr;
    hwloc_bitmap_t allowed = hwloc_bitmap_alloc();
    zb_profile_t *profile = nullptr;
    int rc = 1;
    std::vector<NodeResult> results;
    Trust trust;
    if (const double load = load_average(); load >= kBusyLoad) {
        char why[160];
        std::snprintf(why, sizeof why,
                      "the node is not idle (load average %.2f): the figures will be low and the "
                      "saturation point unreliable",
                      load);
        trust.distrust(why);
    }
    if (zb::cli::this_process_cpus(zb_cpuset_from_hwloc(allowed), nullptr, 0) != 0) {
        // (said) the figures of the cores OpenMP left this process would be a profile's
    } else if (numa_available() < 0) {
        std::fprintf(stderr, "zenbind: tune: libnuma reports no NUMA support on this machine\n");
    } else if (zb_topology_load(&topology) != ZB_OK || zb_profile_create(&profile) != ZB_OK) {
        std::fprintf(stderr, "zenbind: tune: %s\n", zb_last_error());
    } else {
        hwloc_topology_t topo = zb_topology_hwloc(topology);
        omp_set_dynamic(0); // every thread asked for, or none of the figures mean what they say
        rc = 0;
        for (hwloc_obj_t node = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, nullptr);
             node && rc == 0; node = hwloc_get_next_obj_by_type(topo, HWLOC_OBJ_NUMANODE, node)) {
            std::vector<unsigned> cpus = node_core_cpus(topo, node, allowed);
            if (cpus.empty()) continue; // memory-only node, or none of its CPUs are ours
            if (a.max_cores && cpus.size() > a.max_cores) cpus.resize(a.max_cores);
            size_t elements = a.elements;
            if (!elements) elements = std::max(kMinElements, 4 * node_cache_bytes(topo, node) / 16);
            NodeResult r{node->os_index, cpus, {}, elements};
            if (!a.json)
                std::fprintf(stderr, "zenbind: tune: node %u, %zu cores, %zu elements (%.0f MiB)\n",
                             r.node, cpus.size(), elements,
                             static_cast<double>(elements * 16) / (1 << 20));
            if (!fits(elements, r.node)) {
                rc = 1;
                break;
            }
            NodeBuffers buf(elements, r.node);
            first_touch(buf, cpus);
            const auto started = std::chrono::steady_clock::now();
            for (unsigned c = 1; c <= cpus.size(); ++c) {
                unsigned team = 0;
                r.gbps.push_back(measure(buf, cpus, c, a.steps, team));
                if (team != c) {
                    // The figure would be that of fewer cores, and the saturation point wrong.
                    std::fprintf(stderr,
                                 "zenbind: tune: OpenMP ran %u threads where %u cores were to be "
                                 "measured (OMP_THREAD_LIMIT, OMP_MAX_ACTIVE_LEVELS?); unset "
                                 "them or give --max-cores %u\n",
                                 team, c, team);
                    rc = 1;
                    break;
                }
                // Every core count runs the same steps, and more cores take no longer: the mean
                // time per count so far bounds what the counts left take.
                const double spent =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
                        .count();
                std::fprintf(stderr, "  node %u: %3u/%zu cores  %8.2f GB/s  (about %.0f s left)\n",
                             r.node, c, cpus.size(), r.gbps.back(),
                             spent / c * double(cpus.size() - c));
            }
            if (rc != 0) break;
            check_monotonic(r, trust);
            if (zb_profile_add_node(profile, r.node, r.gbps.data(),
                                    static_cast<unsigned>(r.gbps.size())) != ZB_OK) {
                std::fprintf(stderr, "zenbind: tune: %s\n", zb_last_error());
                rc = 1;
            }
            results.push_back(std::move(r));
        }
        if (rc == 0 && results.empty()) {
            std::fprintf(stderr, "zenbind: tune: no NUMA node holds an allowed CPU\n");
            rc = 1;
        }
        if (rc == 0 && zb_profile_save(profile, a.target.c_str()) != ZB_OK) {
            std::fprintf(stderr, "zenbind: tune: %s\n", zb_last_error());
            rc = 1;
        }
    }
    if (rc == 0) {
        if (a.json) {
            std::printf("{\"profile\": %s, \"isa\": \"%s\", \"trusted\": %s, \"nodes\": [",
                        zb::cli::json_string(absolute(a.output)).c_str(),
                        zb::opt::isa_name(zb::opt::active_isa()),
                        trust.why.empty() ? "true" : "false");
            for (size_t i = 0; i < results.size(); ++i) {
                const NodeResult &r = results[i];
                std::printf("%s{\"node\": %u, \"elements\": %zu, \"saturate\": %u, \"gb_per_s\": [",
                            i ? ", " : "", r.node, r.elements,
                            zb_profile_saturation(profile, r.node));
                for (size_t c = 0; c < r.gbps.size(); ++c)
                    std::printf("%s%.3f", c ? ", " : "", r.gbps[c]);
                std::printf("]}");
            }
            std::printf("]}\n");
        } else {
            std::printf("%-6s %-8s %-10s %s\n", "node", "cores", "saturate", "best GB/s");
            for (const NodeResult &r : results)
                std::printf("%-6u %-8zu %-10u %.2f\n", r.node, r.cpus.size(),
                            zb_profile_saturation(profile, r.node),
                            *std::max_element(r.gbps.begin(), r.gbps.end()));
            std::printf("profile written to %s\n", absolute(a.output).c_str());
            if (!trust.why.empty())
                std::printf("NOT TRUSTWORTHY: %s; measure again on an idle node\n",
                            trust.why.c_str());
        }
    }
    zb_profile_free(profile);
    zb_topology_free(topology);
    hwloc_bitmap_free(allowed);
    return rc;
}

} // namespace

int zb_cli_tune(int argc, char **argv) {
    TuneArgs a;
    if (int rc = parse_args(argc, argv, a)) return rc;
    if (!output_writable(a)) return 1;
    try {
        return run(a);
    } catch (const std::bad_alloc &) {
        std::fprintf(stderr, "zenbind: tune: cannot allocate the node-local buffers; try a "
                             "smaller --elements\n");
        return 1;
    }
}
