// The cpuset a process's cgroup grants it, for cgroup v1 (a hierarchy with the cpuset
// controller) and v2 (the unified hierarchy, when cpuset is enabled there). The cgroup and the
// mount are both looked up in /proc (under an injectable root for tests), never assumed: hosts
// mount hierarchies in different places, containers mount sub-trees, and hybrid hosts have both
// versions at once.
#include "affinity.hpp"
#include "bitmap.hpp"
#include "cbuf.hpp"
#include "cpulist.hpp"
#include "error.hpp"
#include "text_file.hpp"

#include <cerrno>
#include <optional>
#include <sched.h>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

namespace zb {

namespace {

// Far above any real /proc/PID/mountinfo or cgroup file, low enough to bound a hostile one.
constexpr size_t max_file = 16u << 20;

std::optional<std::string> read_file(const std::string &path) {
    return read_text_file(path, max_file);
}

std::string require_file(const std::string &path) {
    return require_text_file(path, max_file);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
    std::vector<std::string_view> parts;
    size_t begin = 0;
    for (;;) {
        const size_t end = s.find(sep, begin);
        parts.push_back(s.substr(begin, end == std::string_view::npos ? s.npos : end - begin));
        if (end == std::string_view::npos) return parts;
        begin = end + 1;
    }
}

bool has_token(std::string_view list, std::string_view token, char sep) {
    for (std::string_view t : split(list, sep))
        if (t == token) return true;
    return false;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape_octal(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' &&
            s[i + 2] >= '0' && s[i + 2] <= '7' && s[i + 3] >= '0' && s[i + 3] <= '7') {
            out +=
                static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
            i += 3;
        } else {
            out += s[i];
        }
    }
    return out;
}

// Non-empty components of an absolute cgroup path; nothing if it climbs with "..", which
// happens when the cgroup lies outside the reader's cgroup namespace.
std::optional<std::vector<std::string>> components(std::string_view path) {
    std::vector<std::string> out;
    for (std::string_view c : split(path, '/')) {
        if (c.empty() || c == ".") continue;
        if (c == "..") return std::nullopt;
        out.emplace_back(c);
    }
    return out;
}

struct Mount {
    std::vector<std::string> root; // the hierarchy's sub-tree the mount exposes
    std::string point;             // where, as seen from fsroot
    bool noprefix = false;         // v1 mounted with noprefix: "cpus" instead of "cpuset.cpus"
};

enum class Kind { v1_cpuset, v1_memory, v2 };

std::vector<Mount> cgroup_mounts(const std::string &mountinfo, Kind kind) {
    std::vector<Mount> mounts;
    for (std::string_view line : split(mountinfo, '\n')) {
        const size_t dash = line.find(" - ");
        if (dash == std::string_view::npos) continue;
        const auto before = split(line.substr(0, dash), ' ');
        const auto after = split(line.substr(dash + 3), ' ');
        if (before.size() < 5 || after.size() < 3) continue;
        const std::string_view fstype = after[0];
        const std::string_view super = after[2];
        if (kind == Kind::v1_cpuset && !(fstype == "cgroup" && has_token(super, "cpuset", ',')))
            continue;
        if (kind == Kind::v1_memory && !(fstype == "cgroup" && has_token(super, "memory", ',')))
            continue;
        if (kind == Kind::v2 && fstype != "cgroup2") continue;
        auto root = components(unescape_octal(before[3]));
        if (!root) continue;
        mounts.push_back(
            {std::move(*root), unescape_octal(before[4]), has_token(super, "noprefix", ',')});
    }
    return mounts;
}

// The directory of cgroup `path` under one of `mounts` (the first whose sub-tree holds it),
// as the mount's point and the components below it.
struct Located {
    std::string point;
    std::vector<std::string> below;
    bool noprefix;
};

std::optional<Located> locate(const std::vector<Mount> &mounts, std::string_view path) {
    const auto parts = components(path);
    if (!parts) return std::nullopt;
    for (const Mount &m : mounts) {
        if (m.root.size() > parts->size()) continue;
        bool inside = true;
        for (size_t i = 0; i < m.root.size() && inside; ++i)
            inside = m.root[i] == (*parts)[i];
        if (!inside) continue;
        return Located{
            m.point, {parts->begin() + static_cast<long>(m.root.size()), parts->end()}, m.noprefix};
    }
    return std::nullopt;
}

struct Found {
    Bitmap set;
    std::string source;
};

class CpusetReader {
  public:
    CpusetReader(const char *fsroot, pid_t pid) : root_(fsroot ? fsroot : "") {
        while (!root_.empty() && root_.back() == '/')
            root_.pop_back();
        if (pid < 0) fail(ZB_EINVAL, "pid " + std::to_string(pid) + " is negative");
        proc_ = "/proc/" + (pid == 0 ? std::string("self") : std::to_string(pid));
    }

