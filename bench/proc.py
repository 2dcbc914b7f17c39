"""Reading a process's CPU time and memory from ``/proc``; pinning and limits for children."""

from __future__ import annotations

import ctypes
import os
import resource
import signal

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` (``/proc/PID/stat`` utime + stime)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    # The command name may hold spaces and parentheses: split after the last ")".
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (``/proc/PID/statm``)."""
    with open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * PAGE


def system_busy_seconds() -> float:
    """CPU time spent by the whole machine, every core, not idle (``/proc/stat``)."""
    with open("/proc/stat", "rb") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal ...
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / TICKS


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard limit; return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: a child never outlives the benchmark that started it.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def child_setup(cpu: int | None):
    """A ``preexec_fn``: pin to ``cpu`` (as ``taskset -c CPU`` would), raise the fd limit."""

    def setup() -> None:
        _die_with_parent()
        raise_fd_limit()
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    return setup
