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
