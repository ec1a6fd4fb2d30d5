"""The text `memlayout flatten` prints: built here, printed by the CLI."""

from __future__ import annotations

from memlayout.flatten.files import FlattenResult
from memlayout.format_bytes import human_bytes

SUMMARY_CHANGES = 5
"""How many changes the closing summary names."""

MIN_RATE_BYTES = 64 << 20
"""Below this much copied, flatten's time is its start-up and verification, not copying:
a 16-byte file "copied at 0.00 GB/s" says nothing, so no rate is printed."""


def _rate(result: FlattenResult) -> str:
    if result.bytes_copied < MIN_RATE_BYTES or result.seconds <= 0:
        return ""
    return f" ({result.bytes_copied / result.seconds / 1e9:.2f} GB/s copied)"


def _verified_lines(result: FlattenResult) -> list[str]:
    """What reading OUT back proved, one clause a line, each for the kind of change it covers."""
    if not result.verified:
        return [f"  verified  skipped ({result.unverified_reason or '--no-verify'})"]
    clauses = result.verification or ("OUT was read back",)
    return [f"  {'verified' if number == 0 else '':8}  {clause}" for number, clause in enumerate(clauses)]


def render_summary(result: FlattenResult) -> str:
    """The closing summary: storages, bytes, padding, time and throughput.

    Args:
        result: A result from `flatten_path`.

    Returns:
        Lines ending in a newline.
    """
    removed = result.bytes_before - (result.bytes_after - result.padding_bytes)
    lines = [
        f"flattened {result.source} -> {result.out} ({result.format})",
        f"  device    {result.device} ({result.device_reason})",
        f"  storages  {result.storages_before} -> {result.storages_after}",
        f"  bytes     {human_bytes(result.bytes_before)} -> {human_bytes(result.bytes_after)}"
        f" ({human_bytes(max(removed, 0))} bloat removed, {human_bytes(result.padding_bytes)} padding)",
        f"  time      {result.seconds:.3f} s{_rate(result)}",
        *_verified_lines(result),
    ]
    if result.already_flat:
        lines.insert(1, "  IN was already flat; OUT is a verified copy")
    else:
        # Say what changed, so that a rewrite is never mistaken for a copy (--check lists all).
        shown = list(result.changes[:SUMMARY_CHANGES])
        if len(result.changes) > SUMMARY_CHANGES:
            shown.append(f"... and {len(result.changes) - SUMMARY_CHANGES} more (--check lists them all)")
        lines[1:1] = [f"  changed   {change}" for change in shown]
    lines += [f"  note: {note}" for note in result.notes]
    return "\n".join(lines) + "\n"
