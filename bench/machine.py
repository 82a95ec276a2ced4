"""What the Python benchmarks print about where they ran: the CPU model, the load and the memory
settings that move their figures."""

import os
import platform


def cpu_name():
    """The CPU's model name (/proc/cpuinfo), else what platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def load():
    """The 1, 5 and 15-minute load averages, as text."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def memory_settings():
    """The settings that move a memory-bound step's figures, whichever optimizer steps: the
    kernel's transparent huge page mode (torch's allocator uses huge pages when
    THP_MEM_ALLOC_ENABLE=1 and the mode allows them) and glibc's malloc tunables (whether freed
    memory goes back to the kernel), as text."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = next((w[1:-1] for w in f.read().split() if w.startswith("[")), "unknown")
    except OSError:
        thp = "unknown"
    env = ", ".join(f"{k}={os.environ[k]!r}" if k in os.environ else f"{k} unset"
                    for k in ("THP_MEM_ALLOC_ENABLE", "GLIBC_TUNABLES"))
    return f"transparent huge pages {thp}; {env}"
