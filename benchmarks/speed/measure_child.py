"""Run one command and print, as JSON, its wall time and the peak RSS of that process alone.

Usage: python benchmarks/speed/measure_child.py COMMAND [ARG ...]

The benchmark that asks for the figure may be large (it imported torch to write its
checkpoints), and on Linux a child's `ru_maxrss` starts from its parent's high-water
mark at fork (the mm is copied, and exec keeps its high-water as the floor). This
small process forks the command instead, so the peak reported is the command's own,
within this launcher's few MiB. Output goes to /dev/null; the exit status is kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main() -> int:
    command = sys.argv[1:]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    print(json.dumps({
        "seconds": seconds,
        "max_rss_mib": usage.ru_maxrss / 1024,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "exit": os.waitstatus_to_exitcode(status),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
