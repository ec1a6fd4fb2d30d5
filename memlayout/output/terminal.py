"""The console every terminal report lays its text out on (rich).

Names in a report come from the file: a tensor, module or shard name is whatever
its writer chose. rich would read "[/bold]" in one as markup (and raise
MarkupError on a closing tag with nothing open) and ":smile:" as an emoji, so
the console reads no markup and no emoji: a report styles its own text with
`rich.text.Text` spans, never with markup in strings.
"""

from __future__ import annotations

from typing import Literal, TextIO

from rich.console import Console


def text_console(
    file: TextIO, width: int, color: bool, color_system: Literal["auto", "standard"] = "auto"
) -> Console:
    """A console that writes to `file`, `width` cells wide, with ANSI colors only when `color` is set.

    Args:
        file: Where the text goes (a report renders into a buffer).
        width: Line width.
        color: ANSI colors; off, the text has no escape codes at all.
        color_system: rich's color system when `color` is set: "auto" detects the
            terminal's, "standard" keeps to the 16 ANSI colors.
    """
    return Console(
        file=file,
        width=width,
        force_terminal=color,
        no_color=not color,
        color_system=color_system if color else None,
        highlight=False,
        markup=False,
        emoji=False,
    )
