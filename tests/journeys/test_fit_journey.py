"""`--fit` as a user reads it: the plan it reports at the size after its answer is never worse than no plan.

Issue: `--fit seq` on an LSTM language model said the lowest-peak plan at one more token peaked above the step
with no plan at all (6,415,628 B against 6,364,492 B at seq 45 with --budget 6MiB). A search that checkpoints
something to reach a higher peak than checkpointing nothing has not found the lowest it can reach.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from memlayout.cli.app import app


def test_fit_seq_on_an_lstm_never_reports_a_plan_worse_than_none() -> None:
    result = CliRunner().invoke(app, ["activations", "tests.activations.models:lstm_lm", "--input", "int64[4,32]<500",
                                      "--fit", "seq", "--budget", "6MiB", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    fit = json.loads(result.stdout)["fit"]
    plain = {p["size"]: p["peak_bytes"] for p in fit["probes"] if not p["with_plan"]}
    planned = {p["size"]: p["peak_bytes"] for p in fit["probes"] if p["with_plan"]}
    assert planned, "the search with a plan ran"
    for size, peak in planned.items():
        if size in plain:
            assert peak <= plain[size], (size, peak, plain[size])
    with_plan, without = fit["with_plan"], fit["without_plan"]
    assert with_plan["size"] >= without["size"]
    if with_plan["size"] == without["size"]:
        assert with_plan["next_peak_bytes"] <= without["next_peak_bytes"]
