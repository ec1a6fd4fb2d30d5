"""The inspect pipeline: load -> facts -> rules -> report data.

`run_inspection` is what `memlayout.inspect` and the CLI's `inspect` call. It
returns data; rendering is the reporters' job.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from memlayout import cyclic_gc
from memlayout.core.content import ContentReader, content_reader
from memlayout.core.fact_builder import build_facts
from memlayout.core.facts import Facts
from memlayout.load import load_object, load_path
from memlayout.load.records import LoadedSource, TensorKind
from memlayout.load.remote_location import RemoteOptions
from memlayout.rules import (
    RULES,
    Finding,
    Requirement,
    RuleConfig,
    RuleContext,
    SkippedRule,
    is_selected,
)
from memlayout.severity import FailOn, Severity

if TYPE_CHECKING:  # the exchange is only for ranks under a launcher; a file inspect never loads it
    from memlayout.pipeline.ranks import RankExchange


@dataclass(frozen=True)
class Summary:
    """Totals for the report header and JSON `summary`."""

    tensors: int
    """Distinct tensor views (tied names count once)."""
    names: int
    """Names, counting every name of a tied tensor."""
    parameters: int
    buffers: int
    storages: int
    tensor_bytes: int
    """Sum of each distinct view's logical size."""
    storage_bytes: int
    """Sum of storage sizes: what torch.save writes."""
    unique_bytes: int
    """Bytes some tensor uses, counted once: what a deduplicating save needs."""
    padding_bytes: int
    """Alignment padding between slots."""
    wasted_bytes: int
    """Unused storage bytes (ML301) plus duplicated contents (ML102)."""
    findings: dict[str, int] = field(default_factory=dict)
    """Finding counts by severity."""


@dataclass(frozen=True)
class Report:
    """The result of an inspection."""

    facts: Facts
    findings: tuple[Finding, ...]
    summary: Summary
    skipped: tuple[SkippedRule, ...] = ()
    """Selected rules that did not run because the source lacks what they read, and why."""

    def fails(self, fail_on: FailOn | str) -> bool:
        """Whether any finding is at or above `fail_on` (error, warning, info, never)."""
        threshold = FailOn(fail_on)
        return any(threshold.fails(f.severity) for f in self.findings)


def summarize(facts: Facts, findings: Iterable[Finding]) -> Summary:
    findings = list(findings)
    tensors, storages = facts.tensors, facts.storages
    # Each total walks up to 100,000 facts: field getters and Counter run in C,
    # where a generator expression runs a Python frame per fact.
    unused = sum(map(attrgetter("unused_bytes"), storages))
    duplicated = sum(f.wasted_bytes for f in findings if f.code == "ML102")
    by_severity = Counter(f.severity.value for f in findings)
    kinds = Counter(map(attrgetter("kind"), tensors))
    return Summary(
        tensors=len(tensors),
        names=sum(map(len, map(attrgetter("names"), tensors))),
        parameters=kinds[TensorKind.PARAMETER],
        buffers=kinds[TensorKind.BUFFER],
        storages=len(storages),
        tensor_bytes=sum(map(attrgetter("nbytes"), tensors)),
        storage_bytes=sum(map(attrgetter("nbytes"), storages)),
        unique_bytes=sum(map(attrgetter("used_bytes"), storages)),
        padding_bytes=sum(map(attrgetter("padding_bytes"), storages)),
        wasted_bytes=unused + duplicated,
        findings={sev.value: by_severity.get(sev.value, 0) for sev in Severity},
    )


def missing_requirements(facts: Facts, content: ContentReader | None) -> dict[Requirement, str]:
    """What this source does not record that some rules read, each with the reason.

    Args:
        facts: The source's facts.
        content: Its content reader, None when its bytes cannot be read.

    Returns:
        Requirement -> why the source lacks it; empty for a source that has everything.
    """
    missing: dict[Requirement, str] = {}
    if facts.source.layout_unrecorded:
        missing[Requirement.LAYOUT] = facts.source.layout_unrecorded
        if not facts.source.chunks:
            missing[Requirement.SHARING] = facts.source.layout_unrecorded
    if content is None:
        missing[Requirement.CONTENT] = facts.source.content_unreadable or (
            f"the {facts.source.format} source gives no tensor bytes to read"
        )
    return missing


