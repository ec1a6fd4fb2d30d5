"""tools/import_rules.py, the lint check of what may be imported where, finds what it is there to find."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tools" / "import_rules.py"


def _rules() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_rules", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_rules"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN = {
    "memlayout/__init__.py": "",
    "memlayout/__main__.py": "from memlayout.cli.app import main\n",
    "memlayout/cli/__init__.py": "",
    "memlayout/cli/app.py": "import os\n\ndef main():\n    import rich\n"
                            "    from memlayout.cli.inspect_command import run\n",
    "memlayout/cli/inspect_command.py": "import rich\n\ndef run():\n    from memlayout.light import size\n",
    "memlayout/light.py": "import json\n\nsize = 1\n",
    "memlayout/heavy.py": "import torch\n",
    "memlayout/user.py": "from memlayout.light import size\n\ndef f():\n    from memlayout.heavy import torch\n",
    "memlayout/a.py": "from memlayout.b import g\n",
    "memlayout/b.py": "def g():\n    from memlayout.a import g\n",
}


def test_the_repository_keeps_the_rules() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stdout


def test_allowed_imports_pass(tmp_path: Path) -> None:
    # heavy at the top of a module start-up never loads, light inside a per-command module,
    # heavy inside a function, and the function-level half of a cycle
    rules = _rules()
    assert rules.violations(rules.Package(_package(tmp_path, CLEAN))) == []


def test_a_heavy_package_at_the_top_of_a_start_up_module_fails(tmp_path: Path) -> None:
    rules = _rules()
    planted = {**CLEAN, "memlayout/cli/app.py": "import rich\n\ndef main():\n    pass\n"}
    found = rules.violations(rules.Package(_package(tmp_path, planted)))
    assert [(v.path.name, v.line) for v in found] == [("app.py", 1)]
    assert "start-up" in found[0].text


def test_heavy_reached_through_a_light_looking_module_counts(tmp_path: Path) -> None:
    rules = _rules()
    planted = {**CLEAN, "memlayout/cli/app.py": "from memlayout.user import f\n",
               "memlayout/user.py": "import numpy\n\ndef f():\n    pass\n"}
    found = rules.violations(rules.Package(_package(tmp_path, planted)))
    assert [(v.path.name, v.line) for v in found] == [("user.py", 1)]


def test_a_light_module_imported_inside_a_function_fails(tmp_path: Path) -> None:
    rules = _rules()
    planted = {**CLEAN, "memlayout/user.py": "def f():\n    from memlayout.light import size\n"}
    found = rules.violations(rules.Package(_package(tmp_path, planted)))
    assert [(v.path.name, v.line) for v in found] == [("user.py", 2)]
    assert "import it at the top" in found[0].text
    assert rules.counts(rules.Package(tmp_path))["of light memlayout modules, not allowed"] == 1


def test_a_light_module_already_loaded_with_the_module_fails_inside_a_function(tmp_path: Path) -> None:
    rules = _rules()
    planted = {**CLEAN, "memlayout/a.py": "from memlayout.b import g\n\ndef h():\n    from memlayout.b import g\n"}
    found = rules.violations(rules.Package(_package(tmp_path, planted)))
    assert [(v.path.name, v.line) for v in found] == [("a.py", 4)]
