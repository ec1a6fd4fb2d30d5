"""cuDNN's RNN weight layout: where each weight of an LSTM, GRU or Elman RNN sits in
the one buffer cuDNN runs from, and whether a model's weights already sit there.

cuDNN runs a multi-layer RNN from one flat weight buffer. torch's `_cudnn_rnn`
uses the module's own memory as that buffer only when `try_get_weight_buf`
(aten/src/ATen/native/cudnn/RNN.cpp) accepts it: the buffer is the *whole
storage of the first weight, from element 0*, at least as long as cuDNN's
weight space (`get_num_weights`; a longer storage is cut to length), and every
weight's data pointer equals the pointer cuDNN reports for it
(`get_expected_data_ptrs`). Otherwise it warns "RNN module weights are not part
of single contiguous chunk of memory" and copies every weight on every call.

The layout, with W the weight matrices and b the bias vectors of one
pseudo-layer (a layer and a direction, forward first):

    W_ih(l0) W_hh(l0) [W_hr(l0)]  W_ih(l0 rev) W_hh(l0 rev) ...  W_ih(l1) ...
    b_ih(l0) b_hh(l0)             b_ih(l0 rev) b_hh(l0 rev) ...  b_ih(l1) ...

weight-or-bias is the outermost index, then layer, then direction, then
input/hidden, then gate (each matrix holds its gates back to back, which is
all torch's `get_parameters` asserts). This is *not* `_flat_weights_names`
order (per pseudo-layer: w_ih, w_hh, b_ih, b_hh, w_hr); the two agree only for
one unidirectional layer. torch always describes the RNN to cuDNN with
CUDNN_RNN_DOUBLE_BIAS, so the bias space is part of the buffer even for
`bias=False`: it stays zero, and the storage must still be that long.

Evidence, each a file that cuDNN itself flattened during training (pinned in
tests/realworld/corpus.py and checked offset by offset in tests/core/test_cudnn_layout.py):

- resemblyzer 0.1.4 `pretrained.pt`: a 3-layer unidirectional LSTM (input 40,
  hidden 256), legacy torch.save format, cuDNN 7 era;
- BeatNet 1.1.3 `model_1_weights.pt`: a 2-layer LSTM (150 -> 150), torch.save
  zip saved from cuda:0 (and `model-1.pt`, the pickled module);
- medaka 2.2.2 `r1041_e82_400bps_hac_v6.0.0` and `sup_v5.2.0` models: a 2-layer
  *bidirectional* GRU, saved from cuda:0 by torch versions recent enough to
  write the `byteorder` (and, for v6.0.0, `.storage_alignment`) records, so
  very likely with cuDNN 9 and torch's cuDNN v8 RNN API
  (`cudnnGetRNNWeightParams`). The files do not record the cuDNN version.

The ONNX OptimizedRNN description and MXNet's cuDNN bindings describe the same
order. Not settled by any file memlayout has seen, and not checkable without a
GPU:

- where `weight_hr` (LSTM `proj_size`) goes. It is placed right after
  `weight_hh` of the same pseudo-layer, among the matrices, which is how
  MXNet's fused LSTM with `projection_size` packs the buffer it hands to cuDNN
  (`h2r` after `i2h`, `h2h`); torch's `get_parameters` reads it through
  linLayerID 8 without checking its offset;
- whether every cuDNN version keeps this order. The GPU test in
  tests/flatten/test_gpu.py and `tests/gpu/record_cudnn_layouts.py` compare
  this module with what `flatten_parameters()` produces on the cuDNN installed.

Nothing here imports torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from memlayout.load.records import RnnRecord


class WeightView(Protocol):
    """What the layout check reads of one weight: facts' `TensorFact` has these fields.

    The layout knows nothing of how facts are built, so facts can ask it where
    each weight belongs without the two modules importing each other.
    """

    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def stride(self) -> tuple[int, ...]: ...
    @property
    def storage(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def contiguous(self) -> bool: ...


class StorageSize(Protocol):
    @property
    def nbytes(self) -> int: ...


class WeightLookup(Protocol):
    """A model's views by name and storages by key: what facts' `Facts` offers."""

    def tensor(self, name: str) -> WeightView | None: ...
    def storage(self, storage_id: str) -> StorageSize: ...

GATE_MULTIPLE = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1, "RNN": 1}
"""Rows of a weight matrix per hidden unit. "RNN" is an Elman RNN whose
non-linearity is unknown: tanh and relu have the same weights and layout."""

MODE_OF_GATE_MULTIPLE = {4: "LSTM", 3: "GRU", 1: "RNN"}

INFERRED_RNN_LABEL = "RNN (tanh or relu: the weights cannot tell)"
"""How an Elman RNN recognised from its weights alone is described."""

WEIGHT_KINDS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
"""The kinds of RNN weight in `_flat_weights_names` order within a layer and direction."""

WEIGHT_NAME = re.compile(
    rf"^(?P<prefix>.*?)(?P<kind>{'|'.join(WEIGHT_KINDS)})_l(?P<layer>\d+)(?P<reverse>_reverse)?(?P<raw>_raw)?$"
)
"""A dotted RNN weight name: module prefix, kind, layer, direction, and the `_raw`
suffix weight-dropout wrappers give the Parameter they keep."""


@dataclass(frozen=True)
class RnnGeometry:
    """What fixes an RNN's weight shapes and cuDNN layout."""

    mode: str
    """"LSTM", "GRU", "RNN_TANH", "RNN_RELU", or "RNN" (tanh or relu, unknown)."""
    input_size: int
    hidden_size: int
    num_layers: int = 1
    bidirectional: bool = False
    bias: bool = True
    proj_size: int = 0
    """LSTM projection size; 0 for none."""

    @property
    def gates(self) -> int:
        return GATE_MULTIPLE[self.mode]

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def output_size(self) -> int:
        """Features each direction passes on: the projection when there is one."""
        return self.proj_size or self.hidden_size


