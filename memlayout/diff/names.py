"""How names in A are matched to names in B: `--strip-prefix` and `--map OLD=NEW`.

Checkpoints of one model often name its tensors differently: DDP adds `module.`,
`torch.compile` adds `_orig_mod.`, a training script nests the model under
`model.`. Tensors are matched by a key: each side's name with the first matching
strip prefix removed, then, on A's side, the first `--map` whose OLD starts it
replaced by NEW.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from memlayout.errors import UsageError


@dataclass(frozen=True)
class NameMap:
    """The renaming that lines A's tensor names up with B's."""

    strip_prefixes: tuple[str, ...] = ()
    """Removed from the start of names on both sides (the first that matches)."""
    renames: tuple[tuple[str, str], ...] = ()
    """(OLD, NEW) prefix replacements applied to A's names after stripping."""

    def key_in_a(self, name: str) -> str:
        """The key an A name is matched by."""
        stripped = self._strip(name)
        for old, new in self.renames:
            if stripped.startswith(old):
                return new + stripped[len(old) :]
        return stripped

    def key_in_b(self, name: str) -> str:
        """The key a B name is matched by."""
        return self._strip(name)

    def _strip(self, name: str) -> str:
        for prefix in self.strip_prefixes:
            if name.startswith(prefix):
                return name[len(prefix) :]
        return name


def parse_renames(values: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """`["model.=", "enc.=encoder."]` -> (("model.", ""), ("enc.", "encoder.")).

    Raises:
        UsageError: a value is not OLD=NEW with a non-empty OLD.
    """
    renames = []
    for value in values:
        old, sep, new = value.partition("=")
        if not sep or not old:
            raise UsageError(
                f"--map {value!r} is not of the form OLD=NEW", "e.g. --map module.=model. (NEW may be empty)"
            )
        renames.append((old, new))
    return tuple(renames)


def keyed(names: Iterable[str], key: Callable[[str], str], side: str) -> dict[str, str]:
    """key -> original name for one side; two names with one key are a usage error.

    Args:
        names: Every tensor name of the side.
        key: `NameMap.key_in_a` or `NameMap.key_in_b`.
        side: "A" or "B", for the message.
    """
    by_key: dict[str, str] = {}
    for name in names:
        k = key(name)
        other = by_key.get(k)
        if other is not None and other != name:
            raise UsageError(
                f"{side}: {other} and {name} both become {k!r} after --strip-prefix/--map",
                "use a narrower prefix, so that each name keeps its own key",
            )
        by_key[k] = name
    return by_key


# A wrapper prefix (DDP's `module.`, torch.compile's `_orig_mod.`, a script's
# `model.`) covers nearly every name of its side; prefixes on fewer than half the
# names are parts of the model, not a wrapper, and are not suggested.
_WRAPPER_SHARE = 0.5
_WRAPPER_DEPTH = 3


def _wrapper_prefixes(names: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    for name in names:
        parts = name.split(".")
        for depth in range(1, min(_WRAPPER_DEPTH, len(parts) - 1) + 1):
            prefix = ".".join(parts[:depth]) + "."
            counts[prefix] = counts.get(prefix, 0) + 1
    return [p for p, n in counts.items() if n >= _WRAPPER_SHARE * len(names)]


def matching_keys(a_names: Iterable[str], b_names: Iterable[str], names: NameMap) -> int:
    """How many of A's names meet one of B's under `names`; -1 when a side's names collide."""
    try:
        keys_a = keyed(a_names, names.key_in_a, "A")
        keys_b = keyed(b_names, names.key_in_b, "B")
    except UsageError:
        return -1
    return len(keys_a.keys() & keys_b.keys())


def suggest_strip_prefixes(
    a_names: list[str], b_names: list[str], names: NameMap, now: int | None = None
) -> tuple[tuple[str, ...], int] | None:
    """The `--strip-prefix` values that would match at least half the names, when the given ones match fewer.

    Args:
        a_names: Every tensor name of A.
        b_names: Every tensor name of B.
        names: The matching the diff ran with; suggestions are added to its prefixes.
        now: `matching_keys` under `names`, when the caller has it.

    Returns:
        (prefixes to add, names they match), fewest prefixes first among the best;
        None when the names already match or no wrapper prefix makes them.
    """
    smaller = min(len(a_names), len(b_names))
    if now is None:
        now = matching_keys(a_names, b_names, names)
    if not smaller or now >= _WRAPPER_SHARE * smaller:
        return None
    prefixes_a, prefixes_b = _wrapper_prefixes(a_names), _wrapper_prefixes(b_names)
    candidates: list[tuple[str, ...]] = [(p,) for p in dict.fromkeys(prefixes_a + prefixes_b)]
    candidates += [(pa, pb) for pa in prefixes_a for pb in prefixes_b if pa != pb]
    best: tuple[tuple[str, ...], int] | None = None
    for candidate in candidates:
        trial = NameMap(names.strip_prefixes + candidate, names.renames)
        found = matching_keys(a_names, b_names, trial)
        if found > now and found >= _WRAPPER_SHARE * smaller and (best is None or found > best[1]):
            best = (candidate, found)
    return best