def run_rules(
    facts: Facts,
    config: RuleConfig,
    content: ContentReader | None,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[list[Finding], list[SkippedRule]]:
    """Every selected rule's findings, in code order, and the rules the source cannot feed.

    A rule that reads something the source does not record (layout of a
    metadata-only source, bytes of a bare pickle) is not run: on stand-in records
    it would report things that are not in the file. It is listed with the reason.
    """
    select, ignore = list(select), list(ignore)
    context = RuleContext(facts, config, content, progress)
    missing = missing_requirements(facts, content)
    findings: list[Finding] = []
    skipped: list[SkippedRule] = []
    for code in sorted(RULES):
        rule_ = RULES[code]
        if not is_selected(code, select, ignore) or (rule_.deep_only and not config.deep):
            continue
        lacking = [missing[need] for need in Requirement if need in rule_.needs and need in missing]
        if lacking:
            # The first missing requirement is reason enough; layout comes before content.
            skipped.append(SkippedRule(code, rule_.name, lacking[0]))
            continue
        findings.extend(rule_.check(context))
    return findings, skipped


def inspect_source(
    source: LoadedSource,
    config: RuleConfig | None = None,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    progress: Callable[[str, int, int], None] | None = None,
    exchange: RankExchange | None = None,
) -> Report:
    """Facts, findings and summary for an already loaded source.

    With `exchange` (under torchrun), the ranks share their facts before the rules run.
    """
    config = config or RuleConfig()
    facts = build_facts(source)
    if exchange is not None:
        facts = exchange.share_facts(facts)
    content = content_reader(source, facts)
    findings, skipped = run_rules(facts, config, content, select, ignore, progress)
    return Report(facts, tuple(findings), summarize(facts, findings), tuple(skipped))


def load_target(target: Any, remote: RemoteOptions | None = None) -> LoadedSource:
    """Load a path, a URL or an import spec (a `str` or path-like), or a live object.

    The caller closes the source (a `with` block) when done with its contents.
    """
    if isinstance(target, str) or hasattr(target, "__fspath__"):
        return load_path(str(target), remote)
    return load_object(target)


def run_inspection(
    target: Any,
    config: RuleConfig | None = None,
    select: Iterable[str] = (),
    ignore: Iterable[str] = (),
    progress: Callable[[str, int, int], None] | None = None,
    exchange: RankExchange | None = None,
    remote: RemoteOptions | None = None,
) -> Report:
    """Inspect a path, a URL, an import spec, or a live object.

    Nothing from a file is executed: every format is read as inert records.

    Args:
        target: A checkpoint path, a model directory, "pkg.module:callable", an
            nn.Module, a state dict or a nested training checkpoint.
        config: Rule knobs (--deep, thresholds, extra ties).
        select: Codes or prefixes to run (all when empty).
        ignore: Codes or prefixes to skip.
        progress: Called as (task, done, total) during long content scans.
        exchange: Under torchrun, how the ranks share their facts (pipeline/ranks.py).
        remote: How a URL or Hub model is read; tensor bytes are fetched for --deep.

    Returns:
        The `Report`.

    Example:
        >>> import torch, memlayout
        >>> report = memlayout.inspect(torch.nn.Linear(4, 4))
        >>> report.summary.parameters
        2
    """
    config = config or RuleConfig()
    remote = (remote or RemoteOptions())._replace(fetch_contents=config.deep)
    with cyclic_gc.paused(), load_target(target, remote) as source:
        return inspect_source(source, config, select, ignore, progress, exchange)
