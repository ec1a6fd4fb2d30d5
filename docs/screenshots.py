"""Rewrite the storage-map screenshots of docs/diff.md (docs/*.png) in headless chromium.

Run from the repository root: `.venv/bin/python docs/screenshots.py`. It builds a
tiny GPT-2 from a config (no download), saves it and a copy with every tensor
cloned, and photographs `memlayout inspect --html` of the bundled demo checkpoint
and `memlayout diff --html` of the two GPT-2 files.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memlayout.cli.app import app  # noqa: E402
from tests.report.browser import launch_chromium, open_page  # noqa: E402


def main() -> None:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32)
        state = transformers.GPT2LMHeadModel(config).state_dict()
        torch.save(state, work / "gpt2.pt")
        torch.save({name: tensor.clone() for name, tensor in state.items()}, work / "gpt2_clone.pt")
        runner = CliRunner()
        runner.invoke(app, ["inspect", "fixtures/demo_checkpoint.pt", "--html", str(work / "demo.html")])
        os.chdir(work)  # short names in the diff's title
        runner.invoke(app, ["diff", "gpt2.pt", "gpt2_clone.pt", "--html", "diff.html"])
        os.chdir(ROOT)
        for browser in launch_chromium():
            page, _, _ = open_page(browser, work / "demo.html", width=1100, height=900)
            page.hover('.seg[data-t="11"]')
            page.screenshot(path=str(ROOT / "docs" / "storage_map.png"))
            page, _, _ = open_page(browser, work / "diff.html", width=1300, height=1000)
            page.click('.change:has-text("tie-lost")')
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(ROOT / "docs" / "storage_map_diff.png"))


if __name__ == "__main__":
    main()
