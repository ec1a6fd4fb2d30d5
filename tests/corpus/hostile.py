"""Hostile files, one per attack class the pickle scanners' test suites cover, and a few of our own.

Each `Hostile` names where its class comes from (`origin`: the scanner's test or
advisory that documents it) and is built here byte by byte: nothing is loaded,
imported or run to make it. A payload, if anything ever executed it, would create
the marker file or set MEMLAYOUT_PWNED (see `tests/load/malicious.py`);
`test_hostile.py` checks that memlayout either reports the file as ML601 (naming
the globals listed in `names`) or refuses it with one line, executes nothing,
and stays within the time and memory figures.

Sources:
- picklescan: mmaitre314/picklescan `tests/init_data_files.py` and `tests/test_scanner.py`
- fickling: trailofbits/fickling `test/test_bypasses.py`, `test_attack_vectors.py`,
  `test_archive_scanning.py`, `test_expansion_attack_analysis.py`, `test_polyglot.py`
- modelscan: protectai/modelscan `tests/test_modelscan.py`
"""

from __future__ import annotations

import functools
import io
import pickle
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from tests.load import malicious as m
from tests.load.malicious import MARK, PROTO2, PROTO4, REDUCE, STOP, call, global_, text

ML601 = "ML601"
REFUSED = "refused"


@dataclass(frozen=True)
class Hostile:
    """One hostile file (or folder: a dict of relative paths to bytes)."""

    name: str
    origin: str
    """Where the attack class comes from."""
    build: Callable[[str], bytes | dict[str, bytes]]
    """marker path -> the file's bytes, or a folder's files."""
    outcomes: frozenset[str]
    """What inspect may do with it: report ML601, refuse with one line, or either."""
    names: tuple[str, ...] = ()
    """Globals ML601 must name when it reports the file."""
    formats: tuple[str, ...] = ()
    """Every format the file is valid as, when it is a polyglot."""


CLEAN = "clean"
"""Read without ML601: right for a file with no pickle globals torch would refuse."""
EITHER = frozenset({ML601, REFUSED})


def _shell(marker: str) -> bytes:
    return text(m.shell_payload(marker))


def _python(marker: str) -> bytes:
    return text(m.python_payload(marker))


def _protocol0_string(value: str) -> bytes:
    return b"S" + repr(value).encode() + b"\n"


def _stack_global(module: str, name: str) -> bytes:
    return text(module) + text(name) + b"\x93"


