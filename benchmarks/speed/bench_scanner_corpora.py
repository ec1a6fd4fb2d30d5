"""The pickle scanners' own sample files through `memlayout inspect`: flagged, cleared, and nothing run.

Usage: python benchmarks/speed/bench_scanner_corpora.py [--mirrors DIR] [--quick]

picklescan (mmaitre314/picklescan: `tests/data`, `tests/data2`), modelscan
(protectai/modelscan: `tests/data`) and fickling (trailofbits/fickling:
`test/fixtures`) keep their sample files in their repositories. This script reads
them from local git mirrors at run time (DIR/<owner>+<name>/repo, a bare git
directory; MEMLAYOUT_SCANNER_MIRRORS or /work/.mirror by default), writes them to
a scratch folder, and runs one watched `memlayout inspect` over all of them
(tests/corpus/sweep.py: an audit hook records and blocks any command, connection or
real unpickling). Without a mirror it says so and exits 0: nothing of theirs is
kept in this repository. The suite remakes their samples from recipes of ours
(tests/corpus/test_scanner_samples.py).

Each file's label is the scanner's own verdict in its tests (`LABELS`: malicious
when its test expects a dangerous global, benign when it expects none). Printed:
malicious samples flagged (runs-code, constructs-object) over all, benign samples
cleared over all, what was refused with one line, and every sample executed (none
may be). Then the scanners' own lists of dangerous globals, each judged by
memlayout's classes, and every entry where the classes differ.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness import ROOT, Row, print_table, quick_requested, write_results

MIRRORS = Path(os.environ.get("MEMLAYOUT_SCANNER_MIRRORS", "/work/.mirror"))
CORPORA = {
    "picklescan": ("mmaitre314+picklescan", ["tests/data", "tests/data2"]),
    "modelscan": ("protectai+modelscan", ["tests/data"]),
    "fickling": ("trailofbits+fickling", ["test/fixtures"]),
}
BENIGN = {
    # picklescan: tests/test_scanner.py expects no dangerous global (scan_err aside).
    "picklescan": {
        "benign0_v0.pkl", "benign0_v3.pkl", "benign0_v4.pkl", "benign_password_protected.zip", "pytorch_model.bin",
        "new_pytorch_model.bin", "bad_pytorch.pt", "not_a_pickle.bin", "int_array.npy", "int_arrays.npz",
        "int_arrays_compressed.npz", "object_array.npy", "object_arrays.npz", "object_arrays_compressed.npz",
    },
    # modelscan: password_protected.zip is skipped as unreadable; unsafe_zip_pytorch.pt is its malicious sample.
    "modelscan": {"password_protected.zip"},
    "fickling": {"squeezenet1_0_torchscript_v1_4.pt"},
}
"""The samples each scanner's tests call benign; every other sample file is one they flag."""
NOT_SAMPLES = {"generate_fixtures.py"}


def _extract(corpus: str, scratch: Path) -> list[Path]:
    """The corpus's sample files, written under `scratch/corpus`; [] without a mirror."""
    mirror, folders = CORPORA[corpus]
    git_dir = MIRRORS / mirror / "repo"
    if not git_dir.is_dir():
        return []
    target = scratch / corpus
    target.mkdir(parents=True)
    listing = subprocess.run(["git", "--git-dir", str(git_dir), "ls-tree", "-r", "--name-only", "HEAD", *folders],
                             capture_output=True, text=True, check=True).stdout.split()
    written = []
    for name in listing:
        if Path(name).name in NOT_SAMPLES:
            continue
        shown = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"HEAD:{name}"], capture_output=True,
                               check=False)
        if shown.returncode != 0:  # a file the snapshot lists but does not hold (a large one left out)
            continue
        path = target / Path(name).name
        path.write_bytes(shown.stdout)
        written.append(path)
    return written


