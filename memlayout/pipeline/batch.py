"""Several paths in one call: inspect each, keep going past the ones that fail to load.

`inspect_paths` is what `memlayout inspect a.pt b.safetensors models/` runs. Each
path gets a `PathReport` holding its `Report`, or the one-line reason it could not
be loaded; the `BatchReport` over all of them is what every reporter renders, and
its `exit_code` is the one place the CLI's exit status is decided.

Baselines adopt memlayout in a project that already has findings: `--write-baseline
FILE` records every current finding by its fingerprint (the rule code, the sorted
tensor names and what else the finding is about, such as the globals a pickle names,
hashed: `Finding.fingerprint`), so later runs with `--baseline FILE` report only new
findings: a pickle that gains a global is a new finding. A recorded finding that no longer occurs is
reported as fixed, so the file can be shrunk by writing it again. Paths in the file
are relative to the file's own folder, so the baseline works from any working
directory and on any machine that has the project checked out. A baseline applies
to a whole batch, and its outcome is part of the batch's report, so both live here.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from memlayout.errors import DamagedPickleError, MemlayoutError, UnrecognizedFormatError
from memlayout.load.detect import dcp_file_names
from memlayout.load.remote_location import RemoteOptions, remote_location
from memlayout.pipeline.folder_walk import folder_entries
from memlayout.pipeline.inspection import Report, run_inspection, summarize
from memlayout.pipeline.many_paths import in_flight
from memlayout.rules import (
    RULES,
    Finding,
    RuleConfig,
    is_ignored_for_its_tensors,
    is_selected,
)
from memlayout.rules.pickle_dangers import JudgedGlobal, judge
from memlayout.rules.registry import FINGERPRINT_SCHEME
from memlayout.severity import FailOn, Severity

if TYPE_CHECKING:  # the exchange is only for ranks under a launcher; a file inspect never loads it
    from memlayout.pipeline.ranks import RankExchange

EXIT_CLEAN = 0
EXIT_FAILED = 1
EXIT_USAGE_OR_LOAD_ERROR = 2


@dataclass(frozen=True)
class PathReport:
    """One path of the call: its report, or why it could not be inspected."""

    path: str
    """The path (or import spec) as the user gave it, or as found inside a given directory."""
    report: Report | None = None
    """The inspection's result; None when the path failed to load."""
    error: str | None = None
    """The one-line reason the path failed to load, with its hint; None when it loaded."""
    suppressed: tuple[Finding, ...] = ()
    """Findings hidden because the baseline records them (they are not in `report`)."""
    data: str | None = None
    """For a file of a walked folder that holds no pickle and no checkpoint: what it is ("text",
    "a PNG image"); None otherwise. Such a file was read and is no failure."""
    pickle_globals: tuple[JudgedGlobal, ...] = ()
    """For a path that failed on a damaged pickle: the globals outside the allow-list it named before
    the damage (which unpickling would have imported, and may have called), each with its danger class."""

    @property
    def failed(self) -> bool:
        """Whether the path could not be read: no report, and not recognized as data."""
        return self.report is None and self.data is None

    @property
    def error_line(self) -> str:
        """The load error, naming the path (most loaders' messages already start with it)."""
        error = self.error or ""
        return error if self.path in error else f"{self.path}: {error}"

    def fails(self, fail_on: FailOn | str) -> bool:
        """Whether this path makes the run fail: a finding at or above `fail_on`, or a load error.

        A load error counts as an error-severity result, so `--fail-on never` is the
        only threshold it does not fail. A file recognized as data fails nothing.
        """
        if self.report is None:
            return self.data is None and FailOn(fail_on).fails(Severity.ERROR)
        return self.report.fails(fail_on)


@dataclass(frozen=True)
class BaselineEntry:
    """One finding a baseline file records."""

    path: str
    """The inspected path, relative to the baseline file's folder (an import spec as given)."""
    code: str
    fingerprint: str
    """`Finding.fingerprint`: the rule code, the sorted tensor names and what else the finding is
    about (ML601's globals), hashed."""
    tensors: tuple[str, ...] = ()
    """For people reading the file; matching uses the path and the fingerprint."""
    scheme: int = FINGERPRINT_SCHEME
    """How `fingerprint` was made (`memlayout.rules.registry.FINGERPRINT_SCHEME`): 1 in baselines
    written before findings were keyed on what they are about."""