    // Nothing when the process has no cpuset controller (neither v1 nor v2); why_none() says why.
    std::optional<Found> read(unsigned levels_up) {
        const std::string cgroup_file = root_ + proc_ + "/cgroup";
        const std::string mountinfo_file = root_ + proc_ + "/mountinfo";
        const std::string cgroups = require_file(cgroup_file);
        std::optional<std::string> mountinfo;
        const auto mounts = [&](Kind kind) {
            if (!mountinfo) mountinfo = require_file(mountinfo_file);
            return cgroup_mounts(*mountinfo, kind);
        };

        std::optional<std::string_view> v1_path, v2_path;
        for (std::string_view line : split(cgroups, '\n')) {
            const size_t c1 = line.find(':');
            const size_t c2 = c1 == line.npos ? line.npos : line.find(':', c1 + 1);
            if (c2 == line.npos) continue;
            const std::string_view id = line.substr(0, c1);
            const std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
            if (id == "0" && controllers.empty())
                v2_path = line.substr(c2 + 1);
            else if (has_token(controllers, "cpuset", ','))
                v1_path = line.substr(c2 + 1);
        }

        // The kernel binds cpuset to one hierarchy at most, so a v1 cpuset line settles it; a
        // v1 hierarchy this mount namespace cannot see leaves the process without a controller.
        if (v1_path) {
            const auto where = locate(mounts(Kind::v1_cpuset), *v1_path);
            if (!where) {
                why_none_ = "its cgroup v1 cpuset cgroup " + std::string(*v1_path) +
                            " is not under any cpuset mount in " + mountinfo_file;
                return std::nullopt;
            }
            return walk(*where, levels_up,
                        where->noprefix
                            ? std::vector<std::string>{"effective_cpus", "cpus"}
                            : std::vector<std::string>{"cpuset.effective_cpus", "cpuset.cpus"});
        }
        if (!v2_path) {
            why_none_ = cgroup_file + " lists neither a cpuset nor a cgroup v2 hierarchy";
            return std::nullopt;
        }
        const auto where = locate(mounts(Kind::v2), *v2_path);
        if (!where) {
            why_none_ = "its cgroup v2 cgroup " + std::string(*v2_path) +
                        " is not under any cgroup2 mount in " + mountinfo_file;
            return std::nullopt;
        }
        const std::string controllers = root_ + where->point + "/cgroup.controllers";
        const auto enabled = read_file(controllers);
        if (!enabled || !has_cpuset(*enabled)) {
            why_none_ = "cpuset is not enabled in " + controllers;
            return std::nullopt;
        }
        return walk_v2(*where, levels_up);
    }

    const std::string &why_none() const { return why_none_; }

  private:
    static bool has_cpuset(std::string_view controllers) {
        if (!controllers.empty() && controllers.back() == '\n') controllers.remove_suffix(1);
        return has_token(controllers, "cpuset", ' ');
    }

    // The directory `depth` levels below the mount's root, for a cgroup of `where`.
    std::string dir_at(const Located &where, size_t depth) const {
        std::string dir = root_ + where.point;
        for (size_t i = 0; i < depth; ++i)
            dir += "/" + where.below[i];
        return dir;
    }

    // The depth `levels_up` above the cgroup, never above the mount's root.
    size_t start_depth(const Located &where, unsigned levels_up) const {
        if (levels_up > where.below.size())
            fail(ZB_EINVAL, "levels_up=" + std::to_string(levels_up) +
                                " climbs above the cgroup mount " + root_ + where.point +
                                " (the cgroup is " + std::to_string(where.below.size()) +
                                " level(s) below it)");
        return where.below.size() - levels_up;
    }

    Found found_in(const std::string &file, const std::string &text) const {
        Found found;
        parse_cpulist(text, found.set, "cpu list in " + file);
        found.source = file;
        return found;
    }

