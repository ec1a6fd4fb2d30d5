"""The HTML storage map: one self-contained file, for `inspect --html` (and the page of `diff --html`).

The page holds the summary, the findings (or, for a diff, the changes) and a map
where each storage is a bar scaled to its bytes with its tensors as segments.
Everything is inline (CSS, script, data as JSON) and the page's content security
policy forbids every network load, so the file opens the same offline, attached
to a ticket or archived by CI. The page is built by Jinja2 templates from plain
data computed here; the script draws the map lazily, so that a model with
100,000 tensors opens fast.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict
from operator import attrgetter
from typing import Any

from memlayout.core.facts import Facts, unused_ranges
from memlayout.core.rnn_facts import rnn_reserved_bytes
from memlayout.core.strides import Relation
from memlayout.format_bytes import counted, human_bytes
from memlayout.load.records import TensorKind
from memlayout.output.interface import Formatter
from memlayout.pipeline.batch import BatchReport
from memlayout.pipeline.inspection import Report
from memlayout.report.json_text import compact_dumps
from memlayout.rules import Finding
from memlayout.version import __version__

MAP_DATA_VERSION = 1
"""Version of the JSON the page embeds (`#memlayout-data`), for tools that read it back."""

MARK_ORDER = ("broken", "removed", "added", "changed")
"""The marks a page of two checkpoints colours a tensor with (the stylesheet's `mark-*`), worst first."""


def _partial_overlaps(facts: Facts) -> dict[str, list[list[int]]]:
    """storage id -> byte ranges where two views overlap partially (ML101), by their spans, merged.

    A tie (the same bytes) and a view inside a bigger one (a flat buffer and its
    slots) are deliberate sharing: the map shows them as stacked segments. Only
    partial overlaps, which no layout means to have, are drawn as overlaps.
    """
    ranges: dict[str, list[tuple[int, int]]] = {}
    for group in facts.alias_groups:
        for pair in group.pairs:
            if pair.relation is not Relation.PARTIAL:
                continue
            first, second = facts.tensor(pair.first), facts.tensor(pair.second)
            if first is None or second is None:
                continue
            start = max(first.bytes_used.start, second.bytes_used.start)
            end = min(first.bytes_used.end, second.bytes_used.end)
            if end > start:
                ranges.setdefault(group.storage, []).append((start, end))
    merged: dict[str, list[list[int]]] = {}
    for storage, spans in ranges.items():
        out: list[list[int]] = []
        for start, end in sorted(spans):
            if out and start <= out[-1][1]:
                out[-1][1] = max(out[-1][1], end)
            else:
                out.append([start, end])
        merged[storage] = out
    return merged


def tensor_indices(facts: Facts, index: dict[str, int], names: Iterable[str]) -> list[int]:
    """The map's indices (`index`: tensor name -> index) of the tensors `names` name, each once."""
    found = []
    for name in names:
        tensor = facts.tensor(name)
        if tensor is not None:
            found.append(index[tensor.name])
    return list(dict.fromkeys(found))


def side_data(
    report: Report,
    label: str = "",
    key_of: Callable[[str], str] | None = None,
    marks: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One checkpoint's map as compact JSON-ready data.

    Args:
        report: The inspection.
        label: "A" or "B" in a diff; "" for one report.
        key_of: The diff's name matching, so the page can link a tensor to its match.
        marks: key -> "broken", "removed", "added" or "changed", to colour a diff.

    Returns:
        Lists rather than objects per tensor and storage, to keep a 100,000-tensor
        page small: tensors are [names, dtype, shape, stride, offset, first byte,
        end byte, storage index, kind, keys, mark]; storages (largest first) are
        [id, device, nbytes, used, padding, unused, gaps [start, end, is padding],
        partial overlaps [start, end]].
    """
    facts = report.facts
    # Largest first, ties by id: two sorts by C-level keys (a descending sort keeps
    # ties in order), a third of the time of one sort by a per-storage lambda.
    storages = sorted(sorted(facts.storages, key=attrgetter("id")), key=attrgetter("nbytes"), reverse=True)
    storage_index = {s.id: i for i, s in enumerate(storages)}
    tensor_index = {t.name: i for i, t in enumerate(facts.tensors)}
    tensors = []
    # Once per tensor of pages of 100,000 tensors: tuples are encoded as the lists
    # they were, and names, kinds and byte spans are read without a call each.
    kind_names = {kind: kind.value for kind in TensorKind}
    no_keys: tuple[str, ...] = ()
    for tensor in facts.tensors:
        keys: list[str] | tuple[str, ...] = no_keys
        mark = ""
        if key_of is not None:
            keys = [key_of(n) for n in tensor.names]
            if marks:
                found = {marks[k] for k in keys if k in marks}
                mark = next((m for m in MARK_ORDER if m in found), "")
        intervals = tensor.bytes_used.intervals
        tensors.append([
            tensor.names, tensor.dtype, tensor.shape, tensor.stride, tensor.offset,
            intervals[0][0] if intervals else 0, intervals[-1][1] if intervals else 0,
            storage_index[tensor.storage], kind_names[tensor.kind], keys, mark,
        ])
    overlaps = _partial_overlaps(facts)
    reserved = rnn_reserved_bytes(facts) if facts.modules else {}
    storage_rows = []
    for storage in storages:
        used = storage.used
        if len(used) == 1 and used[0][0] == 0 and used[0][1] >= storage.nbytes:
            gaps = []  # a storage its tensors fill, the usual one: no gap to list
        else:
            gaps = [
                [start, end, int(padding)]
                for start, end, padding in unused_ranges(used, storage.nbytes, reserved.get(storage.id))
            ]
        storage_rows.append([
            storage.id, storage.device, storage.nbytes, storage.used_bytes, storage.padding_bytes,
            storage.unused_bytes, gaps, overlaps.get(storage.id, []),
        ])
    links = [
        [tensor_index[pair.first], tensor_index[pair.second], pair.relation.value]
        for group in facts.alias_groups for pair in group.pairs
    ]
    for tie in facts.declared_ties:
        tied, tied_to = facts.tensor(tie.target), facts.tensor(tie.source)
        if tied is not None and tied_to is not None and tied is not tied_to:
            links.append([tensor_index[tied.name], tensor_index[tied_to.name], "declared"])
    findings = [_finding(facts, tensor_index, f) for f in report.findings]
    for finding in report.findings:
        if finding.code == "ML102":  # copies that should perhaps be one: link them like a tie
            members = tensor_indices(facts, tensor_index, finding.tensors)
            links += [[members[0], other, "duplicate"] for other in members[1:]]
    source = facts.source
    return {
        "label": label,
        "path": source.path or "(object)",
        "format": source.format,
        "summary": asdict(report.summary),
        "tensors": tensors,
        "storages": storage_rows,
        "links": links,
        "findings": findings,
    }


def _finding(facts: Facts, index: dict[str, int], finding: Finding) -> list[Any]:
    return [finding.code, finding.severity.value, finding.name, finding.message, finding.hint,
            tensor_indices(facts, index, finding.tensors)]


def _summary_rows(report: Report) -> list[tuple[str, str]]:
    s = report.summary
    return [
        ("tensors", f"{s.tensors} ({counted(s.names, 'name')})"),
        ("storages", str(s.storages)),
        ("tensor bytes", human_bytes(s.tensor_bytes)),
        ("storage bytes", human_bytes(s.storage_bytes)),
        ("unique bytes", human_bytes(s.unique_bytes)),
        ("wasted bytes", human_bytes(s.wasted_bytes)),
        ("padding bytes", human_bytes(s.padding_bytes)),
        ("findings", ", ".join(f"{count} {severity}" for severity, count in s.findings.items())),
    ]


def storage_map_page(
    title: str, sides: list[dict[str, Any]], reports: list[Report], changes: list[list[Any]] | None
) -> str:
    """The page around one or more sides (`side_data`), with a diff's change lines when given.

    Args:
        title: The page's title.
        sides: Each checkpoint's map data, in the order shown.
        reports: The inspections the sides come from, for their summaries.
        changes: A diff's lines as [severity, kind, text, A's tensor indices, B's];
            None for a page of inspections.

    Returns:
        The page's text.
    """
    from jinja2 import Environment, PackageLoader, select_autoescape
    from jinja2.utils import htmlsafe_json_dumps

    environment = Environment(
        loader=PackageLoader("memlayout.report", "templates"),
        autoescape=select_autoescape(default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    data = {"version": MAP_DATA_VERSION, "sides": sides, "changes": changes}
    # htmlsafe_json_dumps escapes <, >, & and ' so that no tensor name can close the
    # script element; compact separators keep a 100,000-tensor page smaller. The
    # data holds no floats, so orjson writes json's text (json_text), five times faster.
    embedded = htmlsafe_json_dumps(data, dumps=lambda obj, **_: compact_dumps(obj))
    template = environment.get_template("storage_map.html.j2")
    return template.render(
        title=title,
        version=__version__,
        sides=[
            {"data": side, "summary": _summary_rows(report)} for side, report in zip(sides, reports, strict=True)
        ],
        changes=changes,
        data=embedded,
    )


def render_html(*reports: Report) -> str:
    """The storage maps of one or more reports as one self-contained HTML page.

    Args:
        reports: What `memlayout.inspect` returned (`inspect PATH...` gives several).

    Returns:
        The page's text.
    """
    paths = [r.facts.source.path or "(object)" for r in reports]
    title = f"memlayout: {paths[0]}" if len(paths) == 1 else f"memlayout: {len(paths)} checkpoints"
    return storage_map_page(title, [side_data(r) for r in reports], list(reports), None)


class HtmlReporter(Formatter[BatchReport]):
    """The storage map of every path that loaded, as one page (`inspect --html FILE`, `--format html`)."""

    def render(self, batch: BatchReport) -> str:
        return render_html(*(p.report for p in batch.paths if p.report is not None))
