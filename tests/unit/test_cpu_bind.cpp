// The plugin's decision when srun --cpu-bind meets --zenflow-bind (spank_plugin/srun_cpu_bind.cpp),
// over the SLURM_CPU_BIND_TYPE values srun 22.05 writes. No Slurm needed.
#include "srun_cpu_bind.hpp"

#include <cstdarg>
#include <cstddef>
#include <setjmp.h>
#include <string>

extern "C" {
#include <cmocka.h>
}

namespace {

using zb::spank::CpuBindAction;
using zb::spank::decide_cpu_bind;

void no_type_means_nothing_to_decide(void **) {
    for (const char *type : {static_cast<const char *>(nullptr), "", "verbose", "quiet", "v,q"}) {
        const auto d = decide_cpu_bind(type, nullptr, true);
        assert_int_equal(static_cast<int>(d.action), static_cast<int>(CpuBindAction::none));
        assert_true(d.message.empty());
    }
}

void granularities_are_refined(void **) {
    for (const char *type : {"cores", "threads", "sockets", "ldoms", "boards", "verbose,cores"}) {
        for (bool asked : {true, false}) {
            const auto d = decide_cpu_bind(type, nullptr, asked);
            assert_int_equal(static_cast<int>(d.action), static_cast<int>(CpuBindAction::refine));
            assert_true(d.message.find("--cpu-bind=") == 0);
            assert_true(d.message.find("verbose") == std::string::npos);
            // (srun --hint=nomultithread sets threads: the user may not have typed --cpu-bind)
            assert_true(d.message.find("or a --hint") != std::string::npos);
        }
    }
}

void chosen_cpus_are_refused_when_asked_and_win_over_the_default(void **) {
    for (const char *type : {"map_cpu:", "mask_cpu:", "map_ldom:", "mask_ldom:", "rank",
                             "rank_ldom", "none", "cores,map_cpu:"}) {
        const auto asked = decide_cpu_bind(type, nullptr, true);
        assert_int_equal(static_cast<int>(asked.action), static_cast<int>(CpuBindAction::refuse));
        assert_true(asked.message.find(std::string("--cpu-bind=") + type) == 0);
        assert_true(asked.message.find("only one") != std::string::npos);
        const auto by_default = decide_cpu_bind(type, nullptr, false);
        assert_int_equal(static_cast<int>(by_default.action),
                         static_cast<int>(CpuBindAction::defer));
        assert_true(by_default.message.find("keeps Slurm's binding") != std::string::npos);
    }
}

// Found by fuzz_cpu_bind: a list is CPU numbers and never decides, even when it reads like a type.
void the_list_never_decides(void **) {
    assert_int_equal(static_cast<int>(decide_cpu_bind("n:", "x,no", true).action),
                     static_cast<int>(CpuBindAction::refine));
    assert_int_equal(static_cast<int>(decide_cpu_bind("cores:", "none", true).action),
                     static_cast<int>(CpuBindAction::refine));
}

void the_message_shows_the_list_as_given(void **) {
    const auto d = decide_cpu_bind("map_cpu:", "0,2", true);
    assert_true(d.message.find("--cpu-bind=map_cpu:0,2 and --zenflow-bind") == 0);
}

} // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_type_means_nothing_to_decide),
        cmocka_unit_test(granularities_are_refined),
        cmocka_unit_test(chosen_cpus_are_refused_when_asked_and_win_over_the_default),
        cmocka_unit_test(the_message_shows_the_list_as_given),
        cmocka_unit_test(the_list_never_decides),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