class WeightSlot(NamedTuple):
    """One weight's place in cuDNN's buffer."""

    name: str
    """The RNN's own name for it, e.g. "weight_hh_l1_reverse"."""
    shape: tuple[int, ...]
    offset: int
    """Element offset from the start of the buffer."""

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count


@dataclass(frozen=True)
class CudnnLayout:
    """Every weight's place in cuDNN's flat buffer, and the buffer's length."""

    geometry: RnnGeometry
    slots: tuple[WeightSlot, ...]
    """In `_flat_weights_names` order (the order torch passes weights to cuDNN)."""
    numel: int
    """Elements cuDNN's weight space holds: every matrix, and two bias vectors per
    pseudo-layer even when the RNN has no bias."""

    def slot(self, name: str) -> WeightSlot:
        """The slot of a weight by its RNN-local name ("bias_ih_l0")."""
        for slot in self.slots:
            if slot.name == name:
                return slot
        raise KeyError(name)


def _suffix(layer: int, direction: int) -> str:
    return f"_l{layer}{'_reverse' if direction else ''}"


def weight_shapes(geometry: RnnGeometry) -> dict[str, tuple[int, ...]]:
    """Every weight's name and shape, in `_flat_weights_names` order (as `nn.RNNBase` builds them).

    Args:
        geometry: The RNN.

    Returns:
        RNN-local name -> shape.
    """
    rows = geometry.gates * geometry.hidden_size
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(geometry.num_layers):
        layer_input = geometry.input_size if layer == 0 else geometry.output_size * geometry.directions
        for direction in range(geometry.directions):
            suffix = _suffix(layer, direction)
            shapes[f"weight_ih{suffix}"] = (rows, layer_input)
            shapes[f"weight_hh{suffix}"] = (rows, geometry.output_size)
            if geometry.bias:
                shapes[f"bias_ih{suffix}"] = (rows,)
                shapes[f"bias_hh{suffix}"] = (rows,)
            if geometry.proj_size:
                shapes[f"weight_hr{suffix}"] = (geometry.proj_size, geometry.hidden_size)
    return shapes


