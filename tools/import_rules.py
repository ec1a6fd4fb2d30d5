"""What may be imported where: heavy packages inside functions, light memlayout modules at the top.

Usage: python tools/import_rules.py [--count]   (run by `make lint`; exit 1 on a violation)

Start-up time is a feature (`benchmarks/speed/bench_startup.py`), so a module that the
CLI loads before it knows the command never imports a heavy package at its top:
torch, numpy, rich and the others of `HEAVY` are imported inside the function
that needs them. The rest of the lazy imports cost a reader and buy nothing, so
a function may not import a light memlayout module, one whose own top-level
imports reach no third-party package: it goes to the top of the module, unless
`FUNCTION_LEVEL_ALLOWED` names it with its reason.

The check reads the source (ast) and imports nothing; `--count` prints the
figures issue 30 counted.
"""

from __future__ import annotations

import ast
import fnmatch
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "memlayout"

HEAVY = frozenset({
    "torch", "numpy", "rich", "safetensors", "huggingface_hub", "fsspec", "aiohttp", "jinja2", "pydantic",
    "transformers", "tensordict", "accelerate", "deepspeed",
})
"""Third-party packages that cost start-up time: each takes tens of milliseconds or more to import."""

START_UP = ("memlayout", "memlayout.__main__", "memlayout.cli.app")
"""What runs before the CLI knows the command; with every module they import at their top."""

FUNCTION_LEVEL_ALLOWED: dict[str, str] = {
    # "importing module (fnmatch pattern)": "why its function-level imports of light memlayout modules stay"
    "memlayout": "the public API loads the pipeline only when called: `import memlayout` stays cheap",
    "memlayout.cli.*_command": "`memlayout --help` imports every command's module to list it: what a command "
                               "runs is imported when it runs",
    "memlayout.cli.formats": "one registry of every format: a format's renderer is imported only when chosen",
}
"""Modules whose function-level imports of light memlayout modules are deliberate, with the reason.

A module that start-up loads may also import, inside a function, any module start-up does not load:
that is what keeps start-up lean."""

FUNCTION_LEVEL_TARGETS_ALLOWED: dict[str, str] = {
    # "imported module (fnmatch pattern)": "why importing it inside a function is right"
    "memlayout.cli.*": "a command's module (and what only it uses) is loaded when the command runs",
    "memlayout.io.zip_archive": "the zip reader (and zipfile): only for a file that opens like a zip; "
                                "load.detect is loaded for every file, and by `memlayout rules`",
    "memlayout.load.pickled_tree": "the pickle tree walk: only for pickled sources; file_source is loaded "
                                   "for safetensors too",
    "memlayout.load.legacy": "a loader: imported only for a file whose bytes open like its format (load.FORMATS)",
    "memlayout.load.restricted_pickle": "the unpickler: only for a file whose first byte opens a pickle",
    "memlayout.load.polyglot": "read only after a file loaded, to name the other formats it is valid as",
    "memlayout.load.remote": "remote reads, only for a URL or a Hub id",
    "memlayout.io.remote": "the remote transport's front: only for a URL or a Hub id (cli.options, which "
                           "every command loads, starts importing aiohttp from there), and for a batch of paths, "
                           "which shares one transport; aiohttp itself is imported on the first HTTP read",
    "memlayout.load.import_spec": "runs the user's code: only for a `pkg.module:callable` target",
    "memlayout.load.live": "live objects, only when given one: import_spec is loaded for every path "
                           "(batch asks looks_like_spec of each), and must not bring it",
}
"""Light memlayout modules that may be imported inside functions anywhere, with the reason."""


@dataclass(frozen=True)
class Import:
    """One import statement's target."""

    module: str
    """The module it imports (`a.b` for `from a.b import c`, or `a.b.c` when c is a module)."""
    line: int
    in_function: bool


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, modules: set[str], in_function: bool = False) -> Iterator[Import]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            continue  # read by the type checker only
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, node.lineno, in_function)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "__future__":
                continue
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                yield Import(submodule if submodule in modules else node.module, node.lineno, in_function)
        else:
            inside = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from _imports(node, modules, inside)