def _zip(entries: list[tuple[str, bytes]], method: int = zipfile.ZIP_STORED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    return buffer.getvalue()


def _torch_zip(data_pkl: bytes, prefix: str = "archive/", extra: list[tuple[str, bytes]] | None = None) -> bytes:
    return _zip([(f"{prefix}data.pkl", data_pkl), (f"{prefix}byteorder", b"little"),
                 *(extra or []), (f"{prefix}version", b"3\n")])


def _benign_pickle() -> bytes:
    return pickle.dumps({"weight": [1.0, 2.0]}, protocol=2)


def _tensor(numel: int, key: str) -> bytes:
    """A float32 tensor of `numel` elements in storage `key`, as torch.save pickles it."""
    count = b"\x8a\x08" + struct.pack("<q", numel)
    storage = MARK + text("storage") + global_("torch", "FloatStorage") + text(key) + text("cpu") + count + b"t"
    return (global_("torch._utils", "_rebuild_tensor_v2") + MARK + storage + b"Q" + b"K\x00" + count + b"\x85"
            + b"K\x01\x85" + b"\x89" + global_("collections", "OrderedDict") + b")R" + b"t" + REDUCE)


def _state_dict_pickle(tensors: dict[str, tuple[int, str]]) -> bytes:
    """{name: tensor} for name -> (numel, storage key)."""
    items = b"".join(text(name) + _tensor(numel, key) + b"s" for name, (numel, key) in tensors.items())
    return PROTO2 + global_("collections", "OrderedDict") + b")R" + items + STOP


def _one_tensor_pickle(numel: int, key: str = "0") -> bytes:
    return _state_dict_pickle({"w": (numel, key)})


def _set_flag_bits(archive: bytes, member: str, bits: int) -> bytes:
    """Set general-purpose flag bits of `member` in its local header and directory entry."""
    data = bytearray(archive)
    encoded = member.encode()
    for magic, flag_at, name_at in ((b"PK\x03\x04", 6, 30), (b"PK\x01\x02", 8, 46)):
        at = data.find(magic)
        while at >= 0:
            if data[at + name_at : at + name_at + len(encoded)] == encoded:
                (flags,) = struct.unpack_from("<H", data, at + flag_at)
                struct.pack_into("<H", data, at + flag_at, flags | bits)
            at = data.find(magic, at + 4)
    return bytes(data)


@functools.lru_cache(maxsize=2)
def _deflated_zeros(inflated: int) -> tuple[bytes, int]:
    """A raw deflate stream of `inflated` zero bytes (a multiple of 1 MiB) and their CRC-32.

    A full flush resets the compressor, so every 1 MiB of zeros compresses to the
    same byte-aligned blocks: one megabyte is compressed and its blocks repeated.
    """
    from memlayout.io.zip_archive import crc32_combine

    chunk = bytes(1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    count = inflated >> 20
    body = block * count + compressor.flush()
    crc, chunk_crc = 0, zlib.crc32(chunk)
    for _ in range(count):
        crc = crc32_combine(crc, chunk_crc, len(chunk))
    return body, crc


def _with_deflate_bomb(stored: list[tuple[str, bytes]], member: str, inflated: int) -> bytes:
    """A zip of `stored` members plus `member`, deflated from `inflated` zero bytes (about 1000:1)."""
    body, crc = _deflated_zeros(inflated)
    head = _zip(stored)
    end_at = head.rfind(b"PK\x05\x06")
    _, _, _, _, count, directory_size, directory_offset, _ = struct.unpack_from("<4sHHHHIIH", head, end_at)
    locals_, directory = head[:directory_offset], head[directory_offset : directory_offset + directory_size]
    encoded = member.encode()
    # Written by hand, so the directory states the real inflated size and CRC.
    local = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0, crc, len(body), inflated, len(encoded), 0)
    entry = struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 8, 0, 0, crc, len(body), inflated,
                        len(encoded), 0, 0, 0, 0, 0, len(locals_))
    directory += entry + encoded
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count + 1, count + 1, len(directory),
                      len(locals_) + len(local) + len(encoded) + len(body), 0)
    return locals_ + local + encoded + body + directory + end


def _script_members() -> list[tuple[str, bytes]]:
    from tests.corpus.make_seeds import seed_paths

    with zipfile.ZipFile(seed_paths()["script.pt"]) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def _legacy_then_zip(marker: str) -> bytes:
    # Legacy torch.save pickles first (what torch.load reads: the file does not start
    # with a zip header), a clean zip after them (what zip tools and scanners that
    # look for the end record see).
    return m.legacy(_reduce("os", "system", _shell(marker))) + _torch_zip(_benign_pickle())


def _reduce(module: str, name: str, *args: bytes) -> bytes:
    return PROTO2 + call(module, name, *args) + STOP


def _billion_laughs_dup(_: str) -> bytes:
    # fickling test_dup_nested_expansion_pattern / coldwaterq globalLaughs.pt:
    # 9 layers of 9 DUPs, 10**9 leaves behind ~100 bytes of pickle.
    body = MARK * 9 + text("lol")
    for _ in range(9):
        body += b"2" * 9 + b"l"
    return PROTO2 + b"}" + text("w") + body + b"s" + STOP


def _billion_laughs_memo(_: str) -> bytes:
    # fickling test_memo_nested_expansion_pattern / coldwaterq billionLaughsAlt.pkl:
    # the same expansion through BINPUT/BINGET instead of DUP.
    body = MARK * 10 + text("lol") + b"q\x00"
    for layer in range(10):
        body += (b"h" + bytes([layer])) * 9 + b"l" + b"q" + bytes([layer + 1])
    return PROTO2 + b"}" + text("w") + body + b"s" + STOP


def _deep_nesting(_: str) -> bytes:
    # 100,000 nested lists: the unpickler builds them without recursion; whatever
    # walks the tree afterwards must not recurse either.
    return PROTO2 + b"}" + text("w") + b"]" * 100_000 + b"a" * 99_999 + b"s" + STOP


