// decide_cpu_bind on arbitrary SLURM_CPU_BIND_TYPE / SLURM_CPU_BIND_LIST text (an exported
// SLURM_CPU_BIND reaches them): never a crash, a message for every decision but none, and a
// refusal or deferral only for types that choose CPUs.
#include "check.hpp"

#include "srun_cpu_bind.hpp"

#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const std::string input(reinterpret_cast<const char *>(data), size);
    const size_t cut = input.find('\0');
    const std::string type = input.substr(0, cut);
    const std::string list = cut == std::string::npos ? "" : input.substr(cut + 1);
    if (list.find('\0') != std::string::npos) return 0;
    using zb::spank::CpuBindAction;
    for (bool asked : {true, false}) {
        const auto d = zb::spank::decide_cpu_bind(type.c_str(), list.c_str(), asked);
        ZB_FUZZ_CHECK((d.action == CpuBindAction::none) == d.message.empty());
        if (d.action == CpuBindAction::none) continue;
        ZB_FUZZ_CHECK(d.message.rfind("--cpu-bind=", 0) == 0);
        if (d.action == CpuBindAction::refuse) ZB_FUZZ_CHECK(asked);
        if (d.action == CpuBindAction::defer) ZB_FUZZ_CHECK(!asked);
        bool chooses = false; // over the type's comma-separated words only
        for (size_t b = 0; b <= type.size();) {
            size_t e = type.find(',', b);
            if (e == std::string::npos) e = type.size();
            const std::string w = type.substr(b, e - b);
            for (const char *p : {"map_cpu", "mask_cpu", "map_ldom", "mask_ldom", "rank"})
                chooses = chooses || w.rfind(p, 0) == 0;
            chooses = chooses || w == "none" || w == "no";
            b = e + 1;
        }
        ZB_FUZZ_CHECK((d.action != CpuBindAction::refine) == chooses);
    }
    return 0;
}
