"""What machine a measurement was made on, in one line for a report's header."""

from __future__ import annotations

import os
import platform


def machine() -> str:
    """The CPU's model name and the cores this process may use, e.g. "Intel(R) Xeon(R) ... (2 cores, x86_64,
    Linux)"; the processor field of :mod:`platform` where /proc/cpuinfo is missing."""
    name = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            name = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{name or platform.processor() or 'unknown CPU'} ({cores} cores, {platform.machine()}, {platform.system()})"
