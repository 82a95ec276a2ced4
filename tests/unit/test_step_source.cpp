// Which source holds a step's CPUs (spank_plugin/stepd_step_source.cpp), for what
// zb_cgroup_cpuset() reports under each TaskPlugin, cgroup version and naming of the job's cgroup:
// first the decision alone, then on fake cgroup trees of each layout Slurm makes (v1; v2 with job
// ids; v2 with SLUIDs, Slurm 26.05's default), read by libzenbind as the plugin reads them. No
// Slurm needed.
#include "stepd_step_source.hpp"

#include "spank_api.hpp"

#include <cstdarg>
#include <cstddef>
#include <fstream>
#include <setjmp.h>
#include <sstream>

extern "C" {
#include <cmocka.h>
}

#define ZB_FAKE_TREE_NAME "zb_step_source"
#include "fake_tree.h"

namespace {

using zb::spank::step_source;
using zb::spank::StepSource;
using zb::spank::task_cgroup;

constexpr const char *v1_task = "/slurm/uid_0/job_42/step_3/task_0";
constexpr const char *v2_task = "/system.slice/n1_slurmstepd.scope/job_42/step_3/user/task_0";
constexpr const char *sluid_task =
    "/system.slice/n1_slurmstepd.scope/sDB9M88G5WN700/step_3/user/task_0";

int source(zb_status status, const char *file, const char *cgroup, uint32_t step = 3) {
    return static_cast<int>(step_source(status, file, cgroup, step));
}

constexpr int own = static_cast<int>(StepSource::step_cgroup);
constexpr int above = static_cast<int>(StepSource::step_cgroup_above);
constexpr int alloc = static_cast<int>(StepSource::alloc_cores);
constexpr int failed = static_cast<int>(StepSource::failed);

void the_steps_own_cgroup(void **) {
    assert_int_equal(
        source(ZB_OK, "/sys/fs/cgroup/cpuset/slurm/uid_0/job_42/step_3/cpuset.cpus", v1_task), own);
    assert_int_equal(source(ZB_OK,
                            "/sys/fs/cgroup/system.slice/n1_slurmstepd.scope/job_42/step_3/"
                            "user/cpuset.cpus.effective",
                            v2_task),
                     own);
    assert_int_equal(source(ZB_OK,
                            "/sys/fs/cgroup/system.slice/n1_slurmstepd.scope/job_42/step_3/"
                            "cpuset.cpus.effective",
                            v2_task),
                     own);
    assert_int_equal(source(ZB_OK, "/c/job_42/step_batch/cpuset.effective_cpus",
                            "/job_42/step_batch/task_0", SLURM_BATCH_SCRIPT),
                     own);
    assert_int_equal(source(ZB_OK, "/c/job_42/step_interactive/cpuset.cpus",
                            "/job_42/step_interactive/task_0", SLURM_INTERACTIVE_STEP),
                     own);
}

void the_job_level_may_have_any_name(void **) {
    // Slurm 26.05 names it by the job's SLUID unless CgroupJobIdPaths=yes.
    assert_int_equal(source(ZB_OK,
                            "/sys/fs/cgroup/system.slice/n1_slurmstepd.scope/sDB9M88G5WN700/"
                            "step_3/user/cpuset.cpus.effective",
                            sluid_task),
                     own);
    // under a cgroup namespace, or a mount of a sub-tree: only the levels from the job's down
    assert_int_equal(source(ZB_OK, "/cg/sDB9M88G5WN700/step_3/cpuset.cpus.effective",
                            "/sDB9M88G5WN700/step_3/user/task_0"),
                     own);
}

void a_task_cgroup_reads_the_step_above(void **) {
    assert_int_equal(source(ZB_OK, "/c/slurm/uid_0/job_42/step_3/task_0/cpuset.cpus", v1_task),
                     above);
    assert_int_equal(source(ZB_OK,
                            "/c/system.slice/n1_slurmstepd.scope/sDB9M88G5WN700/step_3/user/"
                            "task_0/cpuset.cpus.effective",
                            sluid_task),
                     above);
}

void no_cgroup_of_the_step_means_slurms_allocation(void **) {
    // no cpuset controller at all
    assert_int_equal(source(ZB_ENOENT, "", ""), alloc);
    // task/affinity alone: the task stays in a cgroup that is no step's
    assert_int_equal(source(ZB_OK, "/sys/fs/cgroup/cpuset/cpuset.effective_cpus", "/"), alloc);
    assert_int_equal(
        source(ZB_OK, "/sys/fs/cgroup/cpuset.cpus.effective", "/system.slice/slurmd.service"),
        alloc);
    // v2 without ConstrainCores: a level above the step (the job's, the mount's root)
    assert_int_equal(source(ZB_OK,
                            "/sys/fs/cgroup/system.slice/n1_slurmstepd.scope/sDB9M88G5WN700/"
                            "cpuset.cpus.effective",
                            sluid_task),
                     alloc);
    assert_int_equal(source(ZB_OK, "/sys/fs/cgroup/cpuset.cpus.effective", v2_task), alloc);
    // another step's cgroup is not this step's
    assert_int_equal(source(ZB_OK, "/c/job_42/step_31/cpuset.cpus", "/job_42/step_31/task_0"),
                     alloc);
    assert_int_equal(source(ZB_OK, "/c/job_42/step_3/cpuset.cpus", "/job_42/step_3/task_0", 4),
                     alloc);
    // a cgroup named like a step, but not Slurm's: no job level above it, or more below it
    assert_int_equal(source(ZB_OK, "/c/step_3/cpuset.cpus", "/step_3/task_0"), alloc);
    assert_int_equal(source(ZB_OK, "/c/job_42/step_3/cpuset.cpus", "/job_42/step_3/mine/task_0"),
                     alloc);
}

void a_read_error_is_a_failure_not_an_absence(void **) {
    for (zb_status st : {ZB_ESYS, ZB_EINVAL, ZB_ENOMEM, ZB_EINTERNAL})
        assert_int_equal(source(st, "/c/job_42/step_3/cpuset.cpus", v1_task), failed);
}

void the_task_cgroup_is_where_its_cpuset_is(void **) {
    // a hybrid host: the v1 cpuset line, not the unified one
    assert_string_equal(task_cgroup("5:memory:/slurm/uid_0/job_42/step_3/task_0\n"
                                    "3:cpu,cpuset:/slurm/uid_0/job_42/step_3/task_0\n"
                                    "0::/user.slice\n")
                            .c_str(),
                        v1_task);
    assert_string_equal(task_cgroup(std::string("0::") + sluid_task + "\n").c_str(), sluid_task);
    assert_string_equal(task_cgroup("4:memory:/x\n").c_str(), "");
    assert_string_equal(task_cgroup("").c_str(), "");
}

// ---- each layout on a fake tree, read by libzenbind as the plugin does -------------------------

const char *v1_mountinfo =
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "31 23 0:28 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,nosuid shared:12 - cgroup cgroup rw,cpuset\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,nosuid shared:8 - cgroup2 cgroup2 rw,nsdelegate\n";
const char *v2_mountinfo =
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "25 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";

std::string fake_file(const char *relpath) {
    std::ifstream in(std::string(root) + "/" + relpath);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

// What step_cpus() finds on this tree: the source, and the CPUs when it is a cgroup.
void expect_step_cgroup(const char *cpus) {
    zb_cpuset_t *set = zb_cpuset_alloc();
    char file[1024] = {};
    const zb_status st = zb_cgroup_cpuset(root, 0, 0, set, file, sizeof file);
    const std::string cgroup = task_cgroup(fake_file("proc/self/cgroup"));
    StepSource where = step_source(st, file, cgroup, 3);
    if (where == StepSource::step_cgroup_above) {
        assert_int_equal(zb_cgroup_cpuset(root, 0, 1, set, file, sizeof file), ZB_OK);
        where = StepSource::step_cgroup;
    }
    if (where != StepSource::step_cgroup)
        fail_msg("the step's cgroup is not found from %s (task cgroup %s): the plugin would take "
                 "S_STEP_ALLOC_CORES",
                 file, cgroup.c_str());
    char text[1024];
    const int len = zb_cpulist_format(set, text, sizeof text);
    assert_true(len >= 0 && static_cast<size_t>(len) < sizeof text);
    assert_string_equal(text, cpus);
    zb_cpuset_free(set);
}

// task/cgroup on cgroup v1: uid_U/job_J/step_S/task_T under the cpuset mount, the task's level
// configured too (Slurm writes the step's cpus there).
void layout_v1(void **) {
    put("proc/self/cgroup",
        "3:cpuset:/slurm/uid_0/job_42/step_3/task_0\n0::/user.slice/user-0.slice\n");
    put("proc/self/mountinfo", v1_mountinfo);
    put("sys/fs/cgroup/cpuset/cpuset.effective_cpus", "0-63\n");
    put("sys/fs/cgroup/cpuset/slurm/uid_0/job_42/cpuset.effective_cpus", "0-31\n");
    put("sys/fs/cgroup/cpuset/slurm/uid_0/job_42/step_3/cpuset.effective_cpus", "4-7\n");
    put("sys/fs/cgroup/cpuset/slurm/uid_0/job_42/step_3/task_0/cpuset.effective_cpus", "4-7\n");
    expect_step_cgroup("4-7");
}

// task/cgroup on cgroup v2 (Slurm's cgroup/v2, ConstrainCores=yes): the step's limits in
// step_S/user, the tasks below it, under the job's level named `job`.
void v2_tree(const char *job) {
    const std::string scope = std::string("sys/fs/cgroup/system.slice/n1_slurmstepd.scope/") + job;
    put("proc/self/cgroup",
        (std::string("0::/system.slice/n1_slurmstepd.scope/") + job + "/step_3/user/task_0\n")
            .c_str());
    put("proc/self/mountinfo", v2_mountinfo);
    put("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n");
    put("sys/fs/cgroup/cpuset.cpus.effective", "0-63\n");
    put((scope + "/cpuset.cpus").c_str(), "0-31\n");
    put((scope + "/cpuset.cpus.effective").c_str(), "0-31\n");
    put((scope + "/step_3/cpuset.cpus").c_str(), "\n");
    put((scope + "/step_3/cpuset.cpus.effective").c_str(), "0-31\n");
    put((scope + "/step_3/user/cpuset.cpus").c_str(), "8-11\n");
    put((scope + "/step_3/user/cpuset.cpus.effective").c_str(), "8-11\n");
    put((scope + "/step_3/user/task_0/cgroup.procs").c_str(), "");
}

void layout_v2_job_ids(void **) {
    v2_tree("job_42"); // up to Slurm 24.11, and 26.05 with CgroupJobIdPaths=yes
    expect_step_cgroup("8-11");
}

void layout_v2_sluids(void **) {
    v2_tree("sDB9M88G5WN700"); // Slurm 26.05's default
    expect_step_cgroup("8-11");
}

} // namespace

#define T(name) cmocka_unit_test_setup_teardown(name, fake_tree_setup, fake_tree_teardown)

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_steps_own_cgroup),
        cmocka_unit_test(the_job_level_may_have_any_name),
        cmocka_unit_test(a_task_cgroup_reads_the_step_above),
        cmocka_unit_test(no_cgroup_of_the_step_means_slurms_allocation),
        cmocka_unit_test(a_read_error_is_a_failure_not_an_absence),
        cmocka_unit_test(the_task_cgroup_is_where_its_cpuset_is),
        T(layout_v1),
        T(layout_v2_job_ids),
        T(layout_v2_sluids),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