def _parents(module: str) -> list[str]:
    """A module and the packages Python imports before it (`a`, `a.b` for `a.b.c`)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


class Package:
    """The import statements of every module of a package, read from its source."""

    def __init__(self, root: Path = ROOT, package: str = PACKAGE) -> None:
        paths = sorted((root / package).rglob("*.py"))
        self.paths = {module_name(path, root): path for path in paths}
        names = set(self.paths)
        self.imports = {
            name: list(_imports(ast.parse(path.read_text(), str(path)), names)) for name, path in self.paths.items()
        }
        self.package = package
        self._closures: dict[tuple[str, ...], set[str]] = {}

    def _own(self, module: str) -> bool:
        return module.split(".")[0] == self.package

    def top_level(self, name: str) -> list[str]:
        """What importing `name` imports directly: its top-level imports and the packages above it."""
        found = [i.module for i in self.imports.get(name, ()) if not i.in_function]
        return [*_parents(name)[:-1], *found]

    def closure(self, start: tuple[str, ...]) -> set[str]:
        """Every memlayout module that importing `start` loads, through top-level imports."""
        if start in self._closures:
            return self._closures[start]
        seen: set[str] = set()
        todo = [m for name in start for m in _parents(name) if m in self.paths]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            todo.extend(m for dep in self.top_level(name) for m in _parents(dep) if m in self.paths)
        self._closures[start] = seen
        return seen

    def third_party_at_load(self, name: str) -> set[str]:
        """The third-party packages importing `name` loads, through memlayout's top-level imports."""
        found: set[str] = set()
        for module in self.closure((name,)):
            for dep in self.top_level(module):
                top = dep.split(".")[0]
                if top != self.package and top not in sys.stdlib_module_names:
                    found.add(top)
        return found

    def is_light(self, name: str) -> bool:
        return name in self.paths and not self.third_party_at_load(name)


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def _matches(module: str, patterns: dict[str, str]) -> bool:
    return any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns)


def _lazy_import_needed(package: Package, name: str, imported: str, start_up: set[str]) -> bool:
    """Whether `name` may import the light module `imported` inside a function."""
    if imported in package.closure((name,)):
        return False  # already loaded with the module: the function-level import buys nothing
    return (
        name in package.closure((imported,))  # a cycle: the two modules import each other
        or (name in start_up and imported not in start_up)  # start-up stays lean
        or _matches(name, FUNCTION_LEVEL_ALLOWED)
        or _matches(imported, FUNCTION_LEVEL_TARGETS_ALLOWED)
    )


def violations(package: Package) -> list[Violation]:
    """Heavy packages at the top of a module start-up loads, and light modules imported inside functions."""
    found: dict[tuple[Path, int], Violation] = {}
    start_up = package.closure(START_UP)
    for name, imports in package.imports.items():
        path = package.paths[name]
        for imp in imports:
            if not imp.in_function and name in start_up and imp.module.split(".")[0] in HEAVY:
                found[path, imp.line] = Violation(path, imp.line, f"{imp.module} is imported at the top of a module "
                                                  "that start-up loads: import it in the function that needs it")
            elif (imp.in_function and package.is_light(imp.module)
                  and not _lazy_import_needed(package, name, imp.module, start_up)):
                found[path, imp.line] = Violation(path, imp.line, f"{imp.module} imports no third-party package: "
                                                  "import it at the top (or say why not in tools/import_rules.py)")
    return list(found.values())


def counts(package: Package) -> dict[str, int]:
    """Import statements (not names) inside functions: all, of light memlayout modules, and those not allowed."""
    in_function = {(name, i.line, i.module) for name, imports in package.imports.items() for i in imports
                   if i.in_function}
    light = {(name, line) for name, line, module in in_function if package.is_light(module)}
    refused = {(v.path, v.line) for v in violations(package) if "no third-party" in v.text}
    return {
        "function-level import statements": len({(name, line) for name, line, _ in in_function}),
        "of light memlayout modules": len(light),
        "of light memlayout modules, not allowed": len(refused),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    package = Package()
    if "--count" in argv:
        for label, value in counts(package).items():
            print(f"{label}: {value}")
        return 0
    found = violations(package)
    for violation in found:
        print(violation)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