def _their_lists() -> dict[str, list[tuple[str, str]]]:
    """picklescan's `_unsafe_globals` and modelscan's `unsafe_globals`, read from the mirrors' source by ast."""
    found: dict[str, list[tuple[str, str]]] = {}
    sources = {
        "picklescan": ("mmaitre314+picklescan", "src/picklescan/scanner.py", "_unsafe_globals"),
        "modelscan": ("protectai+modelscan", "modelscan/settings.py", "DEFAULT_SETTINGS"),
    }
    for scanner, (mirror, path, variable) in sources.items():
        git_dir = MIRRORS / mirror / "repo"
        if not git_dir.is_dir():
            continue
        text = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"HEAD:{path}"], capture_output=True,
                              text=True, check=True).stdout
        node = next(n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == variable for t in n.targets))
        table: Any
        if scanner == "modelscan":
            assert isinstance(node, ast.Dict)
            unsafe = next(v for k, v in zip(node.keys, node.values, strict=True)
                          if isinstance(k, ast.Constant) and k.value == "unsafe_globals")
            table = {}
            for level in ast.literal_eval(unsafe).values():
                table.update(level)
        else:
            table = ast.literal_eval(node)
        found[scanner] = sorted((module, name) for module, names in table.items()
                                for name in ([names] if isinstance(names, str) else names))
    return found


def _differences(lists: dict[str, list[tuple[str, str]]]) -> list[str]:
    from memlayout.rules.pickle_dangers import Danger, judge

    lines = []
    for scanner, entries in lists.items():
        for module, name in entries:
            judged = judge(module, "anything" if name == "*" else name, allowed=False)
            if judged.danger is not Danger.RUNS_CODE:
                lines.append(f"{scanner}: {module}.{name} is {judged.danger.value} in memlayout")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    global MIRRORS
    if "--mirrors" in argv:
        MIRRORS = Path(argv[argv.index("--mirrors") + 1])
    quick = quick_requested(argv)
    from tests.corpus.sweep import FLAGGED, sweep

    with tempfile.TemporaryDirectory(prefix="memlayout-scanner-corpora-") as folder:
        scratch = Path(folder)
        samples = {corpus: _extract(corpus, scratch) for corpus in CORPORA}
        if not any(samples.values()):
            print(f"bench_scanner_corpora: skipped: no mirror of {', '.join(CORPORA)} under {MIRRORS}")
            return 0
        paths = [path for files in samples.values() for path in files]
        swept = sweep(paths, scratch)
        rows, raw = [], {"executions": swept.executions, "samples": {}}
        for corpus, files in samples.items():
            if not files:
                print(f"{corpus}: no mirror under {MIRRORS}, or no sample files in its snapshot")
                continue
            benign = [p for p in files if p.name in BENIGN[corpus]]
            malicious = [p for p in files if p.name not in BENIGN[corpus]]
            outcome = {p.name: swept.outcomes[p.name] for p in files}
            flagged = [p for p in malicious if outcome[p.name].outcome in FLAGGED]
            cleared = [p for p in benign if outcome[p.name].outcome == "cleared"]
            raw["samples"][corpus] = {name: o._asdict() for name, o in outcome.items()}
            runs = sum(1 for p in malicious if outcome[p.name].outcome == "runs-code")
            rows.append(Row(f"{corpus}: malicious flagged ({runs} runs-code, {len(flagged) - runs} constructs-object)",
                            f"{len(flagged)}/{len(malicious)}", "every malicious sample",
                            len(flagged) / max(len(malicious), 1), "= 1", len(flagged) == len(malicious)))
            rows.append(Row(f"{corpus}: benign cleared", f"{len(cleared)}/{len(benign)}", "every benign sample",
                            len(cleared) / max(len(benign), 1), "(info)", True))
            for path in sorted(files):
                result = outcome[path.name]
                if (path in malicious) != (result.outcome in FLAGGED) or result.outcome == "refused":
                    label = "malicious" if path in malicious else "benign"
                    print(f"  {corpus} {label} {path.name}: {result.outcome}: {result.detail[:160]}")
        rows.append(Row("samples that executed anything", str(len(swept.executions)), "none", 0.0,
                        "= 0", not swept.executions))
        print_table("bench_scanner_corpora: the scanners' samples through memlayout "
                    f"inspect{' (quick)' if quick else ''}",
                    rows)
        lists = _their_lists()
        differences = _differences(lists)
        raw["their_lists"] = {k: len(v) for k, v in lists.items()}
        raw["differences"] = differences
        print(f"\ntheir lists of dangerous globals: {raw['their_lists']}; classed otherwise by memlayout:")
        for line in differences:
            print(f"  {line}")
        print(f"raw numbers: {write_results('scanner_corpora', rows, raw, quick).relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
