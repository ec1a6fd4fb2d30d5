"""The pickle scanners' test samples, remade here: picklescan's and modelscan's, malicious and benign.

picklescan (mmaitre314/picklescan) ships its samples as files (`tests/data`,
`tests/data2`, labelled by `tests/test_scanner.py`); modelscan (protectai/modelscan)
writes most of its own in `tests/test_modelscan.py`. Nothing of theirs is copied:
each `Recipe` is ours, a line of data saying which global a sample calls with
which arguments, in which pickle protocol, inside which wrapper, and naming the
sample it stands for. Calls are pickled by `pickle.dumps` of an object whose
`__reduce__` returns the callable (as the scanners' own tests write them: nothing
is called), or spelled opcode by opcode where the global is not importable here;
wrappers are written by their own libraries (joblib, numpy, torch, zipfile,
tarfile, gzip). benchmarks/speed/bench_scanner_corpora.py sweeps the scanners' real
files from a mirror where one exists.
"""

from __future__ import annotations

import bdb
import builtins
import gzip
import http.client
import io
import lzma
import os
import pickle
import socket
import ssl
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Callable
from typing import Any, NamedTuple

from tests.load.malicious import PROTO2, REDUCE, STOP, call, global_, text


class _Reduce:
    """Pickles as a call of `func` with `args`: what a payload's `__reduce__` returns."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args


class Recipe(NamedTuple):
    """One sample: how to make its bytes, and what it is."""

    name: str
    """The file's name (its suffix is the one the scanner's sample has)."""
    stands_for: str
    """The scanner's sample it remakes."""
    malicious: bool
    build: Callable[[], bytes]
    expected: str = ""
    """For a benign sample: "cleared", or "refused" for one that is no checkpoint at all."""


def _dumps(obj: Any, protocol: int) -> Callable[[], bytes]:
    return lambda: pickle.dumps(obj, protocol=protocol)


def _hand_call(module: str, name: str, argument: str) -> Callable[[], bytes]:
    # For globals not importable here: GLOBAL, one string, REDUCE, as protocol 2 spells it.
    return lambda: PROTO2 + call(module, name, text(argument)) + STOP


def _zip(member: str, data: Callable[[], bytes]) -> Callable[[], bytes]:
    def build() -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(member, data())
        return buffer.getvalue()

    return build


def _tar_gz(member: str, data: Callable[[], bytes]) -> Callable[[], bytes]:
    def build() -> bytes:
        buffer = io.BytesIO()
        content = data()
        with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
            info = tarfile.TarInfo(member)
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
        return buffer.getvalue()

    return build


def _joblib(obj: Any, compress: Any) -> Callable[[], bytes]:
    def build() -> bytes:
        import joblib

        buffer = io.BytesIO()
        joblib.dump(obj, buffer, compress=compress)
        return buffer.getvalue()

    return build


def _torch(obj: Any, into: str = "", legacy: bool = False) -> Callable[[], bytes]:
    def build() -> bytes:
        import torch

        buffer = io.BytesIO()
        if into == "gzip":
            with gzip.GzipFile(fileobj=buffer, mode="wb") as stream:
                torch.save(obj(), stream)
        elif into == "xz":
            with lzma.LZMAFile(buffer, mode="wb") as stream:
                torch.save(obj(), stream)
        else:
            torch.save(obj(), buffer, _use_new_zipfile_serialization=not legacy)
        return buffer.getvalue()

    return build


