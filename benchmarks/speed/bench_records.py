"""Building the per-tensor records: NamedTuples against frozen dataclasses.

Usage: python benchmarks/speed/bench_records.py [--quick]

`TensorRecord`, `StorageRecord`, `TensorFact` and `StorageFact` are built once per
tensor or storage of a checkpoint (100,000 of each for a large mixture-of-experts
model), so their construction cost is part of the per-tensor budget. They are
NamedTuples: typed and immutable. The peers, measured in the same run on the same
24 fields as `TensorFact`:

- a frozen dataclass's generated `__init__` (one `object.__setattr__` per field);
- what memlayout used before, a constructor generated with `exec` that set the
  instance `__dict__` in one step (untyped: mypy could not check its 24
  positional arguments).

Also the memory each instance holds (the object and, for dataclasses, its dict).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import Row, print_table, quick_requested, round_robin, write_results

from memlayout.core.facts import TensorFact
from memlayout.core.strides import EMPTY_BYTE_SET, MemoryFormat
from memlayout.load.records import TensorKind

FIELDS = TensorFact._fields
VALUES: tuple[Any, ...] = (
    "model.layers.0.mlp.experts.0.w1.weight", ("model.layers.0.mlp.experts.0.w1.weight",), TensorKind.PARAMETER,
    "float32", 4, "cpu", (16, 8), (8, 1), "s0", 0, 128, 512, True, MemoryFormat.CONTIGUOUS, EMPTY_BYTE_SET,
    False, 4096, True, (), False, "", None, None, True,
)
FrozenFact = dataclasses.make_dataclass("FrozenFact", [(name, Any) for name in FIELDS], frozen=True)


def _exec_constructor(cls: type) -> Any:
    # The constructor memlayout.frozen generated, reproduced as the peer.
    names = [f.name for f in dataclasses.fields(cls)]
    source = (
        f"def make({', '.join(names)}):\n"
        f"    instance = new(cls)\n"
        f"    set_attribute(instance, '__dict__', {{{', '.join(f'{n!r}: {n}' for n in names)}}})\n"
        f"    return instance\n"
    )
    namespace: dict[str, Any] = {"new": object.__new__, "cls": cls, "set_attribute": object.__setattr__}
    exec(source, namespace)
    return namespace["make"]


def _size(instance: object) -> int:
    own = sys.getsizeof(instance)
    return own + (sys.getsizeof(vars(instance)) if hasattr(instance, "__dict__") else 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    quick = quick_requested(argv)
    count = 20_000 if quick else 200_000
    make = _exec_constructor(FrozenFact)
    values = VALUES

    def named_tuple() -> None:
        for _ in range(count):
            TensorFact(*values)

    def frozen_init() -> None:
        for _ in range(count):
            FrozenFact(*values)

    def exec_built() -> None:
        for _ in range(count):
            make(*values)

    times = round_robin({"namedtuple": named_tuple, "frozen": frozen_init, "exec": exec_built}, 3 if quick else 7)
    per = {name: seconds / count * 1e6 for name, seconds in times.items()}
    sizes = {"namedtuple": _size(TensorFact(*values)), "frozen": _size(FrozenFact(*values)),
             "exec": _size(make(*values))}
    rows = []
    for peer, label in (("frozen", "frozen dataclass __init__"), ("exec", "exec-built dict constructor (before)")):
        ratio = per["namedtuple"] / per[peer]
        rows.append(Row("build one TensorFact (24 fields), NamedTuple", f"{per['namedtuple']:.2f} us",
                        f"{label} {per[peer]:.2f} us", ratio, "<= 1x", ratio <= 1))
        size_ratio = sizes["namedtuple"] / sizes[peer]
        rows.append(Row("bytes per TensorFact, NamedTuple", f"{sizes['namedtuple']} B", f"{label} {sizes[peer]} B",
                        size_ratio, "<= 1x", size_ratio <= 1))
    print_table(f"bench_records: per-tensor record construction{' (quick)' if quick else ''}", rows)
    print(f"raw numbers: {write_results('records', rows, {'us_per_build': per, 'bytes': sizes}, quick)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