@dataclass(frozen=True)
class BaselineOutcome:
    """What the baseline did in this run."""

    file: str
    """The baseline file, as given."""
    suppressed: int
    """Findings found again and hidden."""
    fixed: tuple[BaselineEntry, ...]
    """Recorded findings of the inspected paths that no longer occur: the baseline can shrink."""
    written: bool = False
    """The file was (re)written by `--write-baseline` in this run."""
    rekeyed: tuple[BaselineEntry, ...] = ()
    """Findings the baseline recorded under an older fingerprint scheme that did not cover what they
    are about (ML601's globals): shown, not hidden, since the old key cannot tell whether what they
    warn about changed. Each as this run names it, with its current fingerprint."""


@dataclass(frozen=True)
class BatchReport:
    """Every path of one call, as reporters render it."""

    paths: tuple[PathReport, ...]
    fail_on: FailOn = FailOn.WARNING
    """The `--fail-on` threshold: error, warning, info or never."""
    rules: tuple[str, ...] = field(default_factory=lambda: tuple(sorted(RULES)))
    """The codes of the rules selected for this run, in code order (JUnit lists one testcase each)."""
    deep: bool = False
    """Whether content rules ran (--deep); deep-only rules are skipped without it."""
    baseline: BaselineOutcome | None = None
    given: tuple[str, ...] = ()
    """The paths as the call named them, before folders were expanded; empty means `paths`."""

    @property
    def single(self) -> PathReport | None:
        """The only path, when the call named exactly one that is no folder of checkpoints.

        Its reports keep the one-path shapes (JSON schema 1); a folder gives the
        several-path shapes even when it holds one checkpoint, so a script sees one
        shape for one command line.
        """
        # A model folder's other files that hold no pickle and no checkpoint (its config.json)
        # are listed beside the one report, not made paths of their own.
        read = [p for p in self.paths if p.data is None]
        given = self.given or tuple(p.path for p in read)
        if len(read) == 1 and given == (read[0].path,):
            return read[0]
        return None

    @property
    def reports(self) -> list[Report]:
        return [p.report for p in self.paths if p.report is not None]

    @property
    def failures(self) -> list[PathReport]:
        return [p for p in self.paths if p.failed]

    @property
    def data(self) -> list[PathReport]:
        """The files of walked folders recognized as data: read, holding no pickle and no checkpoint."""
        return [p for p in self.paths if p.data is not None]

    def findings_by_severity(self) -> dict[str, int]:
        """Finding counts over every path, by severity (every severity present, zeros included)."""
        counts = {severity.value: 0 for severity in Severity}
        for report in self.reports:
            for finding in report.findings:
                counts[finding.severity.value] += 1
        return counts

    def exit_code(self) -> int:
        """The worst over all paths: 2 when a path could not be read, 1 when a finding fails one."""
        return exit_status(
            len(self.paths), len(self.failures),
            sum(1 for p in self.paths if p.report is not None and p.fails(self.fail_on))
        )


def exit_status(paths: int, failed: int, failing: int) -> int:
    """The exit code of an inspection of `paths` paths, of which `failed` could not be read and `failing` have a
    finding at or above --fail-on: the one rule, for a batch held whole and for one streamed (--format jsonl).

    A path that could not be read is a load error (exit 2) whatever the others found:
    an audit that did not read everything has not passed, and --fail-on (about
    findings) does not hide it. The other paths are still reported.
    """
    if paths == 0 or failed:
        return EXIT_USAGE_OR_LOAD_ERROR
    return EXIT_FAILED if failing else EXIT_CLEAN


def without_findings(report: Report, dropped: Iterable[Finding]) -> Report:
    """`report` less some findings, its summary counted again from the ones left."""
    gone = set(dropped)
    kept = tuple(f for f in report.findings if f not in gone)
    return replace(report, findings=kept, summary=summarize(report.facts, kept))


def without_ignored_findings(report: Report, per_tensor_ignores: Iterable[tuple[str, Iterable[str]]]) -> Report:
    """`report` less the findings all of whose tensors match a glob listing their code (`per-tensor-ignores`)."""
    ignores = tuple((glob, tuple(codes)) for glob, codes in per_tensor_ignores)
    if not ignores:
        return report
    dropped = [f for f in report.findings if is_ignored_for_its_tensors(f, ignores)]
    return without_findings(report, dropped) if dropped else report


# ---------------------------------------------------------------------------
# Baselines

# ---------------------------------------------------------------------------
# Inspecting the paths


def selected_rules(select: Iterable[str] = (), ignore: Iterable[str] = ()) -> tuple[str, ...]:
    """The codes `--select`/`--ignore` leave, in code order."""
    select, ignore = list(select), list(ignore)
    return tuple(code for code in sorted(RULES) if is_selected(code, select, ignore))