def cudnn_layout(geometry: RnnGeometry) -> CudnnLayout:
    """Where cuDNN puts each weight of `geometry` in its flat buffer.

    Args:
        geometry: The RNN.

    Returns:
        The layout: matrices of every pseudo-layer first (w_ih, w_hh, w_hr), then
        the biases in the same order, bias space kept when `bias` is False.

    Example:
        >>> layout = cudnn_layout(RnnGeometry("LSTM", 40, 256, num_layers=3))
        >>> layout.slot("bias_ih_l0").offset, layout.numel
        (1351680, 1357824)
    """
    shapes = weight_shapes(geometry)
    rows = geometry.gates * geometry.hidden_size
    offsets: dict[str, int] = {}
    cursor = 0
    pseudo_layers = [(layer, d) for layer in range(geometry.num_layers) for d in range(geometry.directions)]
    for layer, direction in pseudo_layers:
        suffix = _suffix(layer, direction)
        for kind in ("weight_ih", "weight_hh", "weight_hr"):
            name = kind + suffix
            if name in shapes:
                offsets[name] = cursor
                cursor += WeightSlot(name, shapes[name], 0).numel
    for layer, direction in pseudo_layers:
        suffix = _suffix(layer, direction)
        for kind in ("bias_ih", "bias_hh"):
            # The space is there whether or not the RNN has biases.
            if kind + suffix in shapes:
                offsets[kind + suffix] = cursor
            cursor += rows
    slots = tuple(WeightSlot(name, shape, offsets[name]) for name, shape in shapes.items())
    return CudnnLayout(geometry, slots, cursor)


def local_name(name: str) -> str:
    """The RNN's own name for a weight reached by a dotted path ("enc.lstm.weight_ih_l0" -> "weight_ih_l0")."""
    return name.rsplit(".", 1)[-1]


def geometry_from_shapes(mode: str | None, shapes: Mapping[str, tuple[int, ...]]) -> RnnGeometry | str:
    """The RNN that has exactly these weights, or why no torch RNN has them.

    The mode comes from the gate multiple when not given: `weight_ih` has
    gates x hidden rows, and the hidden size is `weight_hh`'s column count, or
    `weight_hr`'s with a projection (whose `weight_hh` columns are the projection).

    Args:
        mode: "LSTM", "GRU", "RNN_TANH", "RNN_RELU" when the module says so; None
            to infer it ("RNN" for gate multiple 1: tanh and relu look the same).
        shapes: RNN-local weight name -> shape.

    Returns:
        The geometry, or a sentence saying what does not fit.
    """
    parsed = {}
    for name in shapes:
        match = WEIGHT_NAME.match(name)
        if match is None or match["prefix"] or match["raw"]:
            return f"{name} is not an RNN weight name"
        parsed[name] = (match["kind"], int(match["layer"]), bool(match["reverse"]))
    if "weight_ih_l0" not in shapes or "weight_hh_l0" not in shapes:
        return "it has no weight_ih_l0 and weight_hh_l0"
    ih, hh, hr = shapes["weight_ih_l0"], shapes["weight_hh_l0"], shapes.get("weight_hr_l0")
    if len(ih) != 2 or len(hh) != 2 or (hr is not None and len(hr) != 2):
        return "its weight matrices are not 2-D"
    hidden = hr[1] if hr is not None else hh[1]
    if hidden <= 0 or ih[0] % hidden:
        return f"weight_ih_l0 has {ih[0]} rows, not a multiple of the hidden size {hidden}"
    gates = ih[0] // hidden
    if mode is None:
        if gates not in MODE_OF_GATE_MULTIPLE:
            return f"weight_ih_l0 has {gates} x {hidden} rows; LSTM has 4, GRU 3, RNN 1 per hidden unit"
        mode = MODE_OF_GATE_MULTIPLE[gates]
    elif mode not in GATE_MULTIPLE:
        return f"mode {mode} is not one cuDNN runs"
    elif GATE_MULTIPLE[mode] != gates:
        return f"weight_ih_l0 has {gates} x {hidden} rows, but a {mode} has {GATE_MULTIPLE[mode]} per hidden unit"
    geometry = RnnGeometry(
        mode=mode,
        input_size=ih[1],
        hidden_size=hidden,
        num_layers=1 + max(layer for _, layer, _ in parsed.values()),
        bidirectional=any(reverse for _, _, reverse in parsed.values()),
        bias="bias_ih_l0" in shapes,
        proj_size=hr[0] if hr is not None else 0,
    )
    if geometry.proj_size and mode != "LSTM":
        return f"a {mode} has no projection (weight_hr)"
    expected = weight_shapes(geometry)
    for name, shape in expected.items():
        if name not in shapes:
            return f"it has no {name}"
        if tuple(shapes[name]) != shape:
            return f"{name} is {list(shapes[name])}, a {mode} like this one has {list(shape)}"
    extra = sorted(set(shapes) - set(expected))
    if extra:
        return f"{extra[0]} does not belong to a {mode} like this one"
    return geometry


