"""A process that has imported torch and memlayout once, and forks a `memlayout` run per request.

The SIGKILL harness kills hundreds of flatten runs at random points. Starting a
fresh interpreter for each would spend most of every run importing torch, so most
kills would land before flatten writes anything. Each forked child runs the real
CLI entry (`memlayout.cli.app.main`) on its own; the server never runs a torch op
itself, so the child starts with torch's thread pools unborn, as a fresh process does.

Protocol, one line each way (JSON argv in; plain words out):
    {"argv": [...]}  ->  started PID        the child runs `memlayout ARGV`
    wait PID         ->  ended PID STATUS   after the harness has killed it (or not)
"""

from __future__ import annotations

import json
import os
import sys


def _serve() -> None:
    import importlib
    import pkgutil

    import safetensors.torch  # noqa: F401 - imported once, shared by every child
    import torch  # noqa: F401

    import memlayout
    import memlayout.cli.app

    for module in pkgutil.walk_packages(memlayout.__path__, "memlayout."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)

    for line in sys.stdin:
        line = line.strip()
        if line.startswith("wait "):
            pid = int(line.split()[1])
            _, status = os.waitpid(pid, 0)
            print(f"ended {pid} {status}", flush=True)
            continue
        argv = json.loads(line)["argv"]
        pid = os.fork()
        if pid == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            try:
                code = memlayout.cli.app.main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                code = 99
            os._exit(code)
        print(f"started {pid}", flush=True)


if __name__ == "__main__":
    _serve()
