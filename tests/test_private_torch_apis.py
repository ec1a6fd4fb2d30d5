"""Every private torch API memlayout touches (`memlayout/_torch.py`), checked against the installed torch.

Each test calls the wrapper the way memlayout calls it and checks the behaviour
memlayout relies on, so a torch release that renames, re-signs or changes one of
them fails here, naming the API and the torch version, before it fails a
flatten or an activations trace somewhere far from the cause. The last test keeps
the promise of one module: no other module of memlayout touches a private torch name.
"""

from __future__ import annotations

import ast
import inspect
import os
import pickle
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from memlayout import _torch
from memlayout.errors import TorchNotInstalledError

PACKAGE = Path(__file__).resolve().parent.parent / "memlayout"


def changed(api: str, how: str) -> str:
    """The failure message: which API, what changed, in which torch."""
    return f"{api} changed in torch {torch.__version__}: {how} (memlayout relies on it through memlayout/_torch.py)"


def require_attribute(owner: Any, name: str, api: str) -> Any:
    if not hasattr(owner, name):
        pytest.fail(changed(api, "it no longer exists"))
    return getattr(owner, name)


# --- storages -----------------------------------------------------------------


def test_storage_id_is_shared_by_views_and_unique_per_live_storage() -> None:
    require_attribute(torch.UntypedStorage, "_cdata", "UntypedStorage._cdata")
    base = torch.zeros(16)
    other = torch.zeros(16)
    empties = [torch.empty(0).untyped_storage(), torch.empty(0).untyped_storage()]
    assert isinstance(_torch.storage_id(base.untyped_storage()), int), changed("UntypedStorage._cdata", "not an int")
    assert _torch.storage_id(base[4:].untyped_storage()) == _torch.storage_id(base.t().untyped_storage()), changed(
        "UntypedStorage._cdata", "two views of one storage report different identities"
    )
    assert _torch.storage_id(base.untyped_storage()) != _torch.storage_id(other.untyped_storage()), changed(
        "UntypedStorage._cdata", "two live storages report one identity"
    )
    # What data_ptr() cannot tell apart, and why memlayout keys live storages by _cdata.
    assert empties[0].data_ptr() == empties[1].data_ptr() == 0
    assert _torch.storage_id(empties[0]) != _torch.storage_id(empties[1]), changed(
        "UntypedStorage._cdata", "two empty storages report one identity"
    )


def test_internal_overlap_is_seen_in_expanded_views_only() -> None:
    require_attribute(torch, "_debug_has_internal_overlap", "torch._debug_has_internal_overlap")
    row = torch.zeros(1, 8)
    api = "torch._debug_has_internal_overlap"
    assert _torch.has_internal_overlap(row.expand(4, 8)), changed(api, "an expanded view is not reported as overlapping")
    assert not _torch.has_internal_overlap(torch.zeros(4, 8).t()), changed(api, "a transposed tensor is reported")
    assert not _torch.has_internal_overlap(torch.zeros(4, 8)[:, ::2]), changed(api, "a strided slice is reported")


# --- RNNs ---------------------------------------------------------------------


@pytest.fixture
def lstm() -> torch.nn.LSTM:
    torch.manual_seed(0)
    return torch.nn.LSTM(6, 4, num_layers=2, bidirectional=True, proj_size=3)


def test_rnn_flat_weight_names_list_every_weight_in_kernel_order(lstm: torch.nn.LSTM) -> None:
    api = "RNNBase._flat_weights_names"
    require_attribute(lstm, "_flat_weights_names", api)
    names = _torch.rnn_flat_weight_names(lstm)
    # Per layer and direction: w_ih, w_hh, b_ih, b_hh, w_hr, as RNNBase registers them.
    expected = [
        f"{kind}_l{layer}{suffix}"
        for layer in range(2)
        for suffix in ("", "_reverse")
        for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr")
    ]
    assert list(names) == expected, changed(api, f"the names or their order differ: {list(names)}")


def test_rnn_flat_weights_are_the_modules_own_parameter_objects(lstm: torch.nn.LSTM) -> None:
    api = "RNNBase._flat_weights"
    require_attribute(lstm, "_flat_weights", api)
    names = _torch.rnn_flat_weight_names(lstm)
    weights = _torch.rnn_flat_weights(lstm)
    assert [id(w) for w in weights] == [id(getattr(lstm, n)) for n in names], changed(
        api, "the list does not hold the module's Parameter objects in _flat_weights_names order"
    )


