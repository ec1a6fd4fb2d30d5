"""The terminal report: summary, storages table, findings with hints (rich)."""

from __future__ import annotations

import io
from collections import Counter

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from memlayout.format_bytes import counted, human_bytes
from memlayout.output.interface import Formatter
from memlayout.output.terminal import text_console
from memlayout.pipeline.batch import BaselineOutcome, BatchReport, PathReport
from memlayout.pipeline.inspection import Report
from memlayout.report.findings import count_phrase
from memlayout.report.shards import ranks_line
from memlayout.rules import Severity

SEVERITY_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
# Up to FOLD_OVER storages are all listed; past that, the SHOWN_WHEN_FOLDED largest
# and one line saying how many are folded (`--all` lists every one).
FOLD_OVER = 50
SHOWN_WHEN_FOLDED = 20
# Findings fold the same way: past FOLD_OVER, each rule lists its first
# FINDINGS_SHOWN_WHEN_FOLDED (worst first) and how many more it has. A terminal
# cannot show 40,000 ML201 lines usefully, and rich takes about 70 us to lay out each.
FINDINGS_SHOWN_WHEN_FOLDED = 5
BAR_WIDTH = 16
# Each kind of byte has its own character, so the bar reads without color too.
BAR_PARTS = (("used", "\u2588", "green"), ("padding", "\u2592", "blue"), ("unused", "\u2591", "yellow"))


def storage_bar(used: int, padding: int, unused: int, width: int = BAR_WIDTH) -> Text:
    """A bar of `width` cells: used, then padding, then unused bytes, each in proportion.

    Every kind that is present gets at least one cell, so a small bloat still shows;
    otherwise each kind gets its share of the cells, rounded to the nearest.

    Args:
        used: Bytes some tensor uses.
        padding: Alignment padding bytes.
        unused: Bytes no tensor uses (bloat).
        width: Cells in the bar.

    Returns:
        The bar, styled per kind.
    """
    sizes = (used, padding, unused)
    total = sum(sizes)
    bar = Text()
    if total <= 0:
        return bar
    exact = [size * width / total for size in sizes]
    cells = [max(int(share), 1) if size > 0 else 0 for size, share in zip(sizes, exact, strict=True)]
    # Settle rounding against the exact shares: give a cell to the kind furthest
    # below its share, or take one from the kind furthest above it (never its last).
    while sum(cells) < width:
        cells[max(range(3), key=lambda i: exact[i] - cells[i])] += 1
    while sum(cells) > width:
        cells[max((i for i in range(3) if cells[i] > 1), key=lambda i: cells[i] - exact[i])] -= 1
    for (_, char, style), count in zip(BAR_PARTS, cells, strict=True):
        bar.append(char * count, style)
    return bar


def _summary(report: Report) -> Table:
    s = report.summary
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(justify="right")
    grid.add_column(style="bold")
    grid.add_column(justify="right")
    rows = [
        ("tensors", f"{s.tensors} ({counted(s.names, 'name')})", "tensor bytes", human_bytes(s.tensor_bytes)),
        ("parameters", str(s.parameters), "storage bytes", human_bytes(s.storage_bytes)),
        ("buffers", str(s.buffers), "unique bytes", human_bytes(s.unique_bytes)),
        ("storages", str(s.storages), "wasted bytes", human_bytes(s.wasted_bytes)),
    ]
    for row in rows:
        grid.add_row(*row)
    counts = Text()
    for severity in Severity:
        if counts:
            counts.append(", ")
        counts.append(f"{s.findings.get(severity.value, 0)} {severity.value}", SEVERITY_STYLE[severity])
    grid.add_row("findings", counts, "padding bytes", human_bytes(s.padding_bytes))
    return grid


def _tie_label(report: Report, name: str) -> str:
    """A view by every name it has: a tie saved as one tensor reads `embed.weight = head.weight`."""
    tensor = report.facts.tensor(name)
    return name if tensor is None or len(tensor.names) == 1 else " = ".join(tensor.names)


