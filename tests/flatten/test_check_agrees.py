"""`flatten --check` and `flatten` agree on every format: the same refusal, or a change that flatten makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from memlayout.cli.app import main
from tests.flatten.sources import BUILDERS

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


@pytest.mark.parametrize("trust", [False, True], ids=["plain", "trust"])
@pytest.mark.parametrize("kind", BUILDERS)
def test_check_refuses_exactly_where_flatten_refuses(
    kind: str, trust: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = BUILDERS[kind](tmp_path)
    out = tmp_path / ("flat" + source.suffix)
    extra = ["--trust"] if trust else []
    code = main(["flatten", str(source), "-o", str(out), "--device", "cpu", *extra])
    flatten_err = capsys.readouterr().err
    check = main(["flatten", str(source), "--check", *extra])
    check_err = capsys.readouterr().err
    if code == 2:
        assert flatten_err.startswith("memlayout: error:") and flatten_err.count("\n") == 1
        assert (check, check_err) == (2, flatten_err)
        assert not out.exists()
    else:
        assert code == 0, flatten_err
        assert check in (0, 1) and check_err == ""
        # What flatten wrote is what --check calls flat.
        assert main(["flatten", str(out), "--check", *extra]) == 0, capsys.readouterr().out
