"""A corpus of malicious pickles, assembled opcode by opcode.

Nothing here imports or calls a payload: each builder returns bytes. The payloads
would create the marker file or set MEMLAYOUT_PWNED if anything ever unpickled
them for real, which is what the tests assert never happens.
"""

from __future__ import annotations

import io
import pickle
import struct
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

ENV_VAR = "MEMLAYOUT_PWNED"

PROTO2 = b"\x80\x02"
PROTO4 = b"\x80\x04"
MARK = b"("
STOP = b"."
TUPLE1 = b"\x85"
TUPLE2 = b"\x86"
EMPTY_TUPLE = b")"
EMPTY_DICT = b"}"
EMPTY_LIST = b"]"
APPEND = b"a"
SETITEM = b"s"
REDUCE = b"R"
BUILD = b"b"
POP = b"0"
NONE = b"N"
STACK_GLOBAL = b"\x93"
NEWOBJ = b"\x81"


def global_(module: str, name: str) -> bytes:
    """GLOBAL: the opcode scanners and find_class see as `module name`."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def text(value: str) -> bytes:
    """BINUNICODE."""
    encoded = value.encode()
    return b"X" + struct.pack("<I", len(encoded)) + encoded


def binbytes(value: bytes) -> bytes:
    """BINBYTES (protocol 3+)."""
    return b"B" + struct.pack("<I", len(value)) + value


def put(index: int) -> bytes:
    return b"q" + bytes([index])


def get(index: int) -> bytes:
    return b"h" + bytes([index])


def call(module: str, name: str, *args: bytes) -> bytes:
    """module.name(*args) through GLOBAL + TUPLE + REDUCE."""
    return global_(module, name) + MARK + b"".join(args) + b"t" + REDUCE


def python_payload(marker: str) -> str:
    """Python source that leaves both traces of execution."""
    return f"import os; os.environ[{ENV_VAR!r}] = '1'; open({marker!r}, 'w').close()"


def shell_payload(marker: str) -> str:
    return f"touch '{marker}'"


@dataclass(frozen=True)
class Payload:
    """One malicious pickle body and the globals ML601 must name."""

    name: str
    build: Callable[[str], bytes]
    """marker path -> pickle bytes (without wrappers)."""
    globals: tuple[str, ...]
    """Dotted globals the pickle references that torch's weights-only loader refuses."""


def _reduce_os_system(marker: str) -> bytes:
    return PROTO2 + call("os", "system", text(shell_payload(marker))) + STOP


def _reduce_posix_system(marker: str) -> bytes:
    return PROTO2 + call("posix", "system", text(shell_payload(marker))) + STOP


def _reduce_eval(marker: str) -> bytes:
    code = f"__import__('os').environ.__setitem__({ENV_VAR!r}, '1') or open({marker!r}, 'w').close()"
    return PROTO2 + call("builtins", "eval", text(code)) + STOP


def _reduce_exec(marker: str) -> bytes:
    return PROTO2 + call("builtins", "exec", text(python_payload(marker))) + STOP


def _stack_global_exec(marker: str) -> bytes:
    # Protocol 4 names globals with two strings on the stack, not a GLOBAL line.
    return (PROTO4 + text("builtins") + text("exec") + STACK_GLOBAL + text(python_payload(marker)) + TUPLE1 + REDUCE
            + STOP)


def _import_getattr_chain(marker: str) -> bytes:
    # getattr(__import__("os"), "system")("touch marker")
    module = call("builtins", "__import__", text("os"))
    function = global_("builtins", "getattr") + MARK + module + text("system") + b"t" + REDUCE
    return PROTO2 + function + MARK + text(shell_payload(marker)) + b"t" + REDUCE + STOP


def _subprocess_inst(marker: str) -> bytes:
    # INST calls the class with the marked arguments: subprocess.Popen(["touch", marker]).
    argv = EMPTY_LIST + text("touch") + APPEND + text(marker) + APPEND
    return PROTO2 + MARK + argv + b"isubprocess\nPopen\n" + STOP


def _memo_trick(marker: str) -> bytes:
    # Stash os.system in the memo, drop it, and call it later from inside a nested dict.
    stash = global_("os", "system") + put(7) + POP
    nested = (EMPTY_DICT + text("weight") + EMPTY_LIST + get(7) + MARK + text(shell_payload(marker)) + b"t" + REDUCE
              + APPEND + SETITEM)
    return PROTO2 + stash + nested + STOP