def test_refreshing_rnn_flat_weights_makes_the_kernel_use_re_pointed_memory(lstm: torch.nn.LSTM) -> None:
    api = "RNNBase._init_flat_weights"
    method = require_attribute(lstm, "_init_flat_weights", api)
    assert list(inspect.signature(method).parameters) == [], changed(api, "it now takes arguments")
    inputs = torch.randn(5, 2, 6)
    expected, _ = lstm(inputs)
    # What flatten does: every weight's .data re-pointed into one buffer, objects kept.
    weights = _torch.rnn_flat_weights(lstm)
    flat = torch.cat([w.detach().reshape(-1) for w in weights])
    offset = 0
    with torch.no_grad():
        for weight in weights:
            weight.data = flat[offset : offset + weight.numel()].view_as(weight)
            offset += weight.numel()
    _torch.refresh_rnn_flat_weights(lstm)
    start, end = flat.data_ptr(), flat.data_ptr() + flat.nbytes
    assert all(start <= w.data_ptr() < end for w in _torch.rnn_flat_weights(lstm)), changed(
        api, "after it runs, the weights the kernel is given are not the re-pointed ones"
    )
    actual, _ = lstm(inputs)
    assert torch.equal(actual, expected), changed(api, "the RNN computes something else after it runs")


def test_cudnn_rnn_flatten_weight_takes_the_arguments_memlayout_passes() -> None:
    api = "torch._cudnn_rnn_flatten_weight"
    require_attribute(torch, "_cudnn_rnn_flatten_weight", api)
    require_attribute(torch, "_use_cudnn_rnn_flatten_weight", "torch._use_cudnn_rnn_flatten_weight")
    schema = torch.ops.aten._cudnn_rnn_flatten_weight.default._schema
    names = [argument.name for argument in schema.arguments]
    assert names == [
        "weight_arr", "weight_stride0", "input_size", "mode", "hidden_size", "proj_size", "num_layers",
        "batch_first", "bidirectional",
    ], changed(api, f"its arguments are now {names}")
    assert isinstance(_torch.cudnn_flattens_rnn_weights(), bool)
    wrapper = list(inspect.signature(_torch.cudnn_rnn_flatten_weight).parameters)
    assert wrapper == ["weights", *names[1:]], "memlayout/_torch.py passes the arguments in another order than torch's"


# A CUDA build without a GPU (CI, most laptops) has cuDNN's library but no device to run it on:
# torch.backends.cudnn.is_available() says only the former, so the device is asked for too.
@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.backends.cudnn.is_available()), reason="needs a CUDA device with cuDNN"
)
def test_cudnn_rnn_flatten_weight_lays_weights_out_as_flatten_parameters_does() -> None:
    from torch.backends.cudnn import rnn

    torch.manual_seed(0)
    module = torch.nn.LSTM(6, 4, num_layers=2).cuda()
    loose = [w.detach().clone() for w in _torch.rnn_flat_weights(module)]
    module.flatten_parameters()
    with torch.no_grad():
        _torch.cudnn_rnn_flatten_weight(loose, 4, 6, rnn.get_cudnn_mode("LSTM"), 4, 0, 2, False, False)
    base, expected_base = loose[0].data_ptr(), _torch.rnn_flat_weights(module)[0].data_ptr()
    offsets = [w.data_ptr() - base for w in loose]
    expected = [w.data_ptr() - expected_base for w in _torch.rnn_flat_weights(module)]
    assert offsets == expected, changed("torch._cudnn_rnn_flatten_weight", "it lays the weights out differently")


# --- torch.save and torch.load's own code ----------------------------------------


class ZipRecords:
    """torch's zip reader's questions, answered from a torch.save file through Python's zipfile."""

    def __init__(self, path: Path) -> None:
        self.archive = zipfile.ZipFile(path)
        self.prefix = self.archive.namelist()[0].split("/")[0] + "/"

    def has_record(self, name: str) -> bool:
        return self.prefix + name in self.archive.namelist()

    def get_record(self, name: str) -> bytes:
        return self.archive.read(self.prefix + name)

    def get_storage_from_record(self, name: str, nbytes: int, storage_type: Any) -> torch.Tensor:
        return torch.frombuffer(bytearray(self.archive.read(self.prefix + name)[:nbytes]), dtype=torch.uint8)

    def serialization_id(self) -> str:
        name = ".data/serialization_id"
        return self.get_record(name).decode() if self.has_record(name) else ""


class Recorder:
    """torch's zip writer's calls, kept."""

    def __init__(self) -> None:
        self.records: dict[str, bytes] = {}

    def write_record(self, name: str, data: Any, nbytes: int) -> None:
        if isinstance(data, str):
            data = data.encode("utf-8")
        elif isinstance(data, torch.UntypedStorage):
            data = torch.empty(0, dtype=torch.uint8).set_(data).numpy().tobytes()
        self.records[name] = bytes(data)[:nbytes]

    def write_record_metadata(self, name: str, nbytes: int) -> None:
        raise AssertionError("skip_data is off")


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    weight = torch.randn(8, 4)
    state = {"embed.weight": weight, "head.weight": weight, "bias": torch.arange(4.0)[1:]}
    path = tmp_path / "model.pt"
    torch.save(state, path)
    return path, state


