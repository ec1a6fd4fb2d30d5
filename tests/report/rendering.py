"""inspect's formatters as the tests call them: through the one registry, as the CLI does."""

from __future__ import annotations

from memlayout.cli.formats import Command, OutputFormat, RenderOptions, supported, to_format
from memlayout.output.interface import Formatter
from memlayout.pipeline.batch import BatchReport, PathReport
from memlayout.pipeline.inspection import Report


def inspect_formatter(fmt: OutputFormat, width: int = 120, color: bool = False,
                      show_all: bool = False) -> Formatter[BatchReport]:
    """The formatter `memlayout inspect --format fmt` renders with."""
    make = supported(to_format(fmt).inspect, fmt, Command.INSPECT)
    return make(RenderOptions(width=width, color=color, show_all=show_all))


def render(report: Report, fmt: OutputFormat, width: int = 120, color: bool = False, show_all: bool = False) -> str:
    """One library report's text, as `memlayout inspect` prints it for that one path."""
    path = report.facts.source.path or "(object)"
    batch = BatchReport((PathReport(path, report=report),))
    return inspect_formatter(fmt, width=width, color=color, show_all=show_all).render(batch)