def _share_failure(exchange: RankExchange | None, error: str) -> None:
    """Under torchrun, a rank that failed on a path still takes its part in the ranks' sharing."""
    if exchange is not None:
        exchange.share_failure(error)


@dataclass
class _Walk:
    """One call's settings, and the folders already walked (a symlink loop is walked once)."""

    config: RuleConfig
    select: tuple[str, ...]
    ignore: tuple[str, ...]
    progress: Callable[[str, int, int], None] | None
    debug: bool
    per_tensor_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exchange: RankExchange | None = None
    remote: RemoteOptions | None = None
    walked: set[str] = field(default_factory=set)
    walking: threading.Lock = field(default_factory=threading.Lock)

    def inspect(self, path: str, given: bool, contents_are_data: bool = False) -> Iterator[PathReport]:
        """`path`'s report, its error, or (for a folder that is no model) the reports of its members.

        `given` is False for a sub-folder found while walking a given folder: one with
        no member inside is skipped, not an error. `contents_are_data` is True for a
        walked file recognized by content: a container of no pickle nor checkpoint is data.
        """
        from memlayout.load.import_spec import looks_like_spec

        # Under torchrun each rank builds the model an import spec names and the ranks share
        # their pieces; a file or folder is the same on every rank and is read as it is.
        exchange = self.exchange if self.exchange is not None and looks_like_spec(path) else None
        if exchange is not None:
            exchange.begin()
        try:
            report = run_inspection(
                path, config=self.config, select=self.select, ignore=self.ignore, progress=self.progress,
                exchange=exchange, remote=self.remote,
            )
        except UnrecognizedFormatError as exc:
            _share_failure(exchange, exc.one_line())
            found = list(self._walk(path)) if os.path.isdir(path) else []
            if found and given and all(p.data is not None for p in found):
                # A folder the user named that holds nothing memlayout reads: most likely not the
                # folder they meant. Its files are listed all the same.
                yield PathReport(path, error=exc.one_line())
                yield from found
            elif found:
                yield from found
            elif contents_are_data:
                # A compressed stream or an archive found in a walk, with no pickle or checkpoint inside.
                yield PathReport(path, data=exc.message.removeprefix(f"{path} is "))
            elif given or not os.path.isdir(path):
                if self.debug:
                    raise
                yield PathReport(path, error=exc.one_line())
        except MemlayoutError as exc:
            _share_failure(exchange, exc.one_line())
            if self.debug:
                raise
            named = exc.named if isinstance(exc, DamagedPickleError) else ()
            yield PathReport(path, error=exc.one_line(), pickle_globals=tuple(judge(m, n, False) for m, n in named))
            if os.path.isdir(path):
                # A model folder whose model could not be read (a truncated shard, an index
                # naming a missing one): its files are still each audited on their own, the
                # failing one included, read for what it is. A DCP folder's data files are
                # only readable through its .metadata, and are left out.
                yield from self._walk(path, taken=dcp_file_names(path))
        except Exception as exc:  # a bug or an unforeseen input: this path fails, the others go on
            _share_failure(exchange, f"unexpected {type(exc).__name__}: {exc}")
            if self.debug:
                raise
            yield PathReport(
                path, error=f"{path}: unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)"
            )
        else:
            yield PathReport(path, report=without_ignored_findings(report, self.per_tensor_ignores))
            if os.path.isdir(path):
                # A model folder's other files (a pickle beside the weights, a
                # training checkpoint's optimizer.pt) are audited on their own.
                yield from self._walk(path, taken=report.facts.source.files)

    def _walk(self, folder: str, taken: tuple[str, ...] = ()) -> Iterator[PathReport]:
        real = os.path.realpath(folder)
        with self.walking:  # paths in flight together may walk folders at once
            if real in self.walked:
                return
            self.walked.add(real)
        try:
            entries = folder_entries(folder, taken)
        except OSError as exc:
            yield PathReport(folder, error=f"{folder}: the folder cannot be listed: {exc.strerror}")
            return
        for entry in entries:
            if entry.kind == "data":
                yield PathReport(entry.path, data=entry.what)
            elif entry.kind == "unreadable":
                yield PathReport(entry.path, error=f"{entry.path}: {entry.what}")
            else:
                yield from self.inspect(entry.path, given=False, contents_are_data=entry.kind == "read")