def _nested_in_state_dict(marker: str) -> bytes:
    # OrderedDict({"model": {"layer.weight": exec(payload)}}): looks like a checkpoint.
    inner = EMPTY_DICT + text("layer.weight") + call("builtins", "exec", text(python_payload(marker))) + SETITEM
    outer = global_("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE + text("model") + inner + SETITEM
    return PROTO2 + outer + STOP


def _build_setstate(marker: str) -> bytes:
    # BUILD with slot state {"__setstate__": exec} plants exec as the instance's
    # __setstate__; a second BUILD would then call exec(payload).
    plant = MARK + NONE + EMPTY_DICT + text("__setstate__") + global_("builtins", "exec") + SETITEM + b"t" + BUILD
    obj = global_("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE
    return PROTO2 + obj + plant + text(python_payload(marker)) + BUILD + STOP


def _newobj_user_class(marker: str) -> bytes:
    # A "model" whose own class would run code on construction or __setstate__.
    state = EMPTY_DICT + text("cmd") + text(shell_payload(marker)) + SETITEM
    return PROTO2 + global_("evil_pkg.models", "Backdoor") + EMPTY_TUPLE + NEWOBJ + state + BUILD + STOP


def _nested_pickle_loads(marker: str) -> bytes:
    # pickle.loads(<a pickle that calls exec>): the inner pickle is only bytes here.
    return b"\x80\x03" + call("pickle", "loads", binbytes(_reduce_exec(marker))) + STOP


def _codecs_lookup_trick(marker: str) -> bytes:
    # _codecs.encode is allowlisted; a codec name other than latin1 would import a module.
    return PROTO2 + call("_codecs", "encode", text(marker), text("rot13")) + STOP


PAYLOADS: list[Payload] = [
    Payload("reduce-os-system", _reduce_os_system, ("os.system",)),
    Payload("reduce-posix-system", _reduce_posix_system, ("posix.system",)),
    Payload("reduce-eval", _reduce_eval, ("builtins.eval",)),
    Payload("reduce-exec", _reduce_exec, ("builtins.exec",)),
    Payload("stack-global-exec", _stack_global_exec, ("builtins.exec",)),
    Payload("import-getattr-chain", _import_getattr_chain, ("builtins.__import__", "builtins.getattr")),
    Payload("subprocess-inst", _subprocess_inst, ("subprocess.Popen",)),
    Payload("memo-trick", _memo_trick, ("os.system",)),
    Payload("nested-in-state-dict", _nested_in_state_dict, ("builtins.exec",)),
    Payload("build-setstate", _build_setstate, ("builtins.exec",)),
    Payload("newobj-user-class", _newobj_user_class, ("evil_pkg.models.Backdoor",)),
    Payload("nested-pickle-loads", _nested_pickle_loads, ("pickle.loads",)),
]

# Payloads the reader must refuse outright (exit 2), still executing nothing.
REFUSED: list[Payload] = [
    Payload("codecs-lookup", _codecs_lookup_trick, ()),
]


def torch_zip(data_pkl: bytes, storages: dict[str, bytes] | None = None) -> bytes:
    """A torch.save-shaped zip around a pickle: archive/data.pkl, version, data/<key>."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/byteorder", "little")
        for key, data in (storages or {}).items():
            archive.writestr(f"archive/data/{key}", data)
        archive.writestr("archive/version", "3\n")
    return buffer.getvalue()


LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


def legacy(main_pickle: bytes) -> bytes:
    """The legacy torch.save layout around a pickle: magic, version, sys info, main, keys."""
    sys_info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
    return (
        pickle.dumps(LEGACY_MAGIC, protocol=2)
        + pickle.dumps(1001, protocol=2)
        + pickle.dumps(sys_info, protocol=2)
        + main_pickle
        + pickle.dumps([], protocol=2)
    )


def legacy_poisoned_header(marker: str) -> bytes:
    """A legacy file whose *system info* pickle, read before the main one, is the payload."""
    return (
        pickle.dumps(LEGACY_MAGIC, protocol=2)
        + pickle.dumps(1001, protocol=2)
        + _reduce_exec(marker)
        + pickle.dumps({}, protocol=2)
        + pickle.dumps([], protocol=2)
    )


def in_persistent_id(marker: str) -> bytes:
    """A torch zip pickle whose storage persistent id hides a REDUCE of os.system."""
    pid = (MARK + text("storage") + global_("torch", "FloatStorage") + call("os", "system", text(shell_payload(marker)))
           + text("cpu") + b"K\x01" + b"t")
    tensor = (
        global_("torch._utils", "_rebuild_tensor_v2")
        + MARK + pid + b"Q" + b"K\x00" + MARK + b"K\x01" + b"t" + MARK + b"K\x01" + b"t" + b"\x89"
        + global_("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE + b"t" + REDUCE
    )
    return PROTO2 + EMPTY_DICT + text("w") + tensor + SETITEM + STOP


def _tar(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def legacy_tar(main_pickle: bytes) -> bytes:
    """torch.save's tar layout around a pickle: no storages, no tensors, the pickle as `pickle`."""
    return _tar({
        "storages": pickle.dumps(0, protocol=2) + pickle.dumps([], protocol=2),
        "tensors": pickle.dumps(0, protocol=2),
        "pickle": main_pickle,
    })


def legacy_tar_poisoned_record(marker: str, member: str) -> bytes:
    """A tar whose storage or tensor record, read before the object, calls os.system.

    In the `storages` member the call stands for the storage's location, which a
    reader must refuse; in `tensors` it stands for the tensor class, which torch
    reads and ignores, so the file still reads and ML601 must name the call.
    """
    payload = call("os", "system", text(shell_payload(marker)))
    location = payload if member == "storages" else text("cpu")
    tensor_class = payload if member == "tensors" else global_("torch", "FloatTensor")
    storage_record = PROTO2 + MARK + b"K\x02" + location + global_("torch", "FloatStorage") + b"t" + STOP
    tensor_record = PROTO2 + MARK + b"K\x01" + b"K\x02" + tensor_class + b"t" + STOP
    return _tar({
        "storages": pickle.dumps(1, protocol=2) + storage_record + struct.pack("<q", 1) + bytes(4)
        + pickle.dumps([], protocol=2),
        "tensors": pickle.dumps(1, protocol=2) + tensor_record + struct.pack("<i4xqqq", 1, 1, 1, 0),
        "pickle": PROTO2 + EMPTY_DICT + STOP,
    })
