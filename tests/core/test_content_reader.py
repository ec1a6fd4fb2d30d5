"""The content reader is built in one place, `core.content.content_reader` (issue 30 §4)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from memlayout.core.content import content_reader
from memlayout.core.fact_builder import build_facts
from memlayout.pipeline.inspection import load_target


def test_it_reads_a_files_values_by_the_facts_storages(tmp_path: Path) -> None:
    path = tmp_path / "a.pt"
    values = torch.arange(6, dtype=torch.float32)
    torch.save({"a": values, "b": values[2:4]}, path)
    with load_target(str(path)) as source:
        facts = build_facts(source)
        content = content_reader(source, facts)
        assert content is not None
        by_name = {t.names[0]: t for t in facts.tensors}
        # The reader hands back the bit patterns: NaN checks and hashes read bits, not floats.
        np.testing.assert_array_equal(content.array(by_name["a"]), values.numpy().view(np.uint32))
        np.testing.assert_array_equal(content.array(by_name["b"]), values[2:4].numpy().view(np.uint32))

