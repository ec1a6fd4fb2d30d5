"""Real files of every format memlayout reads, written by the real writers, in `tests/corpus/seeds/`.

The fuzz harness mutates these, and the thread test inspects them side by side.
They are committed (184 KiB) because writing them takes seconds (torch.export);
`python -m tests.corpus.make_seeds` rewrites them.
Each writer is the library users run: `torch.save` (zip, legacy non-zip), the tar
fixtures (written by following torch's reader, proven by `torch.load`),
`torch.jit.save`, `torch.export.save`, `safetensors`, `save_pretrained`-shaped
folders and `torch.distributed.checkpoint.save`.
"""

from __future__ import annotations

import json
import shutil
import warnings
import zipfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "formats"
SEED_DIR = Path(__file__).resolve().parent / "seeds"
SEED_NAMES = (
    "state_dict.pt", "module.pt", "checkpoint.pt", "views.pt", "legacy.pt", "legacy_module.pt",
    "tar_state_dict.pt", "tar_module.pt", "script.pt", "model.pt2", "model_older.pt2", "model.safetensors",
    "hf_sharded", "hf_bin", "dcp",
)


def seed_paths() -> dict[str, Path]:
    """The committed seeds: name -> path."""
    return {name: SEED_DIR / name for name in SEED_NAMES}


def _model() -> object:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10), torch.nn.LSTM(4, 4))
    model[1].weight = model[0].weight  # a tie
    return model


def write_seeds(folder: Path) -> dict[str, Path]:
    """Write one small file (or folder) per format and shape into `folder`.

    Returns:
        name -> path, for: state_dict.pt, module.pt, checkpoint.pt (model +
        optimizer + epoch), views.pt, legacy.pt, legacy_module.pt, tar_state_dict.pt,
        tar_module.pt, script.pt, model.pt2 (and model_older.pt2, torch <= 2.7's layout), model.safetensors, hf_sharded/
        (config, two safetensors shards and their index), hf_bin/ (pytorch_model.bin), dcp/.
    """
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    model = _model()
    state = model.state_dict()  # type: ignore[attr-defined]
    paths: dict[str, Path] = {}

    def path(name: str) -> Path:
        paths[name] = folder / name
        return paths[name]

    torch.save(state, path("state_dict.pt"))
    torch.save(model, path("module.pt"))
    optimizer = torch.optim.Adam(model.parameters())  # type: ignore[attr-defined]
    model[1](model[0](torch.tensor([[1, 2]]))).sum().backward()  # type: ignore[index]
    optimizer.step()
    torch.save({"model": state, "optimizer": optimizer.state_dict(), "epoch": 3}, path("checkpoint.pt"))
    base = torch.arange(64, dtype=torch.float32)
    torch.save({"a": base[:8], "b": base[8:40].view(4, 8).t(), "c": base}, path("views.pt"))
    torch.save(state, path("legacy.pt"), _use_new_zipfile_serialization=False)
    torch.save(model, path("legacy_module.pt"), _use_new_zipfile_serialization=False)
    shutil.copyfile(FIXTURES / "legacy_tar_state_dict.pt", path("tar_state_dict.pt"))
    shutil.copyfile(FIXTURES / "legacy_tar_module.pt", path("tar_module.pt"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(torch.nn.Linear(3, 3)), path("script.pt"))
    program = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(1, 3),))
    torch.export.save(program, str(path("model.pt2")))
    # The layout torch.export.save wrote up to torch 2.7: the serializer's artifact
    # fields as zip members, the weights as nested torch.save archives.
    from torch._export.serde.schema import SCHEMA_VERSION
    from torch._export.serde.serialize import serialize

    artifact = serialize(program)
    with zipfile.ZipFile(path("model_older.pt2"), "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("serialized_exported_program.json", artifact.exported_program)
        archive.writestr("serialized_state_dict.pt", artifact.state_dict)
        archive.writestr("serialized_constants.pt", artifact.constants)
        archive.writestr("serialized_example_inputs.pt", artifact.example_inputs)
        archive.writestr("version", ".".join(map(str, SCHEMA_VERSION)))
    save_file({k: v.clone().contiguous() for k, v in state.items()}, path("model.safetensors"))

    sharded = path("hf_sharded")
    sharded.mkdir()
    (sharded / "config.json").write_text(json.dumps({"model_type": "toy", "tie_word_embeddings": True}))
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    weight_map = {}
    for shard, part in halves.items():
        save_file({n: state[n].clone().contiguous() for n in part}, sharded / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2)
    )
    binary = path("hf_bin")
    binary.mkdir()
    (binary / "config.json").write_text(json.dumps({"model_type": "toy"}))
    torch.save(state, binary / "pytorch_model.bin")

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {k: v.clone() for k, v in state.items()}, "step": torch.tensor(3)},
                 checkpoint_id=str(path("dcp")))
    return paths


if __name__ == "__main__":
    shutil.rmtree(SEED_DIR, ignore_errors=True)
    written = write_seeds(SEED_DIR)
    assert tuple(written) == SEED_NAMES, tuple(written)
    print(f"wrote {len(written)} seeds to {SEED_DIR}")