def rnn_weight_facts(facts: WeightLookup, rnn: RnnRecord) -> list[WeightView] | str:
    """The RNN's weights' facts in `_flat_weights_names` order, or which is missing."""
    weights = []
    for name in rnn.flat_weight_names:
        tensor = facts.tensor(name)
        if tensor is None:
            return f"weight {name} is missing"
        weights.append(tensor)
    return weights


def layout_of(facts: WeightLookup, rnn: RnnRecord) -> CudnnLayout | str:
    """cuDNN's layout for an RNN of a model, from its weights' shapes.

    Args:
        facts: The model's facts.
        rnn: The RNN's record (mode and weight names).

    Returns:
        The layout, or why its weights do not form the RNN the record names.
    """
    weights = rnn_weight_facts(facts, rnn)
    if isinstance(weights, str):
        return weights
    shapes = {local_name(n): w.shape for n, w in zip(rnn.flat_weight_names, weights, strict=True)}
    geometry = geometry_from_shapes(rnn.mode, shapes)
    if isinstance(geometry, str):
        return f"its weights do not form a {rnn.mode}: {geometry}"
    return cudnn_layout(geometry)


def rnn_layout_problem(facts: WeightLookup, rnn: RnnRecord) -> str | None:
    """Why cuDNN would copy this RNN's weights on every call, or None when it uses them in place.

    Follows `try_get_weight_buf`: the buffer is the whole storage of the first
    weight from element 0, at least `CudnnLayout.numel` elements long, and every
    weight starts exactly where `cudnn_layout` puts it. (torch checks only the
    last weight's contiguity; a non-contiguous weight at the right address would
    make cuDNN read values the module does not hold, so every weight must be.)

    Args:
        facts: The model's facts.
        rnn: The RNN's record.

    Returns:
        None when cuDNN can run from the weights in place; otherwise one clause
        that names the first weight out of place and the element cuDNN expects it at.
    """
    layout = layout_of(facts, rnn)
    if isinstance(layout, str):
        return layout
    weights = rnn_weight_facts(facts, rnn)
    assert not isinstance(weights, str)
    first = weights[0]
    if len({w.dtype for w in weights}) > 1:
        return "its weights mix dtypes, which cuDNN cannot run from one buffer"
    storages = {w.storage for w in weights}
    if len(storages) == len(weights) > 1:
        return (
            f"its {len(weights)} weights live in {len(weights)} separate storages, "
            f"not in cuDNN's one buffer of {layout.numel} elements"
        )
    storage_numel = facts.storage(first.storage).nbytes // first.itemsize
    misplaced = []
    for name, weight in zip(rnn.flat_weight_names, weights, strict=True):
        expected = layout.slot(local_name(name)).offset
        if weight.storage != first.storage:
            misplaced.append(
                f"weight {name} is in storage {weight.storage}, not in {first.storage} with {first.name}; "
                f"cuDNN expects it at element {expected} of that storage"
            )
        elif weight.offset != expected:
            misplaced.append(f"weight {name} is at element {weight.offset}; cuDNN expects it at element {expected}")
        elif not weight.contiguous:
            misplaced.append(f"weight {name} is not contiguous (stride {list(weight.stride)})")
    if misplaced:
        more = len(misplaced) - 1
        return misplaced[0] + (f" ({more} more weight{'s' if more > 1 else ''} out of place)" if more else "")
    if storage_numel < layout.numel:
        return (
            f"storage {first.storage} holds {storage_numel} elements, but cuDNN's buffer for this "
            f"{layout.geometry.mode} is {layout.numel} (bias space included)"
        )
    return None


def unused_bias_numel(layout: CudnnLayout) -> int:
    """Elements at the end of cuDNN's buffer kept for biases that an RNN without bias does not have.

    They are part of the weight space (`try_get_weight_buf` refuses a shorter
    storage) and stay zero, so they are not bloat.
    """
    if layout.geometry.bias:
        return 0
    return layout.numel - max(slot.offset + slot.numel for slot in layout.slots)
