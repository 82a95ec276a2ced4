#include "picture.hpp"

#include "common.hpp"

#include <zenbind/hwloc.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

extern char **environ;

namespace zb::cli {
namespace {

// A light shade for training and a dark one for the optimizer, per task, cycling; the names go
// into the legend (lstopo's legend is text only).
struct Colours {
    const char *name, *light, *dark;
};
constexpr Colours kPalette[] = {
    {"green", "#b7e4a7", "#3f8f2f"},  {"blue", "#a9c8f0", "#2f5f9f"},
    {"orange", "#f8cf9a", "#c06a10"}, {"purple", "#d2b4ea", "#6f3f9f"},
    {"teal", "#a4e0dc", "#1f7f78"},   {"red", "#f2aaaa", "#a52a2a"},
    {"olive", "#dede9a", "#7a7a1f"},  {"pink", "#f4b6d8", "#a8326f"},
};

// lstopo reads an object's colours from its "lstopoStyle" info.
void colour(hwloc_topology_t topo, const zb_cpuset_t *cpus, const char *background) {
    const std::string style = std::string("Background=") + background;
    for (int cpu = zb_cpuset_next(cpus, -1); cpu >= 0; cpu = zb_cpuset_next(cpus, cpu))
        if (hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(topo, static_cast<unsigned>(cpu)))
            hwloc_obj_add_info(pu, "lstopoStyle", style.c_str());
}

int run_lstopo(const std::vector<std::string> &args) {
    std::vector<char *> argv;
    for (const std::string &a : args)
        argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int err = posix_spawnp(&pid, "lstopo", nullptr, nullptr, argv.data(), environ);
    if (err != 0) return -err;
    int status = 0;
    pid_t got;
    while ((got = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    if (got < 0) return 128; // lost the child: no success to report
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

} // namespace

const char *picture_format(const std::string &file) {
    const auto ends_with = [&](const char *suffix) {
        const size_t n = std::strlen(suffix);
        return file.size() > n && file.compare(file.size() - n, n, suffix) == 0 &&
               file[file.size() - n - 1] != '/';
    };
    // The native SVG keeps text as text (searchable, and what the tests read).
    return ends_with(".svg") ? "nativesvg" : ends_with(".png") ? "png" : nullptr;
}

bool draw_plan(zb_topology_t *topology, const zb_plan_t *plan, const std::string &file,
               std::string &error) {
    const char *format = picture_format(file);
    if (!format) {
        error = "--picture " + file + ": the name must be NAME.svg or NAME.png";
        return false;
    }
    hwloc_topology_t topo = zb_topology_hwloc(topology);
    // Every core drawn: lstopo would otherwise fold identical ones into "16x total".
    std::vector<std::string> args = {
        "lstopo", "--of", format, "--no-factorize", "--no-default-legend", "--force"};
    const unsigned n = zb_plan_ntasks(plan);
    for (unsigned i = 0; i < n; ++i) {
        zb_task_plan t;
        if (zb_plan_task(plan, i, &t) != ZB_OK) continue;
        const Colours &c = kPalette[i % (sizeof kPalette / sizeof *kPalette)];
        colour(topo, t.train_cpus, c.light);
        colour(topo, t.opt_cpus, c.dark);
        std::string line = "task " + std::to_string(i) + ": training " + cpulist(t.train_cpus) +
                           " (light " + c.name + ")";
        if (zb_cpuset_weight(t.opt_cpus) != 0)
            line += ", optimizer " + cpulist(t.opt_cpus) + " (dark " + c.name + ")";
        args.insert(args.end(), {"--append-legend", line});
    }
    const char *tmpdir = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/zenbind-plan-XXXXXX.xml";
    std::vector<char> xml_buf(pattern.begin(), pattern.end());
    xml_buf.push_back('\0');
    char *xml = xml_buf.data();
    const int fd = mkstemps(xml, 4);
    if (fd < 0) {
        error = std::string("cannot create a temporary file: ") + std::strerror(errno);
        return false;
    }
    close(fd);
    const bool exported = hwloc_topology_export_xml(topo, xml, 0) == 0;
    args.insert(args.end(), {"--input", xml, file});
    const int rc = exported ? run_lstopo(args) : 1;
    unlink(xml);
    if (!exported) {
        error = "cannot export the topology for lstopo";
    } else if (rc == -ENOENT) {
        error = "--picture needs lstopo (Debian's hwloc package)";
    } else if (rc != 0) {
        error = "lstopo failed to draw " + file + " (exit status " + std::to_string(rc) + ")";
    }
    return error.empty();
}

} // namespace zb::cli
