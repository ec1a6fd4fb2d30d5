"""The brute force of test_segments_brute_force.py on larger spaces (hundreds of real steps a model): `make slow`."""

from __future__ import annotations

import os

import pytest

from tests.activations import brute_force, segment_models
from tests.activations.brute_force import Space
from tests.activations.plans.test_segments_brute_force import (
    Case,
    _blocks,
    _lowest_found,
    _top_level,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("MEMLAYOUT_SLOW") != "1", reason="hundreds of real steps: run `make slow`"),
]


def _block_parts(path: str) -> bool:
    """A block, or its attention or MLP."""
    return _blocks(path) or (path.count(".") == 2 and path.rsplit(".", 1)[1] in ("attn", "cross", "mlp"))


LARGE: dict[str, Case] = {
    # ten children (three conv/norm/ReLU blocks and the head): every set of runs (512), and each child alone
    "sequential-cnn": (lambda: segment_models.sequential_cnn((8, 16, 16)),
                       lambda: segment_models.inputs((8, 3, 32, 32)), Space(("",), _top_level, 1)),
    # Linear/Tanh x 4: every set of runs (128), with each child alone
    "sequential-mlp": (lambda: segment_models.sequential_mlp(depth=4), lambda: segment_models.inputs((1024, 64)),
                       Space(("",), _top_level, 1)),
    # four blocks: every set of runs of blocks, with up to two blocks, attentions or MLPs alone
    "list-transformer": (segment_models.list_transformer, lambda: segment_models.inputs((8, 64, 64)),
                         Space(("blocks",), _block_parts, 2)),
    # three encoder blocks and three decoder layers: every set of runs of each, with up to two blocks alone
    "encoder-decoder": (lambda: segment_models.EncoderDecoder(layers=3).train(),
                        lambda: segment_models.inputs((8, 48, 64), (8, 32, 64)),
                        Space(("encoder", "decoder"), _blocks, 2)),
}


@pytest.mark.parametrize("case", sorted(LARGE))
def test_the_lowest_plan_found_is_within_2_percent_of_a_larger_brute_force(case: str) -> None:
    build, make_inputs, space = LARGE[case]
    args, kwargs = make_inputs()
    best_plan, best, count = brute_force.lowest(build, args, kwargs, space)
    lowest = _lowest_found(build, args, kwargs)
    real = brute_force.real_peak(build, args, kwargs, lowest.plan)
    assert real <= 1.02 * best, (real, best, lowest.plan, best_plan, count)
    assert lowest.judged_bytes <= 1.02 * best, (lowest.judged_bytes, best, best_plan)
