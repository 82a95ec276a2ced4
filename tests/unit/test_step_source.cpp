// Which source holds a step's CPUs (spank_plugin/step_source.cpp), for what zb_cgroup_cpuset()
// reports under each TaskPlugin and cgroup version. No Slurm needed.
#include "step_source.hpp"

#include "slurm_api.hpp"

#include <cstdarg>
#include <cstddef>
#include <setjmp.h>

extern "C" {
#include <cmocka.h>
}

namespace {

using zbspank::step_source;
using zbspank::StepSource;

int source(zb_status status, const char *file, uint32_t step = 3) {
    return static_cast<int>(step_source(status, file, 42, step));
}

void the_steps_own_cgroup(void **) {
    assert_int_equal(source(ZB_OK, "/sys/fs/cgroup/cpuset/slurm/uid_0/job_42/step_3/cpuset.cpus"),
                     static_cast<int>(StepSource::step_cgroup));
    assert_int_equal(source(ZB_OK, "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42/step_3/"
                                   "user/cpuset.cpus.effective"),
                     static_cast<int>(StepSource::step_cgroup));
    assert_int_equal(
        source(ZB_OK, "/c/job_42/step_batch/cpuset.effective_cpus", SLURM_BATCH_SCRIPT),
        static_cast<int>(StepSource::step_cgroup));
    assert_int_equal(
        source(ZB_OK, "/c/job_42/step_interactive/cpuset.cpus", SLURM_INTERACTIVE_STEP),
        static_cast<int>(StepSource::step_cgroup));
}

void a_task_cgroup_reads_the_step_above(void **) {
    assert_int_equal(source(ZB_OK, "/c/job_42/step_3/task_0/cpuset.cpus"),
                     static_cast<int>(StepSource::step_cgroup_above));
}

void no_cgroup_of_the_step_means_slurms_allocation(void **) {
    // no cpuset controller at all
    assert_int_equal(source(ZB_ENOENT, ""), static_cast<int>(StepSource::alloc_cores));
    // task/affinity alone: the root cpuset; v2 without ConstrainCores: the mount's root
    assert_int_equal(source(ZB_OK, "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"),
                     static_cast<int>(StepSource::alloc_cores));
    // another job's or another step's cgroup is not this step's
    assert_int_equal(source(ZB_OK, "/c/job_42/step_31/cpuset.cpus"),
                     static_cast<int>(StepSource::alloc_cores));
    assert_int_equal(source(ZB_OK, "/c/job_420/step_3/cpuset.cpus"),
                     static_cast<int>(StepSource::alloc_cores));
}

void a_read_error_is_a_failure_not_an_absence(void **) {
    for (zb_status st : {ZB_ESYS, ZB_EINVAL, ZB_ENOMEM, ZB_EINTERNAL})
        assert_int_equal(source(st, "/c/job_42/step_3/cpuset.cpus"),
                         static_cast<int>(StepSource::failed));
}

} // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_steps_own_cgroup),
        cmocka_unit_test(a_task_cgroup_reads_the_step_above),
        cmocka_unit_test(no_cgroup_of_the_step_means_slurms_allocation),
        cmocka_unit_test(a_read_error_is_a_failure_not_an_absence),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
