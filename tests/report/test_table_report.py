"""The terminal report renders facts and findings as text, without printing."""

from __future__ import annotations

import memlayout
from memlayout.report import OutputFormat, render
from tests import models


def test_table_shows_summary_storages_and_findings_with_hints() -> None:
    text = render(memlayout.inspect(models.sliced_bloat_state()), OutputFormat.TABLE)
    assert "storage bytes" in text and "wasted bytes" in text and "unique bytes" in text
    assert "storages" in text and "s0" in text
    assert "ML301" in text and "storage-bloat" in text and "hint:" in text
    assert "\x1b[" not in text  # no color codes unless asked for


def test_table_color_is_opt_in() -> None:
    text = render(memlayout.inspect(models.sliced_bloat_state()), OutputFormat.TABLE, color=True)
    assert "\x1b[" in text


def test_table_says_when_there_is_nothing_to_report() -> None:
    assert "no findings" in render(memlayout.inspect(models.cloned_slice_state()), OutputFormat.TABLE)


def test_long_storage_lists_are_capped_with_a_pointer_to_json() -> None:
    state = {f"t{i}": models.torch.randn(4) for i in range(60)}
    text = render(memlayout.inspect(state), OutputFormat.TABLE, width=200)
    assert "20 smaller storages not shown" in text