def test_torch_loads_a_pickle_through_a_reader_of_ours(saved: tuple[Path, dict[str, torch.Tensor]]) -> None:
    api = "torch.serialization._load"
    load = require_attribute(torch.serialization, "_load", api)
    parameters = list(inspect.signature(load).parameters)
    assert parameters[:3] == ["zip_file", "map_location", "pickle_module"], changed(api, f"its parameters: {parameters}")
    path, _ = saved
    tree = _torch.load_pickle_from_records(ZipRecords(path), _torch.weights_only_unpickler())
    expected = torch.load(path, weights_only=True)
    assert list(tree) == list(expected), changed(api, "the keys differ from torch.load's")
    for name, tensor in expected.items():
        assert torch.equal(tree[name], tensor) and tree[name].stride() == tensor.stride(), changed(
            api, f"{name} differs from torch.load's"
        )
    assert tree["embed.weight"].data_ptr() == tree["head.weight"].data_ptr(), changed(
        api, "a tie is loaded as two storages"
    )


def test_torch_saves_a_pickle_through_a_writer_of_ours(saved: tuple[Path, dict[str, torch.Tensor]]) -> None:
    api = "torch.serialization._save"
    save = require_attribute(torch.serialization, "_save", api)
    parameters = list(inspect.signature(save).parameters)
    assert parameters == ["obj", "zip_file", "pickle_module", "pickle_protocol", "_disable_byteorder_record"], changed(
        api, f"its parameters: {parameters}"
    )
    path, state = saved
    recorder = Recorder()
    _torch.save_pickle_to_records(state, recorder, pickle)
    with zipfile.ZipFile(path) as archive:
        prefix = archive.namelist()[0].split("/")[0] + "/"
        written = {name.removeprefix(prefix): archive.read(name) for name in archive.namelist()}
    assert recorder.records["data.pkl"] == written["data.pkl"], changed(api, "data.pkl differs from torch.save's")
    storages = {name for name in recorder.records if name.startswith("data/")}
    assert storages == {name for name in written if name.startswith("data/")}, changed(
        api, f"it writes other storage records: {sorted(storages)}"
    )
    for name in storages:
        assert recorder.records[name] == written[name], changed(api, f"{name} holds other bytes")


def test_the_weights_only_unpickler_refuses_what_torch_load_refuses(tmp_path: Path) -> None:
    api = "torch._weights_only_unpickler"
    unpickler = _torch.weights_only_unpickler()
    require_attribute(unpickler, "Unpickler", api)
    path = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    with pytest.raises(pickle.UnpicklingError):
        _torch.load_pickle_from_records(ZipRecords(path), unpickler)


# --- dispatch, autograd and fake tensors -----------------------------------------


def _ops_seen(run: Any) -> list[tuple[Any, dict[str, Any]]]:
    seen: list[tuple[Any, dict[str, Any]]] = []

    class Recording(_torch.TorchDispatchMode):  # type: ignore[no-untyped-call, misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            seen.append((func, dict(kwargs or {})))
            return func(*args, **(kwargs or {}))

    with Recording():
        run()
    return seen


def test_a_torch_dispatch_mode_sees_every_aten_op() -> None:
    x = torch.ones(3)
    seen = _ops_seen(lambda: (x + 1).sum())
    ops = [func for func, _ in seen]
    assert torch.ops.aten.add.Tensor in ops and torch.ops.aten.sum.default in ops, changed(
        "torch.utils._python_dispatch.TorchDispatchMode", f"a mode saw {ops}"
    )


def test_the_autograd_node_running_is_known_in_backward_and_carries_its_metadata() -> None:
    api = "torch._C._current_autograd_node"
    require_attribute(torch._C, "_current_autograd_node", api)
    assert _torch.current_autograd_node() is None, changed(api, "outside backward it is not None")
    x = torch.ones(3, requires_grad=True)
    y = (x * 2).sum()
    assert y.grad_fn is not None
    y.grad_fn.metadata["memlayout.test"] = "sum"
    seen: list[Any] = []

    class Watching(_torch.TorchDispatchMode):  # type: ignore[no-untyped-call, misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            node = _torch.current_autograd_node()
            if node is not None:
                seen.append(node.metadata.get("memlayout.test"))
            return func(*args, **(kwargs or {}))

    with Watching():
        y.backward()
    assert "sum" in seen, changed(api, "the node running in backward does not carry the metadata set on grad_fn")


