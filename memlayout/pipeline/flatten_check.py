"""`memlayout flatten --check`: whether flatten would fix something that matters, path by path.

The paths are read as `inspect` reads them (`memlayout.pipeline.batch`): a folder
is walked file by file, a model folder is one model, and each gets its findings
with the project's settings. Each is then planned as flatten would rewrite it
(`memlayout.flatten.files`), writing nothing, and judged:

- **would change** (fails): a finding flatten fixes (`FLATTEN_FIXES`) is at or
  above `--fail-on`, or is ML203 at an alignment the project asked for, and
  flatten's plan changes the file;
- **already flat** (passes): flatten would change nothing;
- **passes**: flatten would still rewrite it, for findings below `--fail-on` or
  for no finding at all, and the verdict says why in one line;
- **not checked**: the path could not be read, or flatten refuses it (a format it
  does not rewrite, `--trust` missing); the one-line error says why;
- **data** (passes, and is no path checked): a file of a walked folder that holds
  no checkpoint and no pickle (a `config.json`, a tokenizer, text, an image), as
  `inspect` reads it: accounted for in the summary, with nothing to flatten.

Alignment is judged by what each format's own writer gives (ML203): 64 bytes
only where the project asks (`--align`, `alignment` in `[tool.memlayout]`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from memlayout.core.flatten_support import FIXED_BY_MOVING, FLATTEN_FIXES
from memlayout.errors import MemlayoutError
from memlayout.flatten.files import FlattenResult, flatten_path
from memlayout.flatten.options import FlattenOptions
from memlayout.pipeline.batch import PathReport, iter_path_reports
from memlayout.pipeline.config import Settings
from memlayout.rules import Finding
from memlayout.rules.location import file_of
from memlayout.severity import FailOn

ALREADY_FLAT = 0
WOULD_CHANGE = 1
NOT_CHECKED = 2
"""Exit codes: every path passes; one would change or could not be checked; none could be checked."""


class Verdict(str, enum.Enum):
    """What the check says of one path."""

    ALREADY_FLAT = "already flat"
    PASSES = "passes"
    WOULD_CHANGE = "would change"
    NOT_CHECKED = "not checked"
    DATA = "data"


@dataclass(frozen=True)
class CheckedPath:
    """One path's verdict and what it rests on."""

    path: str
    """The path as given, or as found inside a given folder."""
    verdict: Verdict
    result: FlattenResult | None = None
    """flatten's plan for it, written nowhere; None when not checked."""
    failing: tuple[Finding, ...] = ()
    """Findings that fail it: fixed by flatten, and at or above --fail-on (or ML203 at an asked alignment)."""
    files: dict[Finding, str] = field(default_factory=dict, compare=False)
    """In a model folder, the weight file (the shard) that holds each finding named here."""
    below: tuple[Finding, ...] = ()
    """Findings flatten fixes that do not fail it (below --fail-on): why flatten would still rewrite it."""
    unfixed: tuple[Finding, ...] = ()
    """Findings at or above --fail-on that flatten does not fix (`memlayout inspect` reports them), and
    failing findings of a file flatten would not change (a view of another tensor's bytes stays a view)."""
    error: str | None = None
    """Why it was not checked, one line naming the path."""
    data: str | None = None
    """For a file of a walked folder read as data: what it is ("JSON text"), as `inspect` says it."""

    @property
    def passed(self) -> bool:
        return self.verdict in (Verdict.ALREADY_FLAT, Verdict.PASSES, Verdict.DATA)


@dataclass(frozen=True)
class CheckBatch:
    """Every path of one `flatten --check`."""

    paths: tuple[CheckedPath, ...]
    fail_on: FailOn

    @property
    def checked(self) -> tuple[CheckedPath, ...]:
        """The checkpoints and models judged: every path but the files read as data."""
        return tuple(p for p in self.paths if p.verdict is not Verdict.DATA)

    @property
    def data(self) -> tuple[CheckedPath, ...]:
        """The files of walked folders read as data, which hold nothing to flatten."""
        return tuple(p for p in self.paths if p.verdict is Verdict.DATA)

    def counts(self) -> dict[Verdict, int]:
        """How many paths got each verdict (every verdict present, zeros included)."""
        counts = dict.fromkeys(Verdict, 0)
        for path in self.paths:
            counts[path.verdict] += 1
        return counts

    def exit_code(self) -> int:
        """2 when no path could be checked, 1 when one would change or was not checked, else 0."""
        return exit_status(self.paths)


