"""A stand-in for the part of ``psutil`` that ``qa/L0_shared_memory/shared_memory_test.py`` uses
(``test.sh`` installs psutil with pip; this project's environment does not have it).

``Process().memory_info().rss``: the resident set size of this process, read from
``/proc/self/statm`` on every call, as psutil reads it on Linux. The runner puts this folder on the
test process's ``PYTHONPATH`` for both servers.
"""

from __future__ import annotations

import os
from typing import NamedTuple


class MemoryInfo(NamedTuple):
    rss: int
    vms: int


class Process:
    """The calling process."""

    def memory_info(self) -> MemoryInfo:
        with open("/proc/self/statm") as statm:
            size, resident = (int(v) for v in statm.read().split()[:2])
        page = os.sysconf("SC_PAGE_SIZE")
        return MemoryInfo(rss=resident * page, vms=size * page)