    static bool blank(const std::string &text) { return text.empty() || text == "\n"; }

    // v1: the first non-empty `names` file from the start level upwards: an empty or absent
    // cpuset means the parent's applies.
    Found walk(const Located &where, unsigned levels_up, const std::vector<std::string> &names) {
        const size_t start = start_depth(where, levels_up);
        for (size_t depth = start;; --depth) {
            for (const std::string &name : names) {
                const std::string file = dir_at(where, depth) + "/" + name;
                const auto text = read_file(file);
                if (!text) continue;
                if (blank(*text)) break;
                return found_in(file, *text);
            }
            if (depth == 0) break;
        }
        fail(ZB_ESYS, "no non-empty " + names.front() + " in " + dir_at(where, start) +
                          " or its ancestors up to the mount " + dir_at(where, 0));
    }

    // v2: the kernel fills cpuset.cpus.effective at every level, so it cannot tell which cgroup
    // confines the process. The set is the effective one of the nearest level that configures
    // cpuset.cpus (every level below inherits it), or of the mount's root when none does; that
    // level is the source, so a caller sees whether a Slurm step's cgroup confines the process
    // or nothing does (Slurm enables the controller without ConstrainCores, leaving it empty).
    Found walk_v2(const Located &where, unsigned levels_up) {
        const size_t start = start_depth(where, levels_up);
        size_t depth = start;
        for (; depth > 0; --depth) {
            const auto cpus = read_file(dir_at(where, depth) + "/cpuset.cpus");
            if (cpus && !blank(*cpus)) break;
        }
        const std::string file = dir_at(where, depth) + "/cpuset.cpus.effective";
        const auto text = read_file(file);
        if (!text || blank(*text))
            fail(ZB_ESYS, "no non-empty cpuset.cpus.effective in " + dir_at(where, depth) +
                              ", the cgroup that confines " + dir_at(where, start));
        return found_in(file, *text);
    }

    std::string root_;
    std::string proc_;
    std::string why_none_;
};

// How much more memory a process's memory cgroup lets it use: at every level from its cgroup up
// to the mount's root that sets a limit, the limit minus the working set (usage less inactive
// file pages, which the kernel reclaims before it would kill), and the least of those.
struct Room {
    uint64_t headroom = 0, limit = 0, in_use = 0;
    std::string source; // the limit file that binds
};

std::optional<uint64_t> read_u64(const std::string &file) {
    const auto text = read_file(file);
    if (!text) return std::nullopt;
    std::string_view v = *text;
    if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
    if (v == "max") return UINT64_MAX;
    uint64_t value = 0;
    if (v.empty()) fail(ZB_ESYS, "empty " + file);
    for (char c : v) {
        if (c < '0' || c > '9' || value > (UINT64_MAX - 9) / 10)
            fail(ZB_ESYS, "unexpected content in " + file + ": " + std::string(v.substr(0, 32)));
        value = value * 10 + static_cast<uint64_t>(c - '0');
    }
    return value;
}

uint64_t stat_field(const std::string &file, std::string_view name) {
    const auto text = read_file(file);
    if (!text) return 0;
    for (std::string_view line : split(*text, '\n')) {
        const size_t sp = line.find(' ');
        if (sp == std::string_view::npos || line.substr(0, sp) != name) continue;
        uint64_t value = 0;
        for (char c : line.substr(sp + 1))
            if (c >= '0' && c <= '9') value = value * 10 + static_cast<uint64_t>(c - '0');
        return value;
    }
    return 0;
}

std::optional<Room> memory_room(const std::string &root, pid_t pid, std::string &why_none) {
    const std::string proc =
        root + "/proc/" + (pid == 0 ? std::string("self") : std::to_string(pid));
    const std::string cgroups = require_file(proc + "/cgroup");
    std::optional<std::string_view> v1_path, v2_path;
    for (std::string_view line : split(cgroups, '\n')) {
        const size_t c1 = line.find(':');
        const size_t c2 = c1 == line.npos ? line.npos : line.find(':', c1 + 1);
        if (c2 == line.npos) continue;
        const std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
        if (line.substr(0, c1) == "0" && controllers.empty())
            v2_path = line.substr(c2 + 1);
        else if (has_token(controllers, "memory", ','))
            v1_path = line.substr(c2 + 1);
    }
    const std::string mountinfo = require_file(proc + "/mountinfo");
    const bool v1 = v1_path.has_value();
    if (!v1 && !v2_path) {
        why_none = "no memory cgroup in " + proc + "/cgroup";
        return std::nullopt;
    }
    const auto where =
        locate(cgroup_mounts(mountinfo, v1 ? Kind::v1_memory : Kind::v2), v1 ? *v1_path : *v2_path);
    if (!where) {
        why_none = "its memory cgroup is not under any mount in " + proc + "/mountinfo";
        return std::nullopt;
    }
    // v1 reports "unlimited" as a huge page-rounded number.
    constexpr uint64_t unlimited = uint64_t(1) << 62;
    std::optional<Room> best;
    for (size_t depth = where->below.size() + 1; depth-- > 0;) {
        std::string dir = root + where->point;
        for (size_t i = 0; i < depth; ++i)
            dir += "/" + where->below[i];
        const std::string limit_file = dir + (v1 ? "/memory.limit_in_bytes" : "/memory.max");
        const auto limit = read_u64(limit_file);
        if (!limit || *limit >= unlimited) continue;
        const auto usage = read_u64(dir + (v1 ? "/memory.usage_in_bytes" : "/memory.current"));
        if (!usage) continue;
        const uint64_t inactive =
            stat_field(dir + "/memory.stat", v1 ? "total_inactive_file" : "inactive_file");
        const uint64_t in_use = *usage > inactive ? *usage - inactive : 0;
        const uint64_t headroom = *limit > in_use ? *limit - in_use : 0;
        if (!best || headroom < best->headroom) best = Room{headroom, *limit, in_use, limit_file};
    }
    if (!best) why_none = "no memory limit on its cgroup or above it";
    return best;
}

} // namespace

} // namespace zb

