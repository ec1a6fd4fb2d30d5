"""What a rank's CUDA device answers when there is none: its index, its streams and events.

FSDP2 and DTensor ask the device module (`torch.cuda`, through `_get_device_handle`)
for more than a fake CUDA tensor needs: `fully_shard` asks `current_device()` for the
mesh's device (torch/distributed/fsdp/_fully_shard/_fsdp_init.py,
`_get_device_from_mesh`), and FSDP2 runs its all-gathers and reduce-scatters on
streams of its own (`FSDPCommContext.lazy_init`: `Stream(priority=-1)`, `stream(s)`,
`current_stream()`, `record_event()`, `wait_stream`, `wait_event`; and
`torch.accelerator.current_stream()` after backward). Without a driver each of them
raises "Found no NVIDIA driver". The device mesh itself needs nothing: under torch's
fake process group it skips setting a device ("cross-compilation mode",
torch/distributed/device_mesh.py).

`answering(rank)` puts Python stand-ins in their place while a rank is traced: the
rank's device index, and streams that are only names, with the current one tracked as
`torch.cuda.stream` sets it (what the caching allocator model reads to keep a pool per
stream, allocations.py); events that are always complete, since nothing runs. Where a
GPU is present, torch answers and nothing is replaced.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

from memlayout import _torch

DEVICE_INDEX = 0
"""Every rank's device is cuda:0: each real rank has a device of its own, and here the model, its inputs and
FSDP2's mesh must agree on one (the fake tensors of `to_empty(device="cuda")` are on cuda:0)."""


class FakeEvent:
    """A CUDA event that has always completed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs

    def record(self, stream: Any = None) -> None:
        del stream

    def wait(self, stream: Any = None) -> None:
        del stream

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None

    def elapsed_time(self, end: Any) -> float:
        del end
        return 0.0


class FakeStream:
    """A CUDA stream by name only: an id, its device, and the calls FSDP2 makes on it."""

    _ids = itertools.count(1)

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        import torch

        del kwargs
        self.stream_id = next(self._ids)
        self.priority = priority
        self.device = torch.device("cuda", _state.index if device is None else torch.device(device).index or 0)
        self.device_index = self.device.index
        self.device_type = 1  # c10::DeviceType::CUDA

    def wait_stream(self, stream: Any) -> None:
        del stream

    def wait_event(self, event: Any) -> None:
        del event

    def record_event(self, event: Any = None) -> FakeEvent:
        return event if event is not None else FakeEvent()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeStream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(("cuda", self.stream_id))

    def __repr__(self) -> str:
        return f"<memlayout fake CUDA stream {self.stream_id} on cuda:{self.device_index}>"


class _State:
    index = 0
    default: FakeStream | None = None
    current: FakeStream | None = None


_state = _State()


@contextlib.contextmanager
def _on(stream: Any) -> Iterator[None]:
    previous = _state.current
    if stream is not None:
        _state.current = stream
    try:
        yield
    finally:
        _state.current = previous


@contextlib.contextmanager
def answering(rank: int) -> Iterator[None]:
    """Within it, `torch.cuda` answers device queries for the rank's device, as above; nothing where a GPU is."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    del rank  # every rank's device is the same one here (DEVICE_INDEX)
    _state.index = DEVICE_INDEX
    _state.default = _state.current = FakeStream(priority=0)
    answers = {
        "current_device": lambda: _state.index,
        "set_device": lambda device: None,
        "Stream": FakeStream,
        "Event": FakeEvent,
        "current_stream": lambda device=None: _state.current,
        "default_stream": lambda device=None: _state.default,
        "stream": _on,
        "set_stream": lambda stream: setattr(_state, "current", stream),
        "synchronize": lambda device=None: None,
    }
    saved = {name: getattr(torch.cuda, name) for name in answers}
    accelerator: Any = torch.accelerator  # its current_stream's typing differs between torch releases
    accelerator_stream = accelerator.current_stream
    try:
        for name, answer in answers.items():
            setattr(torch.cuda, name, answer)
        accelerator.current_stream = lambda device=None: _state.current
        yield
    finally:
        for name, original in saved.items():
            setattr(torch.cuda, name, original)
        accelerator.current_stream = accelerator_stream
        _state.default = _state.current = None



@contextlib.contextmanager
def made_fake(fake_mode: Any) -> Iterator[None]:
    """Within it, a CUDA tensor made from nothing (`torch.empty(0, device="cuda")`) is fake: entered while the
    sharding code runs on the meta model, before the step's FakeTensorMode can be (the device mesh reads its
    values). FSDP2's parameter groups make such a tensor in `__init__` (`_all_gather_output`).

    A factory asks `torch.cuda._lazy_init` before it dispatches (torch/csrc/utils/device_lazy_init.cpp, which
    skips it only under a FakeTensorMode), and that raises without a driver: it does nothing meanwhile, and
    the mode below makes the tensor in `fake_mode`.
    """
    import torch

    class CudaTensorsFake(_torch.TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cuda" and not any(
                    isinstance(a, torch.Tensor) for a in args):
                with _torch.disable_dispatch_modes(), fake_mode:
                    return func(*args, **kwargs)
            return func(*args, **kwargs)

    if torch.cuda.is_available():
        yield
        return
    with _torch.cuda_lazy_init_skipped(), CudaTensorsFake():  # type: ignore[no-untyped-call]
        yield
