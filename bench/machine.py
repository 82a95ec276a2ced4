"""What the Python benchmarks print about where they ran: the CPU model and the load."""

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