extern "C" {

zb_status zb_cgroup_cpuset(const char *fsroot, pid_t pid, unsigned levels_up, zb_cpuset_t *out,
                           char *source, size_t source_len) {
    return zb::guard([&] {
        if (!out) zb::fail(ZB_EINVAL, "zb_cgroup_cpuset: out is NULL");
        zb::CpusetReader reader(fsroot, pid);
        auto found = reader.read(levels_up);
        if (!found)
            zb::fail(ZB_ENOENT,
                     "no cpuset controller for " +
                         (pid == 0 ? std::string("this process") : "pid " + std::to_string(pid)) +
                         ": " + reader.why_none());
        if (hwloc_bitmap_copy(zb_cpuset_hwloc(out), found->set) != 0) throw std::bad_alloc();
        zb::copy_to_buffer(found->source, source, source_len);
    });
}

zb_status zb_allowed_cpus(const char *fsroot, pid_t pid, zb_cpuset_t *out, char *source,
                          size_t source_len) {
    return zb::guard([&] {
        if (!out) zb::fail(ZB_EINVAL, "zb_allowed_cpus: out is NULL");
        zb::CpusetReader reader(fsroot, pid);
        auto found = reader.read(0);
        zb::Bitmap allowed;
        zb::process_affinity(pid, allowed);
        if (found) hwloc_bitmap_and(allowed, allowed, found->set);
        if (hwloc_bitmap_copy(zb_cpuset_hwloc(out), allowed) != 0) throw std::bad_alloc();
        zb::copy_to_buffer(found ? found->source : "sched_getaffinity", source, source_len);
    });
}

zb_status zb_cgroup_memory_headroom(const char *fsroot, pid_t pid, uint64_t *headroom,
                                    uint64_t *limit, uint64_t *in_use, char *source,
                                    size_t source_len) {
    return zb::guard([&] {
        if (!headroom) zb::fail(ZB_EINVAL, "zb_cgroup_memory_headroom: headroom is NULL");
        if (pid < 0) zb::fail(ZB_EINVAL, "pid " + std::to_string(pid) + " is negative");
        std::string root = fsroot ? fsroot : "";
        while (!root.empty() && root.back() == '/')
            root.pop_back();
        std::string why;
        const auto room = zb::memory_room(root, pid, why);
        if (!room) zb::fail(ZB_ENOENT, "no memory limit applies: " + why);
        *headroom = room->headroom;
        if (limit) *limit = room->limit;
        if (in_use) *in_use = room->in_use;
        zb::copy_to_buffer(room->source, source, source_len);
    });
}
}