HOSTILE: list[Hostile] = [
    # --- REDUCE of code-running callables ------------------------------------------
    Hostile("reduce-os-system", "picklescan Malicious2; fickling test_attack_vectors.test_os_system",
            lambda k: _torch_zip(_reduce("os", "system", _shell(k))), frozenset({ML601}), ("os.system",)),
    Hostile("reduce-subprocess-run", "picklescan Malicious7; fickling test_subprocess_run",
            lambda k: _torch_zip(PROTO2 + global_("subprocess", "run") + MARK + b"]" + text("touch") + b"a"
                                 + text(k) + b"a" + b"t" + REDUCE + STOP), frozenset({ML601}), ("subprocess.run",)),
    Hostile("reduce-builtins-eval", "picklescan Malicious1 (malicious1_v4.pkl); fickling test_builtins_eval",
            lambda k: _torch_zip(_reduce("builtins", "eval", text(f"open({k!r}, 'w')"))),
            frozenset({ML601}), ("builtins.eval",)),
    Hostile("reduce-builtins-exec", "fickling test_attack_vectors.test_builtins_exec",
            lambda k: _torch_zip(_reduce("builtins", "exec", _python(k))), frozenset({ML601}), ("builtins.exec",)),
    Hostile("getattr-import-chain", "fickling test_builtins_getattr and test_builtins_import",
            lambda k: _torch_zip(m._import_getattr_chain(k)), frozenset({ML601}),
            ("builtins.__import__", "builtins.getattr")),
    Hostile("sour-pickles-protocol-0",
            "picklescan malicious0.pkl (Slaviero, Sour Pickles, Black Hat USA 2011): globals, compile, eval, apply",
            lambda k: _torch_zip(
                b"c__builtin__\nglobals\n(tRp100\n0c__builtin__\ncompile\n(" + _protocol0_string(f"open({k!r},'w')")
                + b"S''\nS'exec'\ntRp101\n0c__builtin__\neval\n(g101\ng100\ntRp102\n0c__builtin__\ngetattr\n"
                b"(c__builtin__\ndict\nS'get'\ntRp103\n0c__builtin__\napply\n(g103\n(g100\nS'x'\nltRp104\n0g104\n."),
            frozenset({ML601}), ("__builtin__.compile", "__builtin__.eval", "__builtin__.apply")),
    Hostile("inst-exec", "picklescan malicious10.pkl: INST calls the class with the marked arguments",
            lambda k: _torch_zip(b"(" + _protocol0_string(m.python_payload(k)) + b"i__builtin__\nexec\n."),
            frozenset({ML601}), ("__builtin__.exec",)),
    Hostile("obj-then-pop", "fickling GHSA-mxhj-88fx-4pcv: an OBJ call whose result POP discards",
            lambda k: _torch_zip(PROTO4 + MARK + _stack_global("smtplib", "SMTP") + text("127.0.0.1") + b"o0N" + STOP),
            frozenset({ML601}), ("smtplib.SMTP",)),
    Hostile("methodcaller-pydoc-locate", "picklescan GHSA-84r2-jw7c-4r5q; fickling GHSA-955r-x9j8-7rhh",
            lambda k: _torch_zip(PROTO2 + global_("operator", "methodcaller") + MARK + text("system") + _shell(k)
                                 + b"t" + REDUCE + MARK + call("pydoc", "locate", text("os")) + b"t" + REDUCE + STOP),
            frozenset({ML601}), ("operator.methodcaller", "pydoc.locate")),
    Hostile("runpy-run-code", "picklescan Malicious14 (runpy._run_code)",
            lambda k: _torch_zip(_reduce("runpy", "_run_code", _python(k), b"}")), frozenset({ML601}),
            ("runpy._run_code",)),
    Hostile("cprofile-run", "picklescan GHSA-49gj-c84q-6qm9; fickling GHSA-p523-jq9w-64x9",
            lambda k: _torch_zip(_reduce("cProfile", "run", _python(k))), frozenset({ML601}), ("cProfile.run",)),
    Hostile("pty-spawn", "picklescan GHSA-vqmv-47xg-9wpr; fickling GHSA-r7v6-mfhq-g3m2",
            lambda k: _torch_zip(_reduce("pty", "spawn", _shell(k))), frozenset({ML601}), ("pty.spawn",)),
    Hostile("ctypes-cdll", "picklescan GHSA-4675-36f9-wf6r; modelscan test_ctypes_blocklist",
            lambda k: _torch_zip(_reduce("ctypes", "CDLL", b"N")), frozenset({ML601}), ("ctypes.CDLL",)),
    Hostile("pydoc-pipepager", "picklescan Malicious18",
            lambda k: _torch_zip(_reduce("pydoc", "pipepager", text(""), _shell(k))), frozenset({ML601}),
            ("pydoc.pipepager",)),
    Hostile("timeit", "picklescan Malicious21",
            lambda k: _torch_zip(_reduce("timeit", "timeit", text(""), _python(k))), frozenset({ML601}),
            ("timeit.timeit",)),
    # --- STACK_GLOBAL from strings the scanner does not see as a GLOBAL ---------------
    Hostile("stack-global-from-memo", "picklescan malicious11.pkl (imaginaryctf 'Safe Pickle', picklescan #22)",
            lambda k: _torch_zip(b"Vos\np2\n0Vsystem\np3\n0Vtorch\np0\n0VLongStorage\np1\n0g2\ng3\n\x93("
                                 + _shell(k) + b"tR."), frozenset({ML601}), ("os.system",)),
    Hostile("stack-global-from-string-opcodes", "picklescan GHSA-9gvj-pp9x-gcfr (malicious23.pkl)",
            lambda k: _torch_zip(b"S'os'\nS'system'\n\x93" + _shell(k) + b"\x85R."), frozenset({ML601}),
            ("os.system",)),
    Hostile("stack-global-memo-keyerror", "picklescan keyerror-exploit.pkl: a memo miss after the payload",
            lambda k: _torch_zip(PROTO4 + global_("os", "system") + _shell(k) + b"\x85R0" + b"\x8c\x02os\x94"
                                 + b"h\x03h\x00\x93K\x42."), EITHER, ("os.system",)),
    Hostile("stack-global-type-confusion", "picklescan type-confusion-exploit.pkl: STACK_GLOBAL of (int, str)",
            lambda k: _torch_zip(PROTO4 + global_("os", "system") + _shell(k) + b"\x85R0" + b"J*\x00\x00\x00\x94"
                                 + b"\x8c\x02os\x94h\x00h\x01\x93K\x42."), EITHER, ("os.system",)),
    Hostile("dotted-attribute-through-stdlib", "fickling GHSA-5j3x-jp52-966f: STACK_GLOBAL('pathlib', 'os.system')",
            lambda k: _torch_zip(PROTO4 + _stack_global("pathlib", "os.system") + _shell(k) + b"\x85R."),
            frozenset({ML601}), ("pathlib.os.system", "can run arbitrary code")),
    Hostile("frame-boundary-divergence",
            "fickling test_frame_boundary_divergence (python/cpython#154848): BINBYTES reads past its FRAME",
            lambda k: _torch_zip(b"\x80\x05N" + b"V" + b"a" * (8192 * 16 - 17) + b"\n0(" + b"\x95"
                                 + struct.pack("<Q", 2) + b"B\x07\x01\x00\x00\x00\x00"
                                 + (global_("os", "system") + _shell(k) + b"\x85R(").ljust(261, b"N") + b"1."),
            EITHER, ("os.system",)),
    # --- torch names that are not torch's weights -------------------------------------
    Hostile("torch-inductor-compile-file", "picklescan Malicious17 (torch._inductor.codecache.compile_file)",
            lambda k: _torch_zip(_reduce("torch._inductor.codecache", "compile_file", text(""), text(""),
                                         b"]" + text("sh") + b"a" + text("-c") + b"a" + _shell(k) + b"a")),
            frozenset({ML601}), ("torch._inductor.codecache.compile_file",)),
    Hostile("torch-collect-env-run", "picklescan GHSA-f745-w6jp-hpxx (torch.utils.collect_env.run)",
            lambda k: _torch_zip(_reduce("torch.utils.collect_env", "run", _shell(k))), frozenset({ML601}),
            ("torch.utils.collect_env.run",)),
    Hostile("torch-jit-exec-wrapper", "picklescan GHSA-vr7h-p6mm-wpmh (torch.jit.unsupported_tensor_ops.execWrapper)",
            lambda k: _torch_zip(_reduce("torch.jit.unsupported_tensor_ops", "execWrapper", _python(k), b"}", b"}")),
            frozenset({ML601}), ("torch.jit.unsupported_tensor_ops.execWrapper",)),
    Hostile("partial-torch-load-weights-only-false", "picklescan Malicious19: functools.partial(torch.load, ...)",
            lambda k: _torch_zip(PROTO2 + global_("functools", "partial") + MARK + global_("torch", "load")
                                 + text("other.bin") + b"t" + REDUCE + b")R" + STOP),
            frozenset({ML601}), ("functools.partial", "torch.load")),
    Hostile("torch-lookalike-modules",
            "our own: rebuild functions under modules that only look like torch's (a trailing space, a "
            "capital, an underscore for the dot), as a scanner matching prefixes would wave through",
            lambda k: _torch_zip(PROTO2 + b"]" + b"".join(
                global_(module, "_rebuild_tensor_v2") + b"a"
                for module in ("torch._utils ", "Torch._utils", "torch_utils", "torch._utils.os")) + STOP),
            frozenset({ML601}), ("torch._utils ._rebuild_tensor_v2", "Torch._utils._rebuild_tensor_v2",
                                 "torch_utils._rebuild_tensor_v2", "torch._utils.os._rebuild_tensor_v2")),
    # --- payloads in persistent ids and side channels ------------------------------
    Hostile("payload-in-persistent-id", "our tests/load/malicious.py; picklescan scans persistent ids too",
            lambda k: _torch_zip(m.in_persistent_id(k)), EITHER, ("os.system",)),
    Hostile("payload-in-storage-key", "our own: the storage key of a persistent id is a REDUCE",
            lambda k: _torch_zip(PROTO2 + b"}" + text("w") + global_("torch._utils", "_rebuild_tensor_v2") + MARK
                                 + MARK + text("storage") + global_("torch", "FloatStorage")
                                 + call("os", "system", _shell(k)) + text("cpu") + b"K\x01t" + b"QK\x00K\x01\x85K\x01"
                                 b"\x85\x89" + global_("collections", "OrderedDict") + b")Rt" + REDUCE + b"s" + STOP),
            EITHER, ("os.system",)),
    Hostile("legacy-magic-from-eval", "picklescan pytorch_magic_bypass.pt: the legacy magic number made by eval",
            lambda k: _reduce("builtins", "eval", text("0x1950A86A20F9469CFC6C")) + pickle.dumps(1001, protocol=2)
            + pickle.dumps({}, protocol=2) + _reduce("posix", "system", _shell(k)) + pickle.dumps([], protocol=2),
            frozenset({ML601}), ("builtins.eval", "posix.system")),
    Hostile("pickles-appended", "picklescan malicious6.pkl: a clean pickle, then a malicious one",
            lambda k: _benign_pickle() + _reduce("os", "system", _shell(k)), frozenset({ML601}), ("os.system",)),
    Hostile("png-named-pt", "picklescan bad_pytorch.pt: a PNG called .pt",
            lambda k: b"\x89PNG\r\n\x1a\n" + bytes(64), frozenset({REFUSED})),
    # --- zip structure --------------------------------------------------------------
    Hostile("zip-dot-dot-member-names", "fickling test_archive_scanning (nested paths); zip-slip names",
            lambda k: _zip([("../data.pkl", _reduce("os", "system", _shell(k))), ("../version", b"3\n"),
                            ("../data/../../../escaped", b"x" * 8)]),
            EITHER, ("os.system",)),
    Hostile("zip-absolute-member-names", "zip-slip: absolute member names",
            lambda k: _zip([("/archive/data.pkl", _reduce("os", "system", _shell(k))), ("/archive/version", b"3\n")]),
            EITHER, ("os.system",)),
    Hostile("zip-duplicate-data-pkl", "our own parser differential: torch reads the first of two data.pkl, "
            "a dict keeps the last (cf. picklescan malicious1_central_directory.zip)",
            lambda k: _torch_zip(_reduce("os", "system", _shell(k)), extra=[("archive/data.pkl", _benign_pickle())]),
            EITHER, ("os.system",)),
    Hostile("zip-case-colliding-data-pkl", "our own parser differential: miniz, torch's zip reader, matches "
            "names case-insensitively",
            lambda k: _zip([("archive/DATA.PKL", _reduce("os", "system", _shell(k))),
                            ("archive/data.pkl", _benign_pickle()), ("archive/version", b"3\n")]),
            EITHER, ("os.system",)),
    *[
        Hostile(f"zip-flag-{bits:#x}", "picklescan malicious1_0x1/_0x20/_0x40.zip: flag bits torch's reader ignores",
                lambda k, bits=bits: _set_flag_bits(_torch_zip(_reduce("builtins", "eval", text(k))),
                                                    "archive/data.pkl", bits),
                EITHER, ("builtins.eval",))
        for bits in (0x1, 0x20, 0x40)
    ],
    Hostile("zip-crc-mismatch", "picklescan malicious1_crc.zip: bytes changed after the CRC was taken",
            lambda k: _torch_zip(_reduce("builtins", "eval", text(k + ":CRC-TOKEN"))).replace(
                b"CRC-TOKEN", b"crc-token", 1),
            EITHER, ("builtins.eval",)),
    Hostile("zip-absurd-member-size", "modelscan/picklescan zip handling; our own: a directory entry that claims "
            "2**62 bytes through its zip64 field",
            lambda k: _absurd_size(_torch_zip(_reduce("os", "system", _shell(k)))), frozenset({REFUSED})),
    Hostile("zip-overlapping-records", "our own: two storage records that share their bytes",
            lambda k: _overlapping_records(), frozenset({CLEAN, *EITHER})),
    Hostile("zip-bomb-data-pkl", "zip bombs (Fifield, 'A better zip bomb', 2019): 1 GiB of data.pkl deflated",
            lambda k: _with_deflate_bomb([("archive/version", b"3\n")], "archive/data.pkl", 1 << 30),
            frozenset({REFUSED})),
    Hostile("zip-bomb-torchscript-code", "zip bombs: a real TorchScript archive whose code member inflates to 1 GiB",
            lambda k: _with_deflate_bomb(
                [(n, d) for n, d in _script_members() if not n.endswith("linear.py")],
                next(n for n, _ in _script_members() if n.endswith("linear.py")), 1 << 30),
            frozenset({REFUSED, CLEAN})),
    # --- nested archives and polyglots -----------------------------------------------
    Hostile("nested-archive-as-storage", "fickling test_archive_scanning.test_deeply_nested_malicious_pickle",
            lambda k: _torch_zip(_one_tensor_pickle(4), extra=[("archive/data/0", _torch_zip(
                _reduce("os", "system", _shell(k))))]), frozenset({CLEAN})),
    Hostile("polyglot-legacy-then-zip", "fickling polyglot.py / test_polyglot: valid as legacy torch.save and as zip",
            _legacy_then_zip, frozenset({ML601}), ("os.system",), ("torch-legacy", "zip")),
    Hostile("polyglot-tar-then-zip", "fickling test_polyglot (legacy tar); our own tar+zip polyglot",
            lambda k: m.legacy_tar(_reduce("os", "system", _shell(k))) + _torch_zip(_benign_pickle()),
            frozenset({ML601}), ("os.system",), ("torch-legacy-tar", "zip")),
    # --- absurd sizes in headers -----------------------------------------------------
    Hostile("pickle-claims-2-62-elements", "our own: a tensor whose pickle claims 2**62 elements of an 8-byte record",
            lambda k: _torch_zip(_one_tensor_pickle(1 << 62), extra=[("archive/data/0", bytes(8))]),
            frozenset({REFUSED})),
    Hostile("safetensors-claims-2-80-bytes", "our own: a safetensors header claiming a [2**40, 2**40] tensor",
            lambda k: _safetensors({"w": {"dtype": "F32", "shape": [1 << 40, 1 << 40],
                                          "data_offsets": [0, 1 << 80]}}, bytes(16)), EITHER),
    Hostile("safetensors-header-length-2-63", "our own: the 8-byte header length says 2**63 - 1",
            lambda k: struct.pack("<Q", (1 << 63) - 1) + b"{}", EITHER),
    Hostile("tar-member-claims-huge-size", "our own: a tar header size field of 8 GiB in a 10 KiB file",
            lambda k: _tar_huge_member(), EITHER),
    # --- expansion and depth ---------------------------------------------------------
    Hostile("billion-laughs-dup", "fickling test_expansion_attack_analysis (coldwaterq globalLaughs.pt)",
            lambda k: _torch_zip(_billion_laughs_dup(k)), frozenset({CLEAN, REFUSED})),
    Hostile("billion-laughs-memo", "fickling test_expansion_attack_analysis (coldwaterq billionLaughsAlt.pkl)",
            lambda k: _torch_zip(_billion_laughs_memo(k)), frozenset({CLEAN, REFUSED})),
    Hostile("deep-nesting", "our own: 100,000 nested lists",
            lambda k: _torch_zip(_deep_nesting(k)), frozenset({CLEAN, REFUSED})),
    Hostile("memo-index-2-30", "our fuzzing (tests/corpus/regressions): LONG_BINPUT 959917433",
            lambda k: _torch_zip(PROTO2 + b"Nr" + struct.pack("<I", 959_917_433) + STOP), frozenset({REFUSED})),
]
"""Every hostile file; `BY_NAME` indexes them."""