def _storages(report: Report, show_all: bool) -> Table:
    table = Table(title="storages", title_justify="left", expand=False)
    for column, justify in (("id", "left"), ("device", "left"), ("size", "right"), ("used", "right"),
                            ("unused", "right"), ("layout", "left"), ("tensors", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    storages = sorted(report.facts.storages, key=lambda s: -s.nbytes)
    shown = storages if show_all or len(storages) <= FOLD_OVER else storages[:SHOWN_WHEN_FOLDED]
    for storage in shown:
        names = ", ".join(_tie_label(report, name) for name in storage.tensors[:3])
        names += f" +{len(storage.tensors) - 3}" if len(storage.tensors) > 3 else ""
        unused = Text(human_bytes(storage.unused_bytes), "yellow" if storage.unused_bytes else "")
        bar = storage_bar(storage.used_bytes, storage.padding_bytes, storage.unused_bytes)
        table.add_row(storage.id, storage.device, human_bytes(storage.nbytes), human_bytes(storage.used_bytes),
                      unused, bar, names)
    legend = "layout: \u2588 used  \u2592 padding  \u2591 unused"
    folded = len(storages) - len(shown)
    if folded:
        legend = f"{folded} smaller storages folded ({human_bytes(sum(s.nbytes for s in storages[len(shown):]))}); " \
                 f"--all shows every storage\n{legend}"
    table.caption = legend
    table.caption_justify = "left"
    return table


def _findings(report: Report, show_all: bool) -> Group | Text:
    if not report.findings:
        return Text("no findings", "green")
    ordered = sorted(report.findings, key=lambda f: (-f.severity.rank, f.code))
    fold = not show_all and len(ordered) > FOLD_OVER
    of_rule = Counter(f.code for f in ordered) if fold else Counter()
    listed: Counter[str] = Counter()
    lines: list[Text] = []
    for finding in ordered:
        listed[finding.code] += 1
        if fold and listed[finding.code] > FINDINGS_SHOWN_WHEN_FOLDED:
            continue
        line = Text()
        line.append(f"{finding.code} ", "bold")
        line.append(f"{finding.severity.value:<7} ", SEVERITY_STYLE[finding.severity])
        line.append(f"{finding.name}: ", "bold")
        line.append(finding.message)
        lines.append(line)
        lines.append(Text(f"    hint: {finding.hint}", "dim"))
        more = of_rule[finding.code] - FINDINGS_SHOWN_WHEN_FOLDED
        if fold and listed[finding.code] == FINDINGS_SHOWN_WHEN_FOLDED and more > 0:
            lines.append(Text(f"... and {more} more {finding.code} findings; --all lists every one", "dim"))
    return Group(*lines)


def panel_title(path: str, formats: str, width: int) -> Text:
    """The title of a path's panel, its path cut at the start where the line is too short for it.

    rich crops a title at the panel's right end, which would cut off the file's name and
    format, the part that tells a folder's members apart; the folders they sit in go instead.
    A Text, so the "[format]" suffix and a name's brackets are not console markup.
    """
    title = f"memlayout: {path} [{formats}]"
    room = width - 6  # the corner, the rule and a space on each side of the title
    keep = room - len(f"memlayout: \u2026 [{formats}]")
    if len(title) > room and 0 < keep < len(path):
        title = f"memlayout: \u2026{path[-keep:]} [{formats}]"
    return Text(title)


def render_table(report: Report, width: int = 120, color: bool = False, show_all: bool = False) -> str:
    """The rich report as text; ANSI colors only when `color` is set.

    Args:
        report: One path's report.
        width: Line width.
        color: ANSI colors.
        show_all: List every storage and every finding, not the largest 20 storages of
            more than 50 and the first 5 findings of each rule when there are more than 50.
    """
    buffer = io.StringIO()
    console = text_console(buffer, width, color)
    source = report.facts.source
    formats = " and ".join([source.format, *(f"a valid {other}" for other in source.also_valid_as)])
    title = panel_title(source.path or "(object)", formats, width)
    console.print(Panel(_summary(report), title=title, title_align="left", expand=False))
    ranks = ranks_line(report.facts)
    if ranks is not None:
        console.print(Text(f"ranks: {ranks}"))
    for note in source.notes:
        console.print(Text(f"note: {note}", "dim"))
    if source.layout_unrecorded:
        console.print(Text(f"storages: not recorded: {source.layout_unrecorded}", "dim"))
    else:
        console.print(_storages(report, show_all))
    console.print(Text("findings", "bold"))
    console.print(_findings(report, show_all))
    for line in _skipped(report):
        console.print(line)
    return buffer.getvalue()


def _skipped(report: Report) -> list[Text]:
    # One line per reason: a metadata-only source skips a dozen rules for one cause.
    by_reason: dict[str, list[str]] = {}
    for skipped in report.skipped:
        by_reason.setdefault(skipped.reason, []).append(skipped.code)
    return [Text(f"skipped {', '.join(codes)}: {reason}", "dim") for reason, codes in by_reason.items()]


def _baseline_lines(baseline: BaselineOutcome) -> list[str]:
    lines = [f"baseline {baseline.file}: {baseline.suppressed} known finding(s) not shown"
             + (" (just written)" if baseline.written else "")]
    if baseline.fixed:
        lines.append(f"baseline: {len(baseline.fixed)} recorded finding(s) no longer occur; "
                     f"re-run with --write-baseline {baseline.file} to drop them:")
        lines += [f"  fixed {e.code} {e.path}: {', '.join(e.tensors) or '(no tensor)'}" for e in baseline.fixed]
    if baseline.rekeyed:
        lines.append(f"baseline: {len(baseline.rekeyed)} finding(s) shown although recorded: the baseline keyed them "
                     "on their rule and tensors only, and their fingerprints now cover what they are about (a "
                     f"pickle's globals); review them, then re-run with --write-baseline {baseline.file}:")
        lines += [f"  shown {e.code} {e.path}" for e in baseline.rekeyed]
    return lines


def _kinds(data: list[PathReport]) -> str:
    """The data files by what they are, most common first: "text (2,500), a PNG image (2,500)"."""
    counts: dict[str, int] = {}
    for path in data:
        counts[path.data or ""] = counts.get(path.data or "", 0) + 1
    return ", ".join(f"{what} ({count:,})" for what, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


class TableReporter(Formatter[BatchReport]):
    """The terminal report: one panel per path, then the totals when there are several."""

    def __init__(self, width: int = 120, color: bool = False, show_all: bool = False) -> None:
        self.width = width
        self.color = color
        self.show_all = show_all

    def render(self, batch: BatchReport) -> str:
        parts: list[str] = []
        for path in batch.paths:
            if path.report is not None:
                parts.append(render_table(path.report, width=self.width, color=self.color, show_all=self.show_all))
            elif path.failed:
                parts.append(f"error: {path.error_line}\n")
        tail: list[str] = []
        if batch.single is None:
            failed = len(batch.failures)
            data = batch.data
            read_as_data = f", {len(data)} recognized as data" if data else ""
            tail.append(
                f"{len(batch.paths)} paths: {len(batch.reports)} inspected{read_as_data}, {failed} failed to load; "
                f"findings: {count_phrase(batch.findings_by_severity())}"
            )
            if data:
                tail.append(f"data (no pickle, no checkpoint): {_kinds(data)}")
        elif batch.data:
            tail.append(f"and {counted(len(batch.data), 'other file')} of the folder, read: data (no pickle, "
                        f"no checkpoint): {_kinds(batch.data)}")
        if batch.baseline is not None:
            tail += _baseline_lines(batch.baseline)
        # Each part ends with a newline, so joining leaves a blank line between paths.
        text = "\n".join(parts)
        if tail:
            text += ("\n" if batch.single is None else "") + "".join(line + "\n" for line in tail)
        return text
