"""Telling a file's format never imports the loaders of directory formats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "fixtures" / "demo_checkpoint.pt"

_CHILD = """
import json, sys
from memlayout.load import load_path
with load_path(sys.argv[1]) as source:
    pass
print(json.dumps({"format": source.format,
                  "loaded": sorted(n for n in sys.modules if n.startswith("memlayout.load."))}))
"""


def test_loading_a_file_imports_no_directory_format() -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(DEMO)], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    assert report["format"] == "torch-zip"
    assert "memlayout.load.torch_zip" in report["loaded"]
    assert "memlayout.load.dcp" not in report["loaded"]
    assert "memlayout.load.hf_dir" not in report["loaded"]