def inspect_paths(
    paths: Iterable[str],
    config: RuleConfig | None = None,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    fail_on: FailOn | str = FailOn.WARNING,
    per_tensor_ignores: Iterable[tuple[str, Iterable[str]]] = (),
    progress: Callable[[str, int, int], None] | None = None,
    debug: bool = False,
    exchange: RankExchange | None = None,
    remote: RemoteOptions | None = None,
    jobs: int = 1,
    done: Callable[[list[PathReport]], None] | None = None,
) -> BatchReport:
    """Inspect each path; a path that fails to load is recorded, and the others still run.

    Args:
        paths: Checkpoint files, model directories, folders of checkpoints, or
            `pkg.module:callable` specs.
        config: Rule knobs (thresholds, --deep, extra ties).
        select: Rule codes or prefixes to run (all when empty).
        ignore: Rule codes or prefixes to skip.
        fail_on: The severity at which a path fails the run (error, warning, info, never).
        per_tensor_ignores: (glob, codes) pairs: a finding all of whose tensors match a
            glob listing its code is dropped (`per-tensor-ignores` in the config).
        progress: Called as (task, done, total) during long content scans.
        debug: Re-raise the first error instead of recording it (for --debug).
        exchange: Under torchrun, how the ranks share the facts of the models import specs build.
        remote: How URLs and Hub models are read (timeout, full downloads).
        jobs: Paths inspected at once (`iter_path_reports`); the report keeps the paths' order.
        done: Called with each given path's reports as it finishes (a progress bar).

    Returns:
        The `BatchReport`, one `PathReport` per path (a folder of checkpoints gives one per file).

    Example:
        >>> from memlayout.pipeline.batch import inspect_paths
        >>> batch = inspect_paths(["fixtures/demo_checkpoint.pt", "missing.pt"])  # doctest: +SKIP
        >>> [p.failed for p in batch.paths], batch.exit_code()  # doctest: +SKIP
        ([False, True], 2)
    """
    config = config or RuleConfig()
    select, ignore = tuple(select), tuple(ignore)
    given = tuple(paths)
    by_path: dict[int, list[PathReport]] = {}
    finished = iter_path_reports(
        given, config, select, ignore, per_tensor_ignores, progress, debug, exchange, remote, jobs
    )
    with closing(finished):  # an exception in `done` closes the run's transport now, not at exit
        for index, reports in finished:
            by_path[index] = reports
            if done is not None:
                done(reports)
    reports = [report for index in range(len(given)) for report in by_path[index]]
    return BatchReport(
        tuple(reports), fail_on=FailOn(fail_on), rules=selected_rules(select, ignore), deep=config.deep, given=given
    )


def iter_path_reports(
    paths: Iterable[str],
    config: RuleConfig | None = None,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    per_tensor_ignores: Iterable[tuple[str, Iterable[str]]] = (),
    progress: Callable[[str, int, int], None] | None = None,
    debug: bool = False,
    exchange: RankExchange | None = None,
    remote: RemoteOptions | None = None,
    jobs: int = 1,
) -> Generator[tuple[int, list[PathReport]], None, None]:
    """Each given path's reports (one, or a folder's several) as soon as it is done, with its index among `paths`.

    With `jobs` above 1 that many paths are inspected at once, in threads, and
    every remote read of the run shares one HTTP session and connection pool
    (`memlayout.io.remote.RemoteTransport`), closed when the iteration ends; the
    descriptors and memory held stay flat in the number of paths. Under torchrun
    (an `exchange`) paths go one at a time, as the ranks must agree on each.

    Args:
        paths: As for `inspect_paths`; read lazily, so a long list need not be held.
        jobs: Paths in flight at once.
        (the others): As for `inspect_paths`.

    Yields:
        (index of the given path, its reports) in the order the paths finish.
    """
    config = config or RuleConfig()
    ignores = tuple((glob, tuple(codes)) for glob, codes in per_tensor_ignores)
    transport = None
    if remote is not None and remote.transport is None:
        from memlayout.io.remote import RemoteTransport, connections_for

        transport = RemoteTransport(remote.timeout_s, connections_for(jobs))
        remote = remote._replace(transport=transport)
    walk = _Walk(config, tuple(select), tuple(ignore), progress, debug, ignores, exchange, remote)
    # Local files and import specs go one at a time whatever `jobs` says: reading them is
    # CPU work that threads would not speed up under the GIL, a --deep scan of each maps
    # its file, and a spec runs the user's code, which need not be thread-safe.
    local = threading.Lock()

    def work(path: str) -> list[PathReport]:
        if remote_location(path) is not None:
            return list(walk.inspect(path, given=True))
        with local:
            return list(walk.inspect(path, given=True))

    try:
        yield from in_flight(paths, work, 1 if exchange is not None else jobs)
    finally:
        if transport is not None:
            transport.close()
