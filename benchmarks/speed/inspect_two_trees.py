"""`memlayout.inspect`'s CPU time in two source trees of memlayout, run alternately in fresh processes.

Usage: python benchmarks/speed/inspect_two_trees.py OLD_TREE NEW_TREE PATH [PATH ...]

For "no slower than before" claims about a refactoring: each tree is put first on
PYTHONPATH in its own process, which inspects every PATH once to warm imports and
the page cache, then three times, keeping the least CPU time; the trees take turns
for ROUNDS rounds, so that a busy machine's drift falls on both alike. Prints each
tree's best per path and the new/old ratio. The sources `bench_many_tensors.py`
builds (.bench-data/moe-40000.pt, moe-40000-transposed.pt, moe-hf-100000) are the
usual PATHs.
"""

from __future__ import annotations

import os
import subprocess
import sys

ROUNDS = 2
CHILD = """
import gc, sys, time
import memlayout
for path in sys.argv[1:]:
    memlayout.inspect(path)
best = {}
for _ in range(3):
    for path in sys.argv[1:]:
        gc.collect()
        start = time.process_time()
        memlayout.inspect(path)
        best[path] = min(best.get(path, float("inf")), time.process_time() - start)
for path in sys.argv[1:]:
    print(best[path])
"""


def best_times(tree: str, paths: list[str]) -> list[float]:
    """The least CPU seconds of `memlayout.inspect` on each path, with `tree`'s memlayout."""
    env = {**os.environ, "PYTHONPATH": tree}
    result = subprocess.run([sys.executable, "-c", CHILD, *paths], env=env, capture_output=True, text=True,
                            check=True, cwd="/")
    return [float(line) for line in result.stdout.split()]


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    old, new, paths = argv[0], argv[1], argv[2:]
    best = {old: [float("inf")] * len(paths), new: [float("inf")] * len(paths)}
    for _ in range(ROUNDS):
        for tree in (old, new):
            best[tree] = [min(a, b) for a, b in zip(best[tree], best_times(tree, paths), strict=True)]
    for i, path in enumerate(paths):
        print(f"{os.path.basename(path.rstrip('/'))}: old {best[old][i]:.3f} s, new {best[new][i]:.3f} s CPU, "
              f"new/old {best[new][i] / best[old][i]:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