def _numpy(objects: Callable[[], dict[str, Any]], npz: bool = False, compressed: bool = False) -> Callable[[], bytes]:
    def build() -> bytes:
        import numpy as np

        buffer = io.BytesIO()
        arrays = objects()
        if not npz:
            np.save(buffer, arrays["array"], allow_pickle=True)
        else:
            (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
        return buffer.getvalue()

    return build


def _state() -> dict[str, Any]:
    import torch

    return {"layer.weight": torch.ones(4, 4), "layer.bias": torch.zeros(4)}


def _state_calling(payload: Any) -> Callable[[], dict[str, Any]]:
    return lambda: {**_state(), "hook": payload}


def _objects(*values: Any) -> Callable[[], dict[str, Any]]:
    def build() -> dict[str, Any]:
        import numpy as np

        return {"array": np.array(list(values), dtype=object), "other": np.array([{"k": 1}, 2.5], dtype=object)}

    return build


def _numbers() -> dict[str, Any]:
    import numpy as np

    return {"array": np.arange(12, dtype=np.int64).reshape(3, 4), "other": np.ones(5, np.float32)}


def _arrays() -> dict[str, Any]:
    import numpy as np

    return {"mean": np.arange(8.0), "scale": np.ones(8), "labels": ["a", "b"]}


_EVAL = _Reduce(builtins.eval, "print('456')")
_SYSTEM = _Reduce(os.system, "ls -la")
_NESTED = pickle.dumps(_SYSTEM, protocol=5)

# The globals of picklescan's advisory samples (tests/data2/GHSA-*.pkl and the named ones):
# each called with one string, as the advisory's sample calls it.
ADVISORY_GLOBALS: list[tuple[str, str, str]] = [
    ("GHSA-4r9r-ch6f-vxmx", "torch.utils.bottleneck.__main__", "run_cprofile"),
    ("GHSA-86cj-95qr-2p4f", "torch._dynamo.guards", "GuardBuilder.get"),
    ("GHSA-f4x7-rfwp-v3xw", "torch.fx.experimental.symbolic_shapes", "ShapeEnv.evaluate_guards_expression"),
    ("GHSA-f745-w6jp-hpxx", "torch.utils.collect_env", "run"),
    ("GHSA-h3qp-7fh3-f8h4", "torch.utils.data.datapipes.utils.decoder", "basichandlers"),
    ("GHSA-vr7h-p6mm-wpmh", "torch.jit.unsupported_tensor_ops", "execWrapper"),
    ("GHSA-vv6j-3g6g-2pvj", "torch.utils._config_module", "ConfigModule.load_config"),
    ("GHSA-5qwp-399c-mjwf", "trace", "Trace.run"),
    ("GHSA-g344-hcph-8vgg", "trace", "Trace.runctx"),
    ("GHSA-x696-vm39-cp64", "profile", "Profile.run"),
    ("GHSA-6vqj-c2q5-j97w", "profile", "Profile.runctx"),
    ("GHSA-f54q-57x4-jg88", "lib2to3.pgen2.grammar", "Grammar.loads"),
    ("GHSA-3vg9-h568-4w9m", "idlelib.debugobj", "ObjectTreeItem.SetText"),
    ("GHSA-6w4w-5w54-rjvr", "idlelib.autocomplete", "AutoComplete.get_entity"),
    ("GHSA-cj3c-v495-4xqh", "code", "InteractiveInterpreter.runcode"),
    ("GHSA-8r4j-24qv-fmq9", "idlelib.calltip", "Calltip.fetch_tip"),
    ("GHSA-xp4f-hrf8-rxw7", "ensurepip", "_run_pip"),
    ("GHSA-p9w7-82w4-7q8m", "lib2to3.pgen2.pgen", "ParserGenerator.make_label"),
    ("GHSA-m869-42cg-3xwr", "idlelib.run", "Executive.runcode"),
    ("GHSA-fqq6-7vqf-w3fg", "doctest", "debug_script"),
    ("GHSA-9w88-8rmg-7g2p", "cProfile", "runctx"),
    ("GHSA-7wx9-6375-f5wh", "profile", "run"),
    ("GHSA-q77w-mwjj-7mqx", "asyncio.unix_events", "_UnixSubprocessTransport._start"),
    ("GHSA-m273-6v24-x4m4", "distutils.file_util", "write_file"),
    ("GHSA-r8g5-cgf2-4m4m", "numpy.f2py.crackfortran", "getlincoef"),
    ("GHSA-vvpj-8cmc-gx39", "pkgutil", "resolve_name"),
    ("io_FileIO", "_io", "FileIO"),
    ("urllib_request_urlopen", "urllib.request", "urlopen"),
    ("logging_FileHandler", "logging", "FileHandler"),
    ("types_CodeType", "types", "CodeType"),
    ("cloudpickle_codeinjection", "cloudpickle.cloudpickle", "_make_function"),
    ("GHSA-g38g-8gr9-h9xp-uuid", "uuid", "_get_command_stdout"),
    ("GHSA-g38g-8gr9-h9xp-osx-support", "_osx_support", "_read_output"),
    ("GHSA-g38g-8gr9-h9xp-aix-support", "_aix_support", "_read_cmd_output"),
    ("GHSA-g38g-8gr9-h9xp-imaplib", "imaplib", "IMAP4_stream"),
    ("GHSA-g38g-8gr9-h9xp-pyrepl-pager", "_pyrepl.pager", "pipe_pager"),
    ("GHSA-g38g-8gr9-h9xp-test", "test.support.script_helper", "assert_python_ok"),
    ("malicious21", "timeit", "timeit"),
    ("malicious22", "numpy.testing._private.utils", "runstring"),
    ("malicious14", "runpy", "_run_code"),
    ("malicious17", "torch._inductor.codecache", "compile_file"),
    ("malicious18", "pydoc", "pipepager"),
    ("malicious19", "torch.serialization", "load"),
    ("malicious20", "pip", "main"),
    ("malicious16", "venv", "create"),
]

RECIPES: list[Recipe] = [
    # --- modelscan's generated samples and picklescan's matching files -------------------------
    *[Recipe(f"malicious1_v{v}.pkl", f"picklescan and modelscan malicious1_v{v}.pkl: eval", True, _dumps(_EVAL, v))
      for v in (0, 3, 4)],
    *[Recipe(f"malicious2_v{v}.pkl", f"picklescan and modelscan malicious2_v{v}.pkl: os.system", True,
             _dumps(_SYSTEM, v)) for v in (0, 3, 4)],
    *[Recipe(f"malicious1_v{v}.dill", f"modelscan malicious1_v{v}.dill (dill writes the same pickle)", True,
             _dumps(_EVAL, v)) for v in (0, 3, 4)],
    Recipe("malicious3.pkl", "modelscan and picklescan malicious3.pkl: http.client.HTTPSConnection, protocol 0",
           True, _dumps(_Reduce(http.client.HTTPSConnection, "github.com"), 0)),
    Recipe("malicious4.pickle", "modelscan and picklescan malicious4.pickle: requests.api.get", True,
           _hand_call("requests.api", "get", "https://github.com")),
    Recipe("malicious5.pickle", "modelscan and picklescan malicious5.pickle: aiohttp.client.ClientSession", True,
           lambda: PROTO2 + global_("aiohttp.client", "ClientSession") + b")" + REDUCE + STOP),
    Recipe("malicious6.pkl", "modelscan and picklescan malicious6.pkl: a clean pickle, then requests.api.get",
           True, lambda: pickle.dumps(["a", "b", "c"]) + _hand_call("requests.api", "get", "https://github.com")()),
    Recipe("malicious7.pkl", "modelscan Malicious6 (picklescan malicious7.pkl): socket.create_connection", True,
           _dumps(_Reduce(socket.create_connection, ("github.com", 80)), 4)),
    Recipe("malicious8.pkl", "modelscan Malicious7 (picklescan malicious8.pkl): subprocess.run", True,
           _dumps(_Reduce(subprocess.run, ["ls", "-l"]), 4)),
    Recipe("malicious9.pkl", "modelscan Malicious8 (picklescan malicious9.pkl): sys.exit", True,
           _dumps(_Reduce(sys.exit, 0), 4)),
    Recipe("malicious15.pkl", "modelscan Malicious15: bdb.Bdb.run on a Bdb", True,
           _dumps(_Reduce(bdb.Bdb.run, bdb.Bdb(), 'import os\nos.system("whoami")'), 4)),
    Recipe("malicious12.pkl", "modelscan malicious12_gen: pickle.loads of a nested os.system pickle", True,
           _dumps(_Reduce(pickle.loads, _NESTED), 5)),
    Recipe("malicious13.pkl", "modelscan malicious13_gen: builtins eval.__call__ through GLOBAL, protocol 5", True,
           lambda: b"\x80\x05" + global_("builtins", "eval.__call__") + text("1 + 1") + b"\x85" + REDUCE + STOP),
    Recipe("malicious11.pkl", "modelscan malicious11 and 14 (imaginaryctf 'Safe Pickle'): STACK_GLOBAL from "
           "strings memoized under a torch name", True,
           lambda: (b"Vos\np2\n0Vsystem\np3\n0Vtorch\np0\n0VLongStorage\np1\n0g2\ng3\n\x93(Vcat flag.txt\ntR.")),
    Recipe("malicious10.pkl", "modelscan and picklescan malicious10.pkl: INST __builtin__ exec", True,
           lambda: b"(S'print(\"Injection running\")'\ni__builtin__\nexec\n."),
    Recipe("malicious0.pkl", "modelscan and picklescan malicious0.pkl (Sour Pickles): globals, compile, eval, apply",
           True, lambda: (b"c__builtin__\nglobals\n(tRp100\n0c__builtin__\ncompile\n(S'x=1'\nS''\nS'exec'\ntRp101\n0"
                          b"c__builtin__\neval\n(g101\ng100\ntRp102\n0c__builtin__\ngetattr\n(c__builtin__\ndict\n"
                          b"S'get'\ntRp103\n0c__builtin__\napply\n(g103\n(g100\nS'x'\nltRp104\n0g104\n.")),
    Recipe("malicious1.zip", "modelscan and picklescan malicious1.zip: data.pkl calling eval", True,
           _zip("data.pkl", _dumps(_EVAL, 4))),
    Recipe("dns_exfiltration.npy", "picklescan dns_exfiltration.npy: an object array calling "
           "ssl.get_server_certificate", True, _numpy(_objects(_Reduce(ssl.get_server_certificate, ("x.test", 443))))),
    Recipe("object_arrays_payload.npz", "picklescan object_arrays.npz, with a payload in one array", True,
           _numpy(_objects(_SYSTEM), npz=True)),
    *[Recipe(f"{sample}.pkl", f"picklescan {sample}: {module}.{name}", True, _hand_call(module, name, "x"))
      for sample, module, name in ADVISORY_GLOBALS],
    # --- the wrappers issue 50 reads: every codec joblib writes, torch.save into a stream, archives --
    *[Recipe(f"payload-{codec}.joblib", f"joblib.dump(compress={codec!r}) of picklescan's malicious2", True,
             _joblib({"mean": __import__("numpy").arange(4.0), "hook": _SYSTEM}, (codec, 3)))
      for codec in ("zlib", "gzip", "bz2", "lzma", "xz", "lz4")],
    Recipe("payload.joblib", "joblib.dump (uncompressed, arrays between the opcodes) of picklescan's malicious2",
           True, _joblib({"mean": __import__("numpy").arange(4.0), "hook": _SYSTEM}, 0)),
    Recipe("model.pt.gz", "torch.save into gzip.open, with picklescan's malicious2 in the state", True,
           _torch(_state_calling(_SYSTEM), into="gzip")),
    Recipe("model.pt.xz", "torch.save into lzma.open, with picklescan's malicious1", True,
           _torch(_state_calling(_EVAL), into="xz")),
    Recipe("checkpoint.tar.gz", "picklescan's malicious2 inside a .tar.gz", True, _tar_gz("ckpt/model.pkl",
                                                                                       _dumps(_SYSTEM, 4))),
    Recipe("nested.zip", "picklescan's malicious1.zip inside a .tar.gz inside a zip", True,
           _zip("inner.tar.gz", _tar_gz("data/malicious1.zip", _zip("data.pkl", _dumps(_EVAL, 4))))),
    # --- benign ------------------------------------------------------------------------------
    *[Recipe(f"benign0_v{v}.pkl", f"picklescan and modelscan benign0_v{v}.pkl: ['a', 'b', 'c']", False,
             _dumps(["a", "b", "c"], v), "cleared") for v in (0, 3, 4)],
    *[Recipe(f"benign0_v{v}.dill", f"modelscan benign0_v{v}.dill", False, _dumps(["a", "b", "c"], v), "cleared")
      for v in (0, 3, 4)],
    Recipe("pytorch_model.bin", "picklescan pytorch_model.bin and modelscan safe_zip_pytorch.pt: a state dict",
           False, _torch(_state), "cleared"),
    Recipe("safe_old_format_pytorch.pt", "modelscan safe_old_format_pytorch.pt: the legacy torch.save format", False,
           _torch(_state, legacy=True), "cleared"),
    Recipe("int_array.npy", "picklescan int_array.npy", False, _numpy(_numbers), "cleared"),
    Recipe("int_arrays.npz", "picklescan int_arrays.npz", False, _numpy(_numbers, npz=True), "cleared"),
    Recipe("int_arrays_compressed.npz", "picklescan int_arrays_compressed.npz", False,
           _numpy(_numbers, npz=True, compressed=True), "cleared"),
    Recipe("object_array.npy", "picklescan object_array.npy: objects rebuilt by numpy alone", False,
           _numpy(_objects(1.5, "b")), "cleared"),
    Recipe("object_arrays_compressed.npz", "picklescan object_arrays_compressed.npz", False,
           _numpy(_objects(1.5, "b"), npz=True, compressed=True), "cleared"),
    *[Recipe(f"scaler-{codec}.joblib", f"joblib.dump(compress={codec!r}) of numpy arrays", False,
             _joblib(_arrays(), (codec, 3)), "cleared") for codec in ("zlib", "gzip", "bz2", "lzma", "xz", "lz4")],
    Recipe("state.pt.gz", "torch.save of a state dict into gzip.open", False, _torch(_state, into="gzip"), "cleared"),
    Recipe("checkpoint-clean.tar.gz", "a state dict's pickle inside a .tar.gz", False,
           _tar_gz("ckpt/model.pkl", _dumps({"w": [1.0, 2.0]}, 4)), "cleared"),
    Recipe("bad_pytorch.pt", "modelscan and picklescan bad_pytorch.pt: a PNG named .pt", False,
           lambda: b"\x89PNG\r\n\x1a\n" + bytes(64), "refused"),
]
"""Every sample; the wrappers of lz4 only where the lz4 package is installed (see `available`)."""


def available(recipe: Recipe) -> bool:
    """Whether this machine can write the sample (joblib's lz4 needs the lz4 package)."""
    if "lz4" in recipe.name:
        import importlib.util

        return importlib.util.find_spec("lz4") is not None
    return True