def _safetensors(header: dict[str, object], body: bytes) -> bytes:
    import json

    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def _absurd_size(archive: bytes) -> bytes:
    # Saturate data.pkl's sizes in its directory entry and give the real ones in a
    # zip64 extra field: 2**62 bytes.
    data = bytearray(archive)
    name = b"archive/data.pkl"
    at = data.find(b"PK\x01\x02")
    while data[at + 46 : at + 46 + len(name)] != name:
        at = data.find(b"PK\x01\x02", at + 4)
    struct.pack_into("<II", data, at + 20, 0xFFFFFFFF, 0xFFFFFFFF)
    name_end = at + 46 + len(name)
    (extra_length,) = struct.unpack_from("<H", data, at + 30)
    extra = struct.pack("<HHQQ", 0x0001, 16, 1 << 62, 1 << 62)
    data[name_end + extra_length : name_end + extra_length] = extra
    struct.pack_into("<H", data, at + 30, extra_length + len(extra))
    end = data.rfind(b"PK\x05\x06")
    (directory_size,) = struct.unpack_from("<I", data, end + 12)
    struct.pack_into("<I", data, end + 12, directory_size + len(extra))
    return bytes(data)


def _overlapping_records() -> bytes:
    # Two storages whose records are one and the same bytes: the second directory
    # entry points at the first one's local header.
    archive = bytearray(_torch_zip(_state_dict_pickle({"a": (2, "0"), "b": (2, "1")}),
                                   extra=[("archive/data/0", bytes(8)), ("archive/data/1", bytes(8))]))
    entries = []
    at = archive.find(b"PK\x01\x02")
    while at >= 0:
        entries.append(at)
        at = archive.find(b"PK\x01\x02", at + 4)
    name_of = {entry: bytes(archive[entry + 46 : entry + 46 + 14]) for entry in entries}
    first = next(e for e in entries if name_of[e] == b"archive/data/0")
    (offset,) = struct.unpack_from("<I", archive, first + 42)
    for entry in entries:
        if name_of[entry] == b"archive/data/1":
            struct.pack_into("<I", archive, entry + 42, offset)
    return bytes(archive)


def _tar_huge_member() -> bytes:
    archive = bytearray(m.legacy_tar(_benign_pickle()))
    # The first member's size field (12 octal digits at offset 124) says 8 GiB.
    archive[124:136] = b"%011o\x00" % (8 << 30)
    checksum = sum(archive[:148]) + 8 * 32 + sum(archive[156:512])
    archive[148:156] = b"%06o\x00 " % checksum
    return bytes(archive)


BY_NAME = {hostile.name: hostile for hostile in HOSTILE}