def test_op_schemas_say_which_arguments_are_written_and_name_them() -> None:
    api = "OpOverload._schema"
    add_ = _torch.op_schema(torch.ops.aten.add_.Tensor)
    assert add_.arguments[0].alias_info is not None and add_.arguments[0].alias_info.is_write, changed(
        api, "an in-place op's first argument is not marked written"
    )
    assert _torch.op_schema(torch.ops.aten.add.Tensor).arguments[0].alias_info is None, changed(
        api, "an out-of-place op's argument is marked written"
    )
    dropout = {a.name: a for a in _torch.op_schema(torch.ops.aten.native_dropout.default).arguments}
    assert {"p", "train"} <= set(dropout), changed(api, f"dropout's arguments are {sorted(dropout)}")
    batch_norm = [a.name for a in _torch.op_schema(torch.ops.aten.native_batch_norm.default).arguments]
    # trace.py reads args[3] (running_mean) and args[5] (training) of native_batch_norm.
    assert batch_norm[3] == "running_mean" and batch_norm[5] == "training", changed(
        api, f"native_batch_norm's arguments are {batch_norm}"
    )
    scaled = _torch.op_schema(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
    assert "dropout_p" in [a.name for a in scaled.arguments] and hasattr(scaled.arguments[3], "default_value")


def test_moving_a_tensor_to_a_device_dispatches_a_device_copy_op_with_its_device() -> None:
    api = "aten._to_copy"
    ops = _torch.device_copy_ops()
    seen = _ops_seen(lambda: torch.ones(3).to("meta"))
    moves = [(func, kwargs) for func, kwargs in seen if func in ops]
    assert moves, changed(api, f".to('meta') dispatched {[func for func, _ in seen]}")
    assert any(kwargs.get("device") == torch.device("meta") for _, kwargs in moves), changed(
        api, "the op no longer takes the target device as the keyword `device`"
    )
    copy = [a.name for a in _torch.op_schema(torch.ops.aten.copy_.default).arguments]
    assert copy[:2] == ["self", "src"], changed("aten.copy_", f"its arguments are {copy}")


def test_cpu_attention_dispatches_the_fused_op_whose_flops_are_counted() -> None:
    op = _torch.cpu_flash_attention_op()
    if op is None:
        pytest.skip(f"torch {torch.__version__} has no aten._scaled_dot_product_flash_attention_for_cpu")
    q = torch.randn(1, 2, 8, 16)
    seen = _ops_seen(lambda: F.scaled_dot_product_attention(q, q, q))
    packets = {func.overloadpacket for func, _ in seen}
    assert op in packets, changed(
        "aten._scaled_dot_product_flash_attention_for_cpu", f"CPU attention dispatched {sorted(map(str, packets))}"
    )
    names = [a.name for a in _torch.op_schema(op.default).arguments]
    assert names[:3] == ["query", "key", "value"], changed("aten._scaled_dot_product_flash_attention_for_cpu", f"{names}")


def test_fake_tensors_have_shapes_and_strides_and_no_data() -> None:
    for name in ("FakeTensorMode", "FakeTensor"):
        module, attribute = _torch.PRIVATE_CLASSES[name]
        require_attribute(sys.modules.get(module) or __import__(module, fromlist=[attribute]), attribute, f"{module}.{attribute}")
    mode = _torch.FakeTensorMode(allow_non_fake_inputs=True)
    real = torch.randn(4, 5)
    with mode:
        made = torch.empty(6, 7).t()
        adopted = mode.from_tensor(real)
        total = made.sum() + adopted.sum()
    api = "torch._subclasses.fake_tensor"
    assert isinstance(made, _torch.FakeTensor) and isinstance(total, _torch.FakeTensor), changed(
        api, "a tensor made under FakeTensorMode is no FakeTensor"
    )
    assert made.shape == (7, 6) and made.stride() == (1, 7), changed(api, "a fake tensor's shape or strides are wrong")
    assert isinstance(adopted, _torch.FakeTensor) and adopted.shape == real.shape, changed(
        api, "FakeTensorMode.from_tensor does not give a fake tensor of the real one's shape"
    )


def test_mem_tracker_measures_a_step() -> None:
    tracker = _torch.MemTracker()
    model = torch.nn.Linear(64, 64)
    inputs = torch.randn(8, 64)
    tracker.track_external(model, inputs)
    with tracker:
        model(inputs).sum().backward()
    peak = sum(snapshot["Total"] for snapshot in tracker.get_tracker_snapshot("peak").values())
    parameters = sum(p.nbytes for p in model.parameters())
    assert peak >= 2 * parameters, changed(
        "torch.distributed._tools.mem_tracker.MemTracker", f"its peak {peak} is below parameters and gradients"
    )
    assert issubclass(_torch.FSDPMemTracker, _torch.MemTracker), changed(
        "torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker", "it is no MemTracker"
    )


def test_the_fake_process_group_plays_one_rank_of_many() -> None:
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("this torch is built without torch.distributed")
    dist.init_process_group("fake", store=_torch.FakeStore(), rank=1, world_size=4)
    try:
        assert (dist.get_rank(), dist.get_world_size()) == (1, 4), changed(
            "torch.testing._internal.distributed.fake_pg.FakeStore", "the fake group is not rank 1 of 4"
        )
        tensor = torch.ones(2)
        dist.all_reduce(tensor)  # no peers: returns without waiting
    finally:
        dist.destroy_process_group()


def test_ddps_default_bucket_caps_are_the_ones_it_builds_with() -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if not dist.is_available():
        pytest.skip("this torch is built without torch.distributed")
    dist.init_process_group("fake", store=_torch.FakeStore(), rank=0, world_size=2)
    try:
        config = DistributedDataParallel(torch.nn.Linear(2, 2))._bucket_config
    finally:
        dist.destroy_process_group()
    assert _torch.ddp_default_bucket_cap_mb() * 2**20 == config.bucket_bytes_cap, changed(
        "torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB", "DDP builds its buckets with another cap")
    assert _torch.ddp_first_bucket_bytes() == config.first_bucket_bytes_cap, changed(
        "torch.distributed._DEFAULT_FIRST_BUCKET_BYTES", "DDP's first bucket has another cap")


def test_ddp_builds_on_fake_tensors_with_its_parameter_check_skipped() -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if not dist.is_available():
        pytest.skip("this torch is built without torch.distributed")
    api = "torch.nn.parallel.distributed._verify_param_shape_across_processes"
    dist.init_process_group("fake", store=_torch.FakeStore(), rank=0, world_size=2)
    try:
        with _torch.FakeTensorMode() as mode:
            model = torch.nn.Linear(4, 4)
            # Without the skip, the check writes shapes into a fake tensor, which has no data: DDP refuses.
            with pytest.raises(RuntimeError):
                DistributedDataParallel(model)
            with _torch.ddp_parameter_check_skipped():
                wrapped = DistributedDataParallel(model)
        assert wrapped.module is model and mode is not None
    finally:
        dist.destroy_process_group()
    from torch.nn.parallel import distributed

    assert distributed._verify_param_shape_across_processes.__name__ == "_verify_param_shape_across_processes", changed(
        api, "the check is not put back")


def test_ddp_rebuilds_its_buckets_once_after_a_backward() -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if not dist.is_available():
        pytest.skip("this torch is built without torch.distributed")
    api = "DistributedDataParallel.reducer._rebuild_buckets"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        wrapped = DistributedDataParallel(model, bucket_cap_mb=1e-5)  # 10 bytes: a bucket closes at its first weight
        assert not _torch.ddp_rebuild_buckets(wrapped), changed(api, "it rebuilt before any backward")
        wrapped(torch.ones(3, 4)).sum().backward()
        assert _torch.ddp_rebuild_buckets(wrapped), changed(api, "it did not rebuild after the first backward")
        assert not _torch.ddp_rebuild_buckets(wrapped), changed(api, "it rebuilt twice")
        model.zero_grad()
        wrapped(torch.ones(3, 4)).sum().backward()
        logged = wrapped._get_ddp_logging_data()
        # Backward's order: the last layer's bias (8 bytes, under the cap) and weight, then the first layer's two.
        assert logged["has_rebuilt_buckets"] and logged["rebuilt_bucket_sizes"] == "40, 16, 64", changed(
            api, f"DDP did not keep the buckets rebuilt by hand: {logged['rebuilt_bucket_sizes']}")
    finally:
        dist.destroy_process_group()


def test_a_dtensor_pieces_offset_follows_its_placements() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from memlayout.activations.ranks.rank_step import fake_world

    with fake_world(4, 2):
        mesh = init_device_mesh("cpu", (4,))
        whole = distribute_tensor(torch.zeros(10, 6), mesh, [Shard(0)])  # torch.chunk: rows 3, 3, 3, 1
        columns = distribute_tensor(torch.zeros(4, 8), mesh, [Shard(1)])
        assert _torch.dtensor_global_offset(whole) == (6, 0) and tuple(whole.to_local().shape) == (3, 6)
        assert _torch.dtensor_global_offset(columns) == (0, 4)


def test_every_private_class_resolves() -> None:
    for name, (module, attribute) in _torch.PRIVATE_CLASSES.items():
        try:
            value = getattr(_torch, name)
        except (ImportError, AttributeError) as exc:
            pytest.fail(changed(f"{module}.{attribute}", f"it cannot be imported ({exc})"))
        assert isinstance(value, type), changed(f"{module}.{attribute}", "it is no class")
    with pytest.raises(AttributeError):
        _torch.NoSuchClass  # noqa: B018


def test_parameter_of_class_shares_the_data_and_keeps_the_subclass() -> None:
    class Tagged(torch.nn.Parameter):
        pass

    data = torch.ones(3)
    made = _torch.parameter_of_class(Tagged, data, False)
    assert type(made) is Tagged and made.data_ptr() == data.data_ptr() and not made.requires_grad


# --- torch missing ------------------------------------------------------------------


def test_require_names_the_extra_when_torch_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    _torch.require("flatten")  # installed here: nothing to say
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(TorchNotInstalledError) as raised:
        _torch.require("flatten")
    assert raised.value.one_line() == (
        "flatten needs torch, which is not installed (install it with: pip install 'memlayout[torch]')"
    )


# --- one module ---------------------------------------------------------------------

# Attributes that are private to torch whatever object they are read from.
_PRIVATE_ATTRIBUTES = {
    "_cdata", "_flat_weights", "_flat_weights_names", "_init_flat_weights", "_schema", "_overloadpacket",
    "_parameters", "_buffers", "_modules",
}


def _private_uses(source: str, label: str) -> list[str]:
    found = []
    tree = ast.parse(source, label)
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if id(node) in inner:
            continue  # part of a longer attribute chain, seen whole
        where = f"{label}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Attribute):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if node.attr in _PRIVATE_ATTRIBUTES:
                found.append(f"{where}: .{node.attr}")
            names = [".".join([value.id, *reversed(chain)])] if isinstance(value, ast.Name) else []
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in ("torch", "atexit") and any(p.startswith("_") and not p.startswith("__") for p in parts):
                found.append(f"{where}: {name}")
    return found


def test_no_module_but_memlayout_torch_touches_a_private_torch_name() -> None:
    uses = [
        use
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "_torch.py"
        for use in _private_uses(path.read_text(), str(path.relative_to(PACKAGE.parent)))
    ]
    assert uses == [], "private torch (or CPython) names outside memlayout/_torch.py:\n" + "\n".join(uses)


def test_the_scan_finds_private_names() -> None:
    # The scan above proves nothing if it cannot see a use: show it one of each kind.
    sample = (
        "import torch._weights_only_unpickler\nfrom torch.utils._python_dispatch import TorchDispatchMode\n"
        "node = torch._C._current_autograd_node()\nkey = storage._cdata\natexit._run_exitfuncs()\n"
        "state = module.state_dict()\nname = torch.__version__\n"
    )
    assert sorted(use.split(": ")[1] for use in _private_uses(sample, "sample")) == [
        "._cdata", "atexit._run_exitfuncs", "torch._C._current_autograd_node", "torch._weights_only_unpickler",
        "torch.utils._python_dispatch", "torch.utils._python_dispatch.TorchDispatchMode",
    ]


def test_fake_mode_names_the_op_that_needs_a_value_and_can_be_set_aside() -> None:
    mode = _torch.FakeTensorMode()
    with mode:
        fake = torch.empty(4)
        with pytest.raises(_torch.DataDependentOutputException) as read:
            fake.sum().item()
        with pytest.raises(_torch.DynamicOutputShapeException) as shaped:
            fake.nonzero()
        with _torch.unset_fake_temporarily():
            real = torch.ones(3)
    api = "torch._subclasses.fake_tensor"
    assert str(read.value.func) == "aten._local_scalar_dense.default", changed(api, f".item() raised for {read.value.func}")
    assert str(shaped.value.func) == "aten.nonzero.default", changed(api, f"nonzero raised for {shaped.value.func}")
    assert not isinstance(real, _torch.FakeTensor) and real.sum().item() == 3, changed(
        "torch._subclasses.fake_tensor.unset_fake_temporarily", "a tensor made inside it is fake"
    )


def test_pytree_takes_an_op_s_arguments_apart_and_back() -> None:
    api = "torch.utils._pytree"
    tree = ((torch.ones(2), [3, torch.zeros(1)]), {"scale": 2.0, "mask": torch.ones(1, dtype=torch.bool)})
    leaves, spec = _torch.tree_flatten(tree)
    assert sum(isinstance(leaf, torch.Tensor) for leaf in leaves) == 3, changed(api, f"the leaves are {leaves}")
    rebuilt = _torch.tree_unflatten([leaf * 1 if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)
    assert rebuilt[1]["scale"] == 2.0 and torch.equal(rebuilt[0][1][1], torch.zeros(1)), changed(api, "no round trip")
    mapped = _torch.tree_map(lambda leaf: "t" if isinstance(leaf, torch.Tensor) else leaf, tree)
    assert mapped == (("t", [3, "t"]), {"scale": 2.0, "mask": "t"}), changed(api, f"tree_map gave {mapped}")


def test_a_module_s_tensor_slots_hold_what_it_registered() -> None:
    api = "Module._parameters / Module._buffers"
    module = torch.nn.BatchNorm1d(4)
    parameters, buffers = _torch.module_tensor_slots(module)
    assert parameters["weight"] is module.weight and buffers["running_mean"] is module.running_mean, changed(
        api, "the dicts do not hold the registered tensors"
    )
    replacement = torch.nn.Parameter(torch.zeros(4))
    parameters["weight"] = replacement
    assert module.weight is replacement and dict(module.named_parameters())["weight"] is replacement, changed(
        api, "setting an entry does not swap the module's tensor"
    )


def test_refresh_sets_what_init_flat_weights_sets_except_the_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    # refresh_rnn_flat_weights is RNNBase._init_flat_weights without its flatten_parameters()
    # call: the same attributes, holding the same objects.
    api = "RNNBase._init_flat_weights"
    calls: list[object] = []
    monkeypatch.setattr(torch.nn.RNNBase, "flatten_parameters", lambda self: calls.append(self))
    torch.manual_seed(0)
    reference, ours = torch.nn.LSTM(6, 8, num_layers=2), torch.nn.LSTM(6, 8, num_layers=2)
    for module in (reference, ours):
        module.weight_hh_l0 = torch.nn.Parameter(module.weight_hh_l0.detach().clone())
    calls.clear()  # building an RNN lays it out too
    before = dict(vars(reference))
    reference._init_flat_weights()
    changed_names = {k for k, v in vars(reference).items() if before.get(k, object()) is not v}
    assert changed_names == {"_flat_weights", "_flat_weight_refs"}, changed(api, f"it now sets {sorted(changed_names)}")
    assert calls == [reference], changed(api, "it no longer ends by calling flatten_parameters()")
    _torch.refresh_rnn_flat_weights(ours)
    assert calls == [reference]
    assert [id(w) for w in ours._flat_weights] == [id(getattr(ours, n)) for n in ours._flat_weights_names]
    assert [r() is w for r, w in zip(ours._flat_weight_refs, ours._flat_weights, strict=True)] == [True] * len(
        ours._flat_weights
    )
    assert not _torch.rnn_weights_replaced(ours)


def test_weights_have_changed_tells_a_replaced_parameter_from_a_swapped_data() -> None:
    api = "RNNBase._weights_have_changed"
    lstm = torch.nn.LSTM(6, 8)
    require_attribute(lstm, "_weights_have_changed", api)
    assert not _torch.rnn_weights_replaced(lstm)
    with torch.no_grad():
        lstm.weight_ih_l0.data = lstm.weight_ih_l0.data.clone()
    assert not _torch.rnn_weights_replaced(lstm), changed(api, "a swapped .data now counts as a change")
    lstm.weight_ih_l0 = torch.nn.Parameter(lstm.weight_ih_l0.detach().clone())
    assert _torch.rnn_weights_replaced(lstm), changed(api, "a new Parameter no longer counts as a change")


# --- memlayout's own backward loop and fake CUDA (activations/step/gpu_free_backward.py, sdpa_backend.py) ----------


def test_a_nodes_sequence_number_and_inputs_are_what_the_engine_orders_and_checks_by() -> None:
    weight = torch.ones(3, 2, requires_grad=True)
    first = weight * 2
    second = first.to(torch.float64).sum()
    assert _torch.autograd_node_sequence_nr(second.grad_fn) > _torch.autograd_node_sequence_nr(first.grad_fn)
    accumulate = first.grad_fn.next_functions[0][0]
    assert _torch.autograd_node_sequence_nr(accumulate) == 2**64 - 1  # AccumulateGrad runs first when ready
    assert _torch.autograd_node_inputs(first.grad_fn) == [((3, 2), torch.float32)]
    assert _torch.autograd_node_inputs(second.grad_fn) == [((), torch.float64)]


def test_the_running_node_is_the_one_memlayouts_loop_names() -> None:
    node = (torch.ones(1, requires_grad=True) * 2).grad_fn
    assert _torch.current_autograd_node() is None
    with _torch.running_autograd_node(node):
        assert _torch.current_autograd_node() is node
    assert _torch.current_autograd_node() is None


def test_one_graph_task_is_what_checkpoint_keys_its_recomputation_by() -> None:
    assert torch._C._current_graph_task_id() == -1
    with _torch.as_one_graph_task(12345):
        assert torch._C._current_graph_task_id() == 12345
    assert torch._C._current_graph_task_id() == -1


def test_a_checkpoint_region_saves_nothing_between_its_nexts_and_reruns_its_function_in_backward() -> None:
    import contextlib

    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 64)
    x = torch.randn(32, 48, requires_grad=True)  # kept by the region to rerun from: 1,536 elements
    torch.tanh(linear(x)).sum().backward()
    expected = x.grad.clone()
    x.grad = None
    reruns: list[int] = []

    def rerun(inp: torch.Tensor) -> None:
        reruns.append(1)
        torch.tanh(linear(inp))

    saved: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        region = _torch.checkpoint_region(rerun, True, lambda: (contextlib.nullcontext(), contextlib.nullcontext()), x)
        next(region)
        y = torch.tanh(linear(x))  # tanh's output (2,048 elements) goes to the region's frame, not to the hooks
        with pytest.raises(StopIteration):
            next(region)
    assert 32 * 64 not in saved, changed("_checkpoint_without_reentrant_generator", "the region saved tensors")
    assert reruns == []
    y.sum().backward()
    assert reruns == [1], changed("_checkpoint_without_reentrant_generator", f"{len(reruns)} reruns in backward")
    assert torch.equal(x.grad, expected)


def test_a_leafs_hooks_are_the_ones_registered_on_it() -> None:
    leaf = torch.ones(2, requires_grad=True)
    assert _torch.leaf_gradient_hooks(leaf) == [] and _torch.post_accumulate_grad_hooks(leaf) == []

    def hook(grad: torch.Tensor) -> None:
        return None

    def post(tensor: torch.Tensor) -> None:
        return None

    leaf.register_hook(hook)
    leaf.register_post_accumulate_grad_hook(post)
    assert _torch.leaf_gradient_hooks(leaf) == [hook] and _torch.post_accumulate_grad_hooks(leaf) == [post]


def test_the_default_sdpa_priority_is_flash_efficient_math_cudnn() -> None:
    assert _torch.sdp_priority_order()[:4] == [1, 2, 0, 3]


FAKE_CUDA_OPS = """
import torch
from memlayout import _torch
{install}
with _torch.FakeTensorMode():
    layer = torch.nn.Linear(4, 4, device="cuda")  # its initialiser's uniform_ copies through the device guard
    moved = torch.ones(2, 4).to("cuda")
    assert layer(moved).device.type == "cuda"
print("ok")
"""


def test_the_fake_cuda_guard_makes_fake_cuda_tensors_work_on_every_build() -> None:
    # In a process of its own: a build without a CUDA guard aborts the process in autograd's C++ (terminate).
    api = "c10::impl::device_guard_impl_registry, torch._C._ensureCUDADeviceGuardSet"
    given = subprocess_python(FAKE_CUDA_OPS.format(install="_torch.fake_cuda_device_guard()"))
    assert given.returncode == 0 and given.stdout.strip() == "ok", changed(api, given.stderr[-2000:])
    if torch.backends.cuda.is_built():  # type: ignore[no-untyped-call]
        return
    # Why it exists: without it the CPU build cannot make a fake CUDA tensor through the guard.
    bare = subprocess_python(FAKE_CUDA_OPS.format(install=""))
    assert bare.returncode != 0 and "not linked with support for cuda devices" in bare.stderr, bare.stderr[-2000:]


def subprocess_python(code: str) -> Any:
    import subprocess

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


def test_cuda_autocast_applies_cudas_policy_to_fake_cuda_tensors_without_a_device() -> None:
    _torch.fake_cuda_device_guard()
    with _torch.FakeTensorMode():
        a = torch.ones(4, 4, device="cuda")
        with _torch.cuda_autocast_without_device(torch.bfloat16):
            assert torch.is_autocast_enabled("cuda")
            assert (a @ a).dtype == torch.bfloat16
        assert not torch.is_autocast_enabled("cuda")


@pytest.mark.gpu
def test_torchs_sdpa_choice_names_a_backend() -> None:
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.float16)
    assert _torch.fused_sdp_choice(q, q, q, None, 0.0, True, False) in (0, 1, 2, 3)


