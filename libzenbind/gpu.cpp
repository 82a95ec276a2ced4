// The node's GPUs and the NUMA node each sits on: from an admin's map file, or discovered under
// a file-system root (the NVIDIA driver's /proc entries, else sysfs PCI functions), so that tests
// and containers can point it at another tree, as the cgroup reader does.
#include "gpu_map.hpp"

#include "bitmap.hpp"
#include "cpulist.hpp"
#include "error.hpp"
#include "text_file.hpp"

#include <dirent.h>

#include <algorithm>
#include <charconv>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

struct zb_gpus {
    struct Gpu {
        unsigned index = 0;
        int node = -1;
        std::string bus;
        zb::Bitmap cpus;
    };
    std::vector<Gpu> gpus; // in index order
    std::string source;
};

namespace {

// Far above any sysfs or /proc/driver file, low enough to bound a hostile tree.
constexpr size_t max_file = 64 * 1024;

std::string trimmed(std::string_view s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t'))
        s.remove_suffix(1);
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
        s.remove_prefix(1);
    return std::string(s);
}

std::vector<std::string> entries(const std::string &dir) {
    std::vector<std::string> names;
    std::unique_ptr<DIR, int (*)(DIR *)> d(opendir(dir.c_str()), closedir);
    if (!d) return names;
    while (const dirent *e = readdir(d.get()))
        if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    std::sort(names.begin(), names.end());
    return names;
}

std::optional<long> hex_or_decimal(const std::string &text) {
    std::string_view v = text;
    int base = 10;
    if (v.substr(0, 2) == "0x") {
        v.remove_prefix(2);
        base = 16;
    }
    long value = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), value, base);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size()) return std::nullopt;
    return value;
}

// numa_node and local_cpulist of a PCI function, when sysfs has them.
void pci_locality(const std::string &sysfs_dev, zb_gpus::Gpu &gpu) {
    if (const auto node = zb::read_text_file(sysfs_dev + "/numa_node", max_file)) {
        const auto value = hex_or_decimal(trimmed(*node));
        if (!value || *value < -1 || *value > ZB_CPULIST_MAX_ID)
            zb::fail(ZB_ESYS, "unexpected content in " + sysfs_dev + "/numa_node");
        gpu.node = static_cast<int>(*value);
    }
    if (const auto cpus = zb::read_text_file(sysfs_dev + "/local_cpulist", max_file))
        zb::parse_cpulist(*cpus, gpu.cpus, sysfs_dev + "/local_cpulist");
}

// "Device Minor:  3" and "Bus Location:  0000:07:00.0" of the driver's information file.
std::optional<std::string> field(const std::string &text, std::string_view name) {
    size_t begin = 0;
    while (begin < text.size()) {
        size_t end = text.find('\n', begin);
        if (end == std::string::npos) end = text.size();
        const std::string_view line(text.data() + begin, end - begin);
        const size_t colon = line.find(':');
        if (colon != std::string_view::npos && trimmed(line.substr(0, colon)) == name)
            return trimmed(line.substr(colon + 1));
        begin = end + 1;
    }
    return std::nullopt;
}

std::string lower(std::string s) {
    for (char &c : s)
        if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');
    return s;
}

// NVIDIA's driver: one directory per GPU, named by its bus id. GPU i is the i-th in bus order, as
// NVML, nvidia-smi, CUDA (PCI_BUS_ID, and FASTEST_FIRST among alike GPUs) and Slurm number them:
// SLURM_STEP_GPUS holds the position in slurmd's device list, which AutoDetect sorts by its links,
// "a stand-in for PCI bus ID order" (gres_gpu.c), and never the device minor, which the driver
// may hand out in another order. A GPU the driver was told to exclude is not counted, as NVML
// does not count it. With MIG instances Slurm numbers the slices instead: refused (gpumap=).
bool from_nvidia(const std::string &root, zb_gpus &out) {
    const std::string dir = root + "/proc/driver/nvidia/gpus";
    const std::string caps = root + "/proc/driver/nvidia/capabilities";
    for (const std::string &gpu : entries(caps))
        for (const std::string &instance : entries(caps + "/" + gpu + "/mig"))
            if (gpu.rfind("gpu", 0) == 0 && instance.rfind("gi", 0) == 0)
                zb::fail(ZB_ENOENT, "MIG instances on this node (" + caps + "/" + gpu + "/mig/" +
                                        instance +
                                        "): Slurm numbers their slices, not the GPUs; a gpumap= "
                                        "of the slices places them");
    std::vector<zb_gpus::Gpu> found;
    for (const std::string &name : entries(dir)) {
        const std::string file = dir + "/" + name + "/information";
        const auto text = zb::read_text_file(file, max_file);
        if (!text) continue;
        const auto excluded = field(*text, "GPU Excluded");
        if (excluded && !excluded->empty() &&
            (excluded->front() == 'Y' || excluded->front() == 'y'))
            continue;
        zb_gpus::Gpu gpu;
        gpu.bus = lower(field(*text, "Bus Location").value_or(name));
        pci_locality(root + "/sys/bus/pci/devices/" + gpu.bus, gpu);
        found.push_back(std::move(gpu));
    }
    std::stable_sort(found.begin(), found.end(),
                     [](const auto &a, const auto &b) { return a.bus < b.bus; });
    if (found.size() > ZB_GPU_MAX_INDEX + 1u)
        zb::fail(ZB_ESYS, "more than " + std::to_string(ZB_GPU_MAX_INDEX + 1) + " GPUs in " + dir);
    for (size_t i = 0; i < found.size(); ++i)
        found[i].index = static_cast<unsigned>(i);
    out.gpus = std::move(found);
    out.source = dir;
    return !out.gpus.empty();
}

