"""Record where cuDNN puts every RNN weight, for a grid of RNNs, on the GPU this runs on.

    python tests/cudnn/record_cudnn_layouts.py [OUT.json]

For LSTM, GRU, RNN_TANH and RNN_RELU with 1-3 layers, one or two directions,
with and without bias, and (LSTM) with and without `proj_size`, it builds the
module on CUDA, calls torch's own `flatten_parameters()`, and writes each
weight's element offset in the buffer cuDNN laid out, the buffer's length, and
the torch, cuDNN and GPU versions, as JSON. Commit the table under
tests/cudnn/tables/ (named after the cuDNN version): tests/core/test_cudnn_layout.py
checks `memlayout.core.cudnn_layout` against every table there. Without CUDA it
exits 2 and records nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

INPUT, HIDDEN, PROJ = 5, 7, 3


def grid() -> list[dict[str, Any]]:
    """Every RNN the table covers, as `nn.RNNBase` keyword arguments plus its mode."""
    cases = []
    for mode in ("LSTM", "GRU", "RNN_TANH", "RNN_RELU"):
        for layers in (1, 2, 3):
            for bidirectional in (False, True):
                for bias in (True, False):
                    for proj in (0, PROJ) if mode == "LSTM" else (0,):
                        cases.append({
                            "mode": mode, "input_size": INPUT, "hidden_size": HIDDEN, "num_layers": layers,
                            "bidirectional": bidirectional, "bias": bias, "proj_size": proj,
                        })
    return cases


def build(case: dict[str, Any], device: str = "cuda") -> Any:
    """The torch module for one grid case."""
    from torch import nn

    kwargs = {
        "num_layers": case["num_layers"], "bidirectional": case["bidirectional"], "bias": case["bias"],
    }
    if case["mode"] == "LSTM":
        module: nn.RNNBase = nn.LSTM(case["input_size"], case["hidden_size"], proj_size=case["proj_size"], **kwargs)
    elif case["mode"] == "GRU":
        module = nn.GRU(case["input_size"], case["hidden_size"], **kwargs)
    else:
        nonlinearity = "relu" if case["mode"] == "RNN_RELU" else "tanh"
        module = nn.RNN(case["input_size"], case["hidden_size"], nonlinearity=nonlinearity, **kwargs)
    return module.to(device)


def record_case(case: dict[str, Any]) -> dict[str, Any]:
    """Offsets of every weight after `flatten_parameters()` on CUDA, and the buffer's length."""
    module = build(case)
    module.flatten_parameters()
    weights = {name: getattr(module, name) for name in module._flat_weights_names}
    storage = module.weight_ih_l0.untyped_storage()
    return {
        **case,
        "one_storage": all(w.untyped_storage().data_ptr() == storage.data_ptr() for w in weights.values()),
        "offsets": {name: int(w.storage_offset()) for name, w in weights.items()},
        "numel": storage.nbytes() // module.weight_ih_l0.element_size(),
    }


def differences(recorded: dict[str, Any]) -> list[str]:
    """Where `memlayout.core.cudnn_layout` disagrees with one recorded case; empty when it agrees."""
    from memlayout.core.cudnn_layout import RnnGeometry, cudnn_layout

    geometry = RnnGeometry(
        recorded["mode"], recorded["input_size"], recorded["hidden_size"], recorded["num_layers"],
        recorded["bidirectional"], recorded["bias"], recorded["proj_size"],
    )
    layout = cudnn_layout(geometry)
    found = []
    if not recorded["one_storage"]:
        found.append("flatten_parameters() left the weights in several storages")
    for slot in layout.slots:
        if recorded["offsets"].get(slot.name) != slot.offset:
            found.append(f"{slot.name}: cuDNN put it at {recorded['offsets'].get(slot.name)}, memlayout at "
                         f"{slot.offset}")
    if recorded["numel"] != layout.numel:
        found.append(f"buffer: cuDNN's holds {recorded['numel']} elements, memlayout's {layout.numel}")
    return found


def pack_by_layout_module(module: Any) -> None:
    """Put an RNN's weights where `memlayout.core.cudnn_layout` says, in one new buffer, with no help from cuDNN.

    The GPU test and benchmark then ask cuDNN whether it runs from that buffer in place.
    """
    import torch

    from memlayout.core.cudnn_layout import RnnGeometry, cudnn_layout, geometry_from_shapes

    shapes = {name: tuple(getattr(module, name).shape) for name in module._flat_weights_names}
    geometry = geometry_from_shapes(module.mode, shapes)
    assert isinstance(geometry, RnnGeometry), geometry
    layout = cudnn_layout(geometry)
    flat = torch.zeros(layout.numel, device=module.weight_ih_l0.device, dtype=module.weight_ih_l0.dtype)
    with torch.no_grad():
        for slot in layout.slots:
            weight = getattr(module, slot.name)
            flat[slot.offset : slot.offset + slot.numel].copy_(weight.reshape(-1))
            weight.data = flat[slot.offset : slot.offset + slot.numel].view_as(weight)
    module._init_flat_weights()


def record() -> dict[str, Any]:
    """The whole table."""
    import torch

    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "device": torch.cuda.get_device_name(),
        "cases": [record_case(case) for case in grid()],
    }


def main(argv: list[str]) -> int:
    import torch

    if not torch.cuda.is_available():
        print("record_cudnn_layouts: no CUDA device here; nothing recorded", file=sys.stderr)
        return 2
    table = record()
    out = Path(argv[0]) if argv else Path(__file__).parent / "tables" / f"cudnn-{table['cudnn']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(table['cases'])} RNNs with cuDNN {table['cudnn']} into {out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    raise SystemExit(main(sys.argv[1:]))