def test_disabling_dispatch_modes_runs_the_real_kernel_under_a_fake_mode() -> None:
    seen: list[str] = []

    class Recorder(_torch.TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with _torch.FakeTensorMode(), Recorder():
        with _torch.disable_dispatch_modes(), _torch.unset_fake_temporarily():
            real = torch.ones(3) * 2
        fake = torch.ones(3)
    assert not isinstance(real, _torch.FakeTensor) and real.sum().item() == 6, changed(
        "torch.utils._python_dispatch._disable_current_modes", "an op inside it ran under a mode")
    assert isinstance(fake, _torch.FakeTensor) and seen == ["aten.ones.default"], changed(
        "torch.utils._python_dispatch._disable_current_modes", f"the modes saw {seen}")


def test_cpu_allocator_events_are_the_kernels_allocations_and_frees_in_order() -> None:
    x, y = torch.zeros(64, 48, 192), torch.zeros(64, 48, 192)
    loss, events = _torch.cpu_allocator_events(lambda: F.mse_loss(x, y))
    allocated = [nbytes for _, nbytes in events if nbytes > 0]
    # the CPU kernel's element-wise buffer is the 0-d loss's storage; it is allocated inside the profile
    assert loss.untyped_storage().nbytes() in allocated, changed(
        "torch.profiler kineto_results", f"no allocation of the loss's storage among {allocated}")
    assert [start for start, _ in events] == sorted(start for start, _ in events)


def test_cpu_allocator_events_keep_kinetos_lines_off_stderr_and_pass_others_on(
        capfd: pytest.CaptureFixture[str]) -> None:
    def run() -> int:
        os.write(2, b"a line of the user's own\n")
        return 7

    result, _ = _torch.cpu_allocator_events(run)
    _, err = capfd.readouterr()
    assert result == 7
    # kineto writes "USDT: ... profiler_start" here, and the CUDA build with no GPU "gpuGetDeviceCount failed"
    assert err == "a line of the user's own\n", changed("kineto's log lines", f"standard error read {err!r}")


def test_kineto_writes_its_own_lines_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    # why cpu_allocator_events keeps them off: a bare profile on the CUDA build writes them past Python
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        torch.zeros(8)
    _, err = capfd.readouterr()
    lines = err.splitlines()
    assert lines and all(_torch._KINETO_LINE.match(line.encode()) for line in lines), (
        f"kineto's stderr on torch {torch.__version__} changed: {err!r}")
