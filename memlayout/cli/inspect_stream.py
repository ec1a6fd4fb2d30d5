"""`memlayout inspect --format jsonl`: each path's line written as the path finishes, none of them kept.

A run over a registry may read thousands of paths for an hour. Its report is
written as it goes, so nothing already read is lost when the run stops (an
interrupt, a kill, a full disk on a later line), and memory does not grow with
the paths: each path's report is rendered, written and dropped. Each failed path
is a line of its own (its error) and one line on stderr; the others go on.
"""

from __future__ import annotations

from contextlib import closing
from typing import TYPE_CHECKING

from memlayout.cli.progress import paths_progress
from memlayout.output.writer import LineWriter
from memlayout.pipeline.batch import exit_status, iter_path_reports

if TYPE_CHECKING:
    from memlayout.load.remote_location import RemoteOptions
    from memlayout.pipeline.config import Settings


def stream_json_lines(
    targets: list[str], settings: Settings, deep: bool, remote: RemoteOptions, jobs: int, output: str | None,
    debug: bool,
) -> int:
    """Inspect `targets`, writing a JSON line per path (to `output`, or stdout) as each finishes.

    Returns:
        The exit code (`memlayout.pipeline.batch.exit_status`): 2 when any path could not be read.
    """
    from memlayout.report.json_lines import path_line  # orjson

    inspected = failed = failing = 0
    finished = iter_path_reports(
        targets, config=settings.rule_config(deep), select=settings.select, ignore=settings.ignore,
        per_tensor_ignores=settings.per_tensor_ignores, debug=debug, remote=remote, jobs=jobs,
    )
    # closing: an interrupt raised while a line is written leaves the generator suspended, and
    # its run's HTTP session would be closed only when the interpreter collects it at exit, after
    # aiohttp has printed "Unclosed connector" below our one line.
    with LineWriter(output) as writer, paths_progress(len(targets)) as bar, closing(finished):
        for _, reports in finished:
            for path in reports:
                inspected += 1
                if path.failed:
                    failed += 1
                    bar.say(f"memlayout: error: {path.error_line}")
                elif path.fails(settings.fail_on):
                    failing += 1
                writer.write(path_line(path))
            bar.advance(1, sum(1 for path in reports if path.failed))
    return exit_status(inspected, failed, failing)
