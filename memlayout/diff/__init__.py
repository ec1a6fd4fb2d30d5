"""`memlayout diff`: compare two checkpoints' layouts, A (before) and B (after).

load A and B -> inspect each (facts, findings, summary) -> compare facts ->
frozen `Change` records in a `DiffReport` -> reporters (table, JSON, markdown,
HTML). Nothing here prints.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from memlayout.core.content import content_reader
from memlayout.core.facts import TensorFact
from memlayout.diff.changes import Change, ChangeKind, DiffReport
from memlayout.diff.names import NameMap, matching_keys, suggest_strip_prefixes
from memlayout.load.hf_ties import declared_ties
from memlayout.load.records import DeclaredTie, LoadedSource
from memlayout.load.remote_location import RemoteOptions
from memlayout.pipeline.batch import without_ignored_findings
from memlayout.pipeline.inspection import Report, inspect_source, load_target
from memlayout.rules import RuleConfig


@dataclass(frozen=True)
class DiffOptions:
    """What to compare, how names match, and the rules' settings for both sides (as `inspect` takes them)."""

    names: NameMap = field(default_factory=NameMap)
    deep: bool = False
    """Read every value of both sides: changed values, and the rules' --deep checks."""
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    rules: RuleConfig = field(default_factory=RuleConfig)
    """The rules' settings for both sides, as inspect reads them (`Settings.rule_config`): one
    `RuleConfig`, so a setting added there reaches diff too. Its `ties` (`--tie TARGET=SOURCE`)
    are by B's names; its `deep` is this object's own, which says more for a diff."""
    per_tensor_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(glob, codes) pairs: a finding all of whose tensors match a glob listing its code is dropped."""
    remote: RemoteOptions = field(default_factory=RemoteOptions)
    """How a URL or Hub model on either side is read (--timeout, --download); its `fetch_contents`
    follows `deep`."""


def run_diff(
    a: Any, b: Any, options: DiffOptions | None = None, progress: Callable[[str, int, int], None] | None = None
) -> DiffReport:
    """Compare checkpoint (or model) A with B.

    Args:
        a: The checkpoint before: a path in any format memlayout reads, an import
            spec, or a live module, state dict or training checkpoint.
        b: The checkpoint after, in the same or another format.
        options: Name matching, --deep, extra ties, rule selection.
        progress: Called as (task, done, total) during --deep scans.

    Returns:
        A `DiffReport`: both inspections, and the changes most severe first.

    Raises:
        MemlayoutError: either side cannot be loaded, or names collide after mapping.

    Example:
        >>> import torch
        >>> from memlayout.diff import run_diff
        >>> a = {"w": torch.zeros(4, 4)}
        >>> [c.kind.value for c in run_diff(a, {"w": a["w"].half()}).changes]
        ['dtype', 'storage-bytes']
    """
    from memlayout.diff.compare import ValueComparer, compare_reports
    from memlayout.diff.values import ValueComparison, comparable, compare_values

    options = options or DiffOptions()
    config = replace(options.rules, deep=options.deep)
    # Both sides stay open until the values are compared; nothing is executed from either.
    # A URL or Hub model on either side is read by range; its tensor bytes only for --deep.
    remote = options.remote._replace(fetch_contents=options.deep)
    with load_target(a, remote) as source_a, load_target(b, remote) as source_b:
        # --tie names B's tensors; A's own declarations come from A.
        report_a = _inspected(source_a, replace(config, ties=()), options, progress)
        report_b = _inspected(source_b, config, options, progress)
        values: ValueComparer | None = None
        content_a = content_reader(source_a, report_a.facts) if options.deep else None
        content_b = content_reader(source_b, report_b.facts) if options.deep else None
        if content_a is not None and content_b is not None:

            def values(x: TensorFact, y: TensorFact) -> ValueComparison | None:
                return compare_values(content_a, x, content_b, y) if comparable(x, y) else None

        candidates = sorted({n for r in (report_a, report_b) for t in r.facts.tensors for n in t.names})
        changes, matched = compare_reports(
            report_a, report_b, options.names, options.rules.ties, values,
            restoring_a=_config_ties(source_a, candidates), restoring_b=_config_ties(source_b, candidates),
        )
    return DiffReport(
        report_a, report_b, tuple(changes), matched,
        strip_prefixes=options.names.strip_prefixes, renames=options.names.renames, deep=options.deep,
        name_hint=_name_hint(report_a, report_b, options.names),
    )


def _inspected(source: Any, config: Any, options: DiffOptions,
               progress: Callable[[str, int, int], None] | None) -> Report:
    """One side inspected as inspect would, per-tensor-ignores dropping its findings as inspect drops them."""
    return without_ignored_findings(inspect_source(source, config, options.select, options.ignore, progress),
                                    options.per_tensor_ignores)


def _name_hint(a: Report, b: Report, names: NameMap) -> str | None:
    """What to pass when few names match: the --strip-prefix that lines them up, or that none does."""
    import shlex

    a_names = [n for t in a.facts.tensors for n in t.names]
    b_names = [n for t in b.facts.tensors for n in t.names]
    now = matching_keys(a_names, b_names, names)
    suggestion = suggest_strip_prefixes(a_names, b_names, names, now)
    if suggestion is not None:
        prefixes, found = suggestion
        flags = " ".join(f"--strip-prefix {shlex.quote(p)}" for p in prefixes)
        return (
            f"only {max(now, 0)} of A's {len(a_names)} names match B's {len(b_names)}; "
            f"rerun with {flags} to match {found} of them"
        )
    if a_names and b_names and now == 0:
        return (
            f"no tensor name of A matches one of B (A has {a_names[0]}, B has {b_names[0]}): different models, "
            "or one model under other names; --map OLD=NEW matches names that differ by a prefix"
        )
    return None


def _config_ties(source: LoadedSource, names: list[str]) -> list[DeclaredTie]:
    """What a model directory's config restores among `names`, stored there or not."""
    from memlayout.load.hf_dir import config_ties, is_hf_dir

    if source.model_config is not None:  # a remote folder's, as fetched
        return declared_ties(source.model_config, names, stored=[t.name for t in source.tensors])
    if source.path is None or not os.path.isdir(source.path) or not is_hf_dir(source.path):
        return []
    return config_ties(source.path, names, stored=[t.name for t in source.tensors])


__all__ = ["Change", "ChangeKind", "DiffOptions", "DiffReport", "NameMap", "run_diff"]