// Display-class PCI functions (class 0x03xxxx) of NVIDIA and AMD, in bus order: a server's BMC
// VGA (ASPEED, Matrox) is display-class too, so the vendor decides.
bool from_sysfs(const std::string &root, zb_gpus &out) {
    const std::string dir = root + "/sys/bus/pci/devices";
    for (const std::string &name : entries(dir)) {
        const std::string dev = dir + "/" + name;
        const auto cls = zb::read_text_file(dev + "/class", max_file);
        const auto vendor = zb::read_text_file(dev + "/vendor", max_file);
        if (!cls || !vendor) continue;
        const auto c = hex_or_decimal(trimmed(*cls)), v = hex_or_decimal(trimmed(*vendor));
        if (!c || !v || (*c >> 16) != 0x03 || (*v != 0x10de && *v != 0x1002)) continue;
        if (out.gpus.size() > ZB_GPU_MAX_INDEX)
            zb::fail(ZB_ESYS,
                     "more than " + std::to_string(ZB_GPU_MAX_INDEX + 1) + " GPUs in " + dir);
        zb_gpus::Gpu gpu;
        gpu.index = static_cast<unsigned>(out.gpus.size());
        gpu.bus = lower(name);
        pci_locality(dev, gpu);
        out.gpus.push_back(std::move(gpu));
    }
    out.source = dir;
    return !out.gpus.empty();
}

std::unique_ptr<zb_gpus> load(const char *fsroot, const char *map) {
    auto gpus = std::make_unique<zb_gpus>();
    if (map && *map) {
        for (const zb::MapEntry &e :
             zb::parse_gpu_map(zb::require_text_file(map, zb::max_map_bytes), map)) {
            zb_gpus::Gpu gpu;
            gpu.index = e.index;
            gpu.node = static_cast<int>(e.node);
            gpu.bus = e.bus;
            gpus->gpus.push_back(std::move(gpu));
        }
        gpus->source = map;
        if (gpus->gpus.empty())
            zb::fail(ZB_ENOENT, std::string("the GPU map ") + map + " is empty");
    } else {
        std::string root = fsroot ? fsroot : "";
        while (!root.empty() && root.back() == '/')
            root.pop_back();
        if (!from_nvidia(root, *gpus) && !from_sysfs(root, *gpus))
            zb::fail(ZB_ENOENT, "no GPU under " + root + "/proc/driver/nvidia/gpus nor " + root +
                                    "/sys/bus/pci/devices");
    }
    std::sort(gpus->gpus.begin(), gpus->gpus.end(),
              [](const auto &a, const auto &b) { return a.index < b.index; });
    for (size_t i = 1; i < gpus->gpus.size(); ++i)
        if (gpus->gpus[i].index == gpus->gpus[i - 1].index)
            zb::fail(ZB_ESYS, "two GPUs with index " + std::to_string(gpus->gpus[i].index) +
                                  " in " + gpus->source);
    return gpus;
}

void fill(const zb_gpus::Gpu &g, zb_gpu *out) {
    *out = {g.index, g.node, g.bus.c_str(), zb_cpuset_from_hwloc_const(g.cpus)};
}

} // namespace

extern "C" {

zb_status zb_gpus_load(const char *fsroot, const char *map, zb_gpus_t **out) {
    return zb::guard([&] {
        if (!out) zb::fail(ZB_EINVAL, "zb_gpus_load: out is NULL");
        *out = nullptr;
        *out = load(fsroot, map).release();
    });
}

void zb_gpus_free(zb_gpus_t *gpus) {
    delete gpus;
}

unsigned zb_gpus_count(const zb_gpus_t *gpus) {
    return gpus ? static_cast<unsigned>(gpus->gpus.size()) : 0;
}

zb_status zb_gpus_get(const zb_gpus_t *gpus, unsigned i, zb_gpu *out) {
    return zb::guard([&] {
        if (!gpus || !out) zb::fail(ZB_EINVAL, "zb_gpus_get: NULL argument");
        if (i >= gpus->gpus.size())
            zb::fail(ZB_EINVAL, "GPU " + std::to_string(i) + " of " +
                                    std::to_string(gpus->gpus.size()) + " does not exist");
        fill(gpus->gpus[i], out);
    });
}

zb_status zb_gpus_find(const zb_gpus_t *gpus, unsigned index, zb_gpu *out) {
    return zb::guard([&] {
        if (!gpus || !out) zb::fail(ZB_EINVAL, "zb_gpus_find: NULL argument");
        for (const auto &g : gpus->gpus)
            if (g.index == index) return fill(g, out);
        zb::fail(ZB_ENOENT, "no GPU with index " + std::to_string(index) + " in " + gpus->source);
    });
}

const char *zb_gpus_source(const zb_gpus_t *gpus) {
    return gpus ? gpus->source.c_str() : "";
}

zb_status zb_gpus_assign(const char *step_gpus, unsigned ntasks, unsigned *task_gpu) {
    return zb::guard([&] {
        if (!step_gpus || !task_gpu) zb::fail(ZB_EINVAL, "zb_gpus_assign: NULL argument");
        if (ntasks == 0) zb::fail(ZB_EINVAL, "the task count must be at least 1");
        const std::vector<unsigned> list = zb::parse_gpu_list(step_gpus);
        const size_t n = list.size();
        for (size_t i = 0; i < ntasks; ++i)
            task_gpu[i] = n >= ntasks ? list[i * (n / ntasks)] : list[i * n / ntasks];
    });
}
}
