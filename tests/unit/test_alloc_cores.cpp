// The plugin's fallback when no cpuset cgroup confines the step (task/affinity alone): Slurm's
// S_STEP_ALLOC_CORES core ids to the CPUs of those cores, on synthetic machines whose CPU numbers
// are not their core numbers (SMT siblings numbered far apart, as on most x86 servers).
#include "stepd_alloc_cores.hpp"

#include <cstdarg>
#include <cstddef>
#include <cstring>
#include <setjmp.h>
#include <string>

extern "C" {
#include <cmocka.h>
}

namespace {

// Two sockets of 16 cores with 2 PUs each; core k's PUs are k and k + 32.
constexpr const char *kSeed = "pack:2 [numa] core:16 pu:2(indexes=core:pack)";

std::string cpus_of(const char *synthetic, const char *cores, std::string &error) {
    zb_topology_t *topo = nullptr;
    assert_int_equal(zb_topology_load_synthetic(synthetic, &topo), ZB_OK);
    zb_cpuset_t *out = zb_cpuset_alloc();
    std::string list = "(failed)";
    if (zb::spank::alloc_cores_to_cpus(cores, topo, out, error)) {
        char buf[256];
        const int len = zb_cpulist_format(out, buf, sizeof buf);
        assert_true(len >= 0 && static_cast<size_t>(len) < sizeof buf);
        list = buf;
    }
    zb_cpuset_free(out);
    zb_topology_free(topo);
    return list;
}

void cores_map_to_both_siblings(void **) {
    std::string error;
    assert_string_equal(cpus_of(kSeed, "0-1,16", error).c_str(), "0-1,16,32-33,48");
    assert_string_equal(cpus_of(kSeed, "0-31", error).c_str(), "0-63");
    assert_string_equal(cpus_of(kSeed, "31", error).c_str(), "31,63");
}

// Siblings numbered next to each other (hwloc's default numbering): core k is CPUs 2k and 2k+1,
// so code that took core ids for CPU ids would bind the wrong CPUs.
void core_ids_are_not_cpu_ids(void **) {
    std::string error;
    assert_string_equal(cpus_of("pack:2 core:4 pu:2", "3", error).c_str(), "6-7");
    assert_string_equal(cpus_of("pack:2 core:4 pu:2", "0,5", error).c_str(), "0-1,10-11");
    assert_string_equal(cpus_of("pack:2 core:4 pu:2", "4-7", error).c_str(), "8-15");
}

void socket_major_order_without_smt(void **) {
    std::string error;
    assert_string_equal(cpus_of("pack:2 core:4 pu:1", "3-4", error).c_str(), "3-4");
}

void errors_name_the_problem(void **) {
    std::string error;
    assert_string_equal(cpus_of(kSeed, "32", error).c_str(), "(failed)");
    assert_non_null(std::strstr(error.c_str(), "core 32 but this node has only 32 cores"));
    assert_string_equal(cpus_of(kSeed, "0-", error).c_str(), "(failed)");
    assert_non_null(std::strstr(error.c_str(), "cannot read S_STEP_ALLOC_CORES '0-'"));
    assert_string_equal(cpus_of(kSeed, "", error).c_str(), "(failed)");
    assert_non_null(std::strstr(error.c_str(), "no S_STEP_ALLOC_CORES"));
}

} // namespace

int main() {
    const CMUnitTest tests[] = {
        cmocka_unit_test(cores_map_to_both_siblings),
        cmocka_unit_test(core_ids_are_not_cpu_ids),
        cmocka_unit_test(socket_major_order_without_smt),
        cmocka_unit_test(errors_name_the_problem),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