def exit_status(paths: Iterable[CheckedPath]) -> int:
    """The exit code of a check of these paths: the one rule, for a batch held whole and for one printed
    as it goes.

    A file read as data neither fails the check nor counts as checked: a folder that
    holds only data has had nothing checked (2), as `inspect` says of it.
    """
    verdicts = [path.verdict for path in paths if path.verdict is not Verdict.DATA]
    if not verdicts or all(v is Verdict.NOT_CHECKED for v in verdicts):
        return NOT_CHECKED
    return ALREADY_FLAT if all(v in (Verdict.ALREADY_FLAT, Verdict.PASSES) for v in verdicts) else WOULD_CHANGE


def fixed_codes(options: FlattenOptions) -> frozenset[str]:
    """The rule codes whose findings this flatten fixes: `FLATTEN_FIXES`, and ML501 when --device moves
    every tensor to one device."""
    codes = set(FLATTEN_FIXES)
    if not options.keeps_devices:
        codes.add(FIXED_BY_MOVING[0])
    return frozenset(codes)


def judge(path: str, findings: Iterable[Finding], result: FlattenResult, fail_on: FailOn,
          options: FlattenOptions) -> CheckedPath:
    """One path's verdict from its findings and flatten's plan for it.

    Args:
        path: The path.
        findings: Its findings, with the project's settings (select, ignore, thresholds).
        result: flatten's plan for it (`flatten_path` with `check`).
        fail_on: The --fail-on threshold.
        options: What flatten was asked (--align, --device, --to).

    Returns:
        The `CheckedPath`.
    """
    findings = tuple(findings)
    if options.to is not None:
        # A conversion is judged by what it would write: IN is already that file, or not.
        verdict = Verdict.ALREADY_FLAT if result.already_flat else Verdict.WOULD_CHANGE
        return CheckedPath(path, verdict, result)
    fixed = fixed_codes(options)
    asked = options.align is not None
    failing = tuple(
        f for f in findings if f.code in fixed and (fail_on.fails(f.severity) or (asked and f.code == "ML203"))
    )
    below = tuple(f for f in findings if f.code in fixed and f not in failing)
    unfixed = tuple(f for f in findings if f.code not in fixed and fail_on.fails(f.severity))
    if result.already_flat:
        # Nothing flatten would write differs: what it cannot fix is inspect's to report.
        return CheckedPath(path, Verdict.ALREADY_FLAT, result, below=below, unfixed=failing + unfixed)
    verdict = Verdict.WOULD_CHANGE if failing else Verdict.PASSES
    return CheckedPath(path, verdict, result, failing=failing, below=below, unfixed=unfixed)


def _checked(report: PathReport, settings: Settings, options: FlattenOptions, debug: bool) -> CheckedPath:
    if report.data is not None:
        # Accounted for as inspect accounts for it, and no failure: a CI gate over a folder of
        # save_pretrained models and their configs passes when the models do.
        return CheckedPath(report.path, Verdict.DATA, data=report.data)
    if report.report is None:
        return CheckedPath(report.path, Verdict.NOT_CHECKED, error=report.error_line)
    try:
        result = flatten_path(report.path, replace(options, out=None, check=True))
    except MemlayoutError as exc:
        if debug:
            raise
        message = exc.one_line()
        return CheckedPath(report.path, Verdict.NOT_CHECKED, error=message if report.path in message
                           else f"{report.path}: {message}")
    except Exception as exc:  # a bug or an unforeseen input: this path is not checked, the others go on
        if debug:
            raise
        return CheckedPath(report.path, Verdict.NOT_CHECKED, error=f"{report.path}: unexpected "
                           f"{type(exc).__name__}: {exc} (rerun with --debug for the traceback)")
    checked = judge(report.path, report.report.findings, result, settings.fail_on, options)
    facts = report.report.facts
    named = (*checked.failing, *checked.below, *checked.unfixed)
    return replace(checked, files={f: held for f in named if (held := file_of(f, facts))})


def check_paths(
    paths: Iterable[str], options: FlattenOptions, settings: Settings, debug: bool = False
) -> Iterator[CheckedPath]:
    """Each path's verdict, in the order given (a folder's files in name order), as soon as it is known.

    Args:
        paths: Checkpoint files, model folders, folders of checkpoints, import specs.
        options: What flatten is asked (`align` is the alignment the project asks for, or None).
        settings: The project's settings (`[tool.memlayout]` and the flags): the rules
            selected, their thresholds and --fail-on.
        debug: Re-raise the first error instead of recording it.

    Yields:
        One `CheckedPath` per file or model (a folder of checkpoints gives one per file), and
        one per file of a walked folder read as data (`Verdict.DATA`).
    """
    rules = replace(settings.rule_config(), alignment=options.align)
    for _, reports in iter_path_reports(
        paths, rules, settings.select, settings.ignore, settings.per_tensor_ignores, debug=debug
    ):
        for report in reports:
            yield _checked(report, settings, options, debug)


__all__ = ["CheckBatch", "CheckedPath", "Verdict", "check_paths", "exit_status", "judge"]
