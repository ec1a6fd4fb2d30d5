"""What each global a pickle names can do when it is unpickled: ML601's danger classes, as data.

Over 450 lines on purpose: the table is one entry per global, each with its source
and the proof its test runs, and splitting it would only scatter one list.

Every global a pickle names is one of three classes:

- `RUNS_CODE`: it runs code or reaches the system (a command, a file, the network,
  an import, the interpreter's internals) when a pickle calls it, or hands a later
  call such a thing. The entries of `REACHES` below, each with the scanner or
  advisory that lists it and a proof: Python, run by
  tests/rules/test_pickle_dangers.py with `g` bound to the global as the unpickler
  resolves it, that raises an audit event (PEP 578) which only such an operation
  raises. The test's hook blocks the event, so the proof never completes.
- `CONSTRUCTS_OBJECT`: anything else outside the allow-list. Unpickling imports its
  module (running that module's import-time code, if installed) and calls or
  constructs it with arguments the file chooses; by itself that is a class of the
  model, a numpy scalar, a tokenizer: inert unless the class does something in its
  constructor or `__setstate__`.
- `ALLOW_LISTED`: torch's weights-only loader accepts it (`memlayout.load.weights_only_allowlist`),
  or, in a bare or joblib pickle, numpy and joblib rebuild an array with it.

A global outside `REACHES` can still be dangerous: the list is what is known, and a
constructs-object finding is still a finding. Where memlayout's list differs from
picklescan's and modelscan's, docs/pickles.md says so and why.
"""

from __future__ import annotations

import _compat_pickle
import enum
from typing import NamedTuple


class Danger(str, enum.Enum):
    """What unpickling one global can do."""

    RUNS_CODE = "runs-code"
    """Runs code or reaches the system: a command, a file, the network, an import."""
    CONSTRUCTS_OBJECT = "constructs-object"
    """Not allow-listed, but inert by itself: imports its module and builds an object."""
    ALLOW_LISTED = "allow-listed"
    """torch's weights-only loader accepts it (numpy's array globals, in a bare or joblib pickle)."""


class JudgedGlobal(NamedTuple):
    """One global a pickle names, with its danger class: what ML601 lists."""

    module: str
    name: str
    danger: Danger
    does: str
    """Why it is in its class, in a few words; "" for an allow-listed global."""
    member: str = ""
    """Where in the file the pickle that names it is: "" for the file itself, else the member of an
    archive or compressed stream ("model/extra.pkl")."""


class Reach(NamedTuple):
    """One global, or every global of a module, that runs code or reaches the system."""

    module: str
    name: str
    """The attribute, dotted for a class's method ("Trace.run"); "*" for the module and its submodules."""
    does: str
    """What a pickle that calls it can do."""
    source: str
    """Who lists it: picklescan's `_unsafe_globals`, modelscan's `unsafe_globals`, fickling's
    `UNSAFE_IMPORTS`, or memlayout (with the reason)."""
    proof: str
    """Python the test runs with `g` bound to the global (the module, for "*"); it raises `event`."""
    event: str
    """The audit event (PEP 578) the proof raises: what only reaching the system raises."""


_PAYLOAD = "b\"cos\\nsystem\\n(S'true'\\ntR.\""
"""A protocol-0 pickle that calls os.system('true'), for the proofs of globals that unpickle bytes."""
_NOWHERE = "('127.0.0.1', 9)"
"""The discard port of this machine: a proof's connection is blocked before it is attempted."""

REACHES: tuple[Reach, ...] = (
    # --- builtins: torch's weights-only unpickler refuses all of them ---------------------------
    Reach("builtins", "eval", "evaluates a Python expression", "picklescan, modelscan, fickling",
          "g('1 + 1')", "exec"),
    Reach("builtins", "exec", "runs Python statements", "picklescan, modelscan, fickling", "g('x = 1')", "exec"),
    Reach("builtins", "compile", "compiles source into a code object that exec or eval runs",
          "picklescan, modelscan, fickling", "g('1', '<pickle>', 'eval')", "compile"),
    Reach("builtins", "getattr", "fetches any attribute of what it is given (a module's system, a class's "
          "__subclasses__): getattr chains reach any callable", "picklescan, modelscan, fickling",
          "g(__import__('os'), 'system')('true')", "os.system"),
    Reach("builtins", "setattr", "overwrites any attribute: a module's function, a class's method",
          "fickling",
          "(lambda m: (g(m, 'system', print), m.system is print)[1])(__import__('types').ModuleType('m'))", ""),
    Reach("builtins", "delattr", "deletes any attribute, such as a module's function", "fickling",
          "(lambda m: (setattr(m, 'x', 1), g(m, 'x'), not hasattr(m, 'x'))[2])(__import__('types').ModuleType('m'))",
          ""),
    Reach("builtins", "__import__", "imports any module, running its top-level code", "modelscan, fickling",
          "g('memlayout_proof_module')", "import"),
    Reach("builtins", "open", "opens any file, for reading or writing", "picklescan, modelscan, fickling",
          "g('/dev/null')", "open"),
    Reach("builtins", "breakpoint", "starts the debugger, which runs what stdin types",
          "picklescan, modelscan, fickling", "g()", "builtins.breakpoint"),
    Reach("builtins", "globals", "hands over a namespace whose __builtins__ reach eval and __import__",
          "picklescan (suspicious), fickling", "'__builtins__' in g()", ""),
    Reach("builtins", "vars", "hands over any object's namespace (a module's functions)", "fickling",
          "'system' in g(__import__('os'))", ""),
    # --- processes and the shell -------------------------------------------------------------
    Reach("os", "*", "runs shell commands, starts processes, writes and removes files",
          "picklescan, modelscan, fickling", "g.system('true')", "os.system"),
    Reach("posix", "*", "os on Linux and macOS: os.system is pickled as posix.system",
          "picklescan, modelscan, fickling", "g.system('true')", "os.system"),
    Reach("nt", "*", "os on Windows: os.system is pickled as nt.system", "picklescan, modelscan, fickling",
          "g.system('true')", "os.system"),
    Reach("subprocess", "*", "starts processes", "picklescan, modelscan, fickling", "g.Popen(['true'])",
          "subprocess.Popen"),
    Reach("commands", "*", "Python 2's subprocess, which pickle maps to subprocess",
          "picklescan, fickling", "g.getoutput('true')", "subprocess.Popen"),
    Reach("pty", "*", "spawns a process on a pseudo-terminal", "picklescan, modelscan, fickling",
          "g.spawn(['true'])", "pty.spawn"),
    Reach("multiprocessing", "*", "starts processes that run any callable", "fickling",
          "g.get_context('fork').Process(target=print).start()", "os.fork"),
    Reach("asyncio", "*", "starts processes and opens connections from coroutines",
          "picklescan, modelscan, fickling", "g.run(g.create_subprocess_exec('true'))", "subprocess.Popen"),
    Reach("sys", "*", "reaches the interpreter itself: its module table, audit hooks, exit",
          "picklescan, modelscan, fickling", "g.addaudithook(print)", "sys.addaudithook"),
    Reach("platform", "*", "runs commands to describe the system (platform.architecture runs `file`)",
          "fickling", "g.architecture('/bin/sh')", "subprocess.Popen"),
    Reach("uuid", "*", "uuid._get_command_stdout runs a command", "picklescan, fickling",
          "g._get_command_stdout('true')", "subprocess.Popen"),
    Reach("_osx_support", "*", "_read_output runs a shell command", "picklescan, fickling",
          "g._read_output('true')", "os.system"),
    Reach("_aix_support", "*", "runs commands to describe the system (_aix_bos_rte runs lslpp)",
          "picklescan, fickling", "g._aix_bos_rte()", "subprocess.Popen"),
    Reach("imaplib", "IMAP4_stream", "runs its argument as a shell command", "picklescan, fickling",
          "g('true')", "subprocess.Popen"),
    Reach("pydoc", "*", "pipepager runs a shell command; locate imports any module", "picklescan, fickling",
          "g.pipepager('', 'true')", "subprocess.Popen"),
    Reach("ensurepip", "*", "runs pip in a new Python process", "picklescan, fickling",
          "g._run_pip(['--version'])", "subprocess.Popen"),
    Reach("venv", "*", "creates an environment and runs pip in it", "picklescan, fickling",
          "g.create(__import__('tempfile').mkdtemp() + '/env', with_pip=True)", "subprocess.Popen"),
    # --- running code strings ----------------------------------------------------------------
    Reach("runpy", "*", "runs a module or a code string (runpy._run_code)", "picklescan, modelscan, fickling",
          "g._run_code('x = 1', {})", "exec"),
    Reach("code", "*", "runs Python source (InteractiveInterpreter.runsource)", "picklescan, fickling",
          "g.InteractiveInterpreter().runsource('x = 1')", "exec"),
    Reach("codeop", "*", "compiles source into code objects, as builtins.compile does", "fickling",
          "g.compile_command('x = 1')", "compile"),
    Reach("timeit", "*", "runs code strings (timeit.timeit)", "picklescan, fickling",
          "g.timeit('x = 1', number=1)", "exec"),
    Reach("cProfile", "*", "runs code strings (cProfile.run)", "picklescan, fickling", "g.run('x = 1')", "exec"),
    Reach("profile", "*", "runs code strings (profile.run)", "picklescan, fickling", "g.run('x = 1')", "exec"),
    Reach("trace", "Trace.run", "runs a code string under the tracer", "picklescan, fickling",
          "g(__import__('trace').Trace(count=0, trace=0), 'x = 1')", "exec"),
    Reach("trace", "Trace.runctx", "runs a code string under the tracer", "picklescan, fickling",
          "g(__import__('trace').Trace(count=0, trace=0), 'x = 1', {}, {})", "exec"),
    Reach("pdb", "*", "runs code under the debugger (pdb.run)", "picklescan, modelscan, fickling",
          "g.Pdb(nosigint=True).run('x = 1')", "sys.settrace"),
    Reach("bdb", "*", "runs code under a trace function (Bdb.run)", "picklescan, modelscan, fickling",
          "g.Bdb().run('x = 1')", "sys.settrace"),
    Reach("doctest", "debug_script", "runs a script under pdb", "picklescan, fickling", "g('x = 1')",
          "sys.settrace"),
    Reach("numpy.testing._private.utils", "runstring", "exec of a string", "picklescan, fickling",
          "g('x = 1', {})", "exec"),
    Reach("numpy.f2py", "*", "evaluates Fortran expressions with eval (crackfortran's getlincoef, _eval_scalar)",
          "picklescan, fickling", "__import__('numpy.f2py.crackfortran', fromlist=['x'])._eval_scalar('1 + 1', {})",
          "exec"),
    Reach("idlelib", "*", "IDLE's shell and debugger run and evaluate code (calltip.get_entity, "
          "debugobj.ObjectTreeItem.SetText, run.Executive.runcode)", "picklescan, fickling",
          "__import__('idlelib.calltip', fromlist=['x']).get_entity('1 + 1')", "exec"),
    Reach("test", "*", "CPython's test support starts Python processes (support.script_helper.assert_python_ok)",
          "picklescan, fickling", "__import__('test.support.script_helper', fromlist=['x']).assert_python_ok("
          "'-c', 'pass')", "subprocess.Popen"),
    Reach("_pyrepl", "*", "the REPL's pager runs a shell command (pager.pipe_pager)", "picklescan",
          "__import__('_pyrepl.pager', fromlist=['x']).pipe_pager('', 'true')", "subprocess.Popen"),
    Reach("cloudpickle", "*", "rebuilds functions from code objects and imports modules (_make_function, "
          "subimport)", "picklescan, fickling",
          "__import__('cloudpickle.cloudpickle', fromlist=['x']).subimport('memlayout_proof_cloudpickle')", "exec"),
    Reach("types", "CodeType", "builds a code object from raw bytecode", "picklescan, fickling",
          "(lambda: 0).__code__.replace(co_name='proof')", "code.__new__"),
    Reach("types", "FunctionType", "builds a function from a code object and a namespace",
          "fickling (types); memlayout: what cloudpickle's _make_function calls",
          "g((lambda: 0).__code__, {})", "function.__new__"),
    Reach("marshal", "*", "builds code objects from bytes (marshal.loads), which exec then runs", "fickling",
          "g.loads(g.dumps(compile('1', '', 'eval')))", "marshal.loads"),
    # --- imports and attribute walks ---------------------------------------------------------
    Reach("importlib", "*", "imports any module, running its top-level code", "fickling",
          "g.import_module('memlayout_proof_importlib')", "exec"),
    Reach("pkgutil", "resolve_name", "resolves any module:attribute, importing it", "picklescan, fickling",
          "g('memlayout_proof_pkgutil:x')", "exec"),
    Reach("operator", "attrgetter", "fetches attributes by name: attrgetter('system')(os)",
          "picklescan, modelscan, fickling", "g('system')(__import__('os'))('true')", "os.system"),
    Reach("operator", "methodcaller", "calls a method by name on what it is given: methodcaller('system', cmd)(os)",
          "picklescan, fickling", "g('system', 'true')(__import__('os'))", "os.system"),
    Reach("operator", "itemgetter", "fetches items by key: itemgetter('system')(vars(os))",
          "picklescan, fickling", "g('system')(vars(__import__('os')))('true')", "os.system"),
    Reach("_operator", "attrgetter", "operator.attrgetter under its C module's name", "picklescan, fickling",
          "g('system')(__import__('os'))('true')", "os.system"),
    Reach("_operator", "methodcaller", "operator.methodcaller under its C module's name", "picklescan, fickling",
          "g('system', 'true')(__import__('os'))", "os.system"),
    Reach("_operator", "itemgetter", "operator.itemgetter under its C module's name", "picklescan, fickling",
          "g('system')(vars(__import__('os')))('true')", "os.system"),
    Reach("functools", "partial", "binds arguments to any callable for a later call: partial(os.system, cmd)",
          "picklescan, fickling", "g(__import__('os').system, 'true')()", "os.system"),
    # --- nested pickles ----------------------------------------------------------------------
    Reach("pickle", "*", "unpickles nested bytes with every import they name (pickle.loads)",
          "picklescan, modelscan, fickling", f"g.loads({_PAYLOAD})", "pickle.find_class"),
    Reach("_pickle", "*", "pickle's C module: unpickles nested bytes", "picklescan, modelscan, fickling",
          f"g.loads({_PAYLOAD})", "pickle.find_class"),
    Reach("lib2to3", "*", "Grammar.loads unpickles bytes; ParserGenerator.make_label evals strings",
          "picklescan, fickling",
          f"__import__('lib2to3.pgen2.grammar', fromlist=['x']).Grammar().loads({_PAYLOAD})", "pickle.find_class"),
    # --- native code, files and the network --------------------------------------------------
    Reach("ctypes", "*", "loads shared libraries and calls native functions", "picklescan, fickling",
          "g.CDLL(None)", "ctypes.dlopen"),
    Reach("shutil", "*", "copies, moves and removes files and trees", "picklescan, modelscan, fickling",
          "g.rmtree('/nonexistent/memlayout-proof')", "shutil.rmtree"),
    Reach("_io", "FileIO", "opens any file, bypassing a block on builtins.open", "picklescan, fickling",
          "g('/dev/null')", "open"),
    Reach("_io", "open", "opens any file", "fickling", "g('/dev/null')", "open"),
    Reach("io", "FileIO", "opens any file", "fickling", "g('/dev/null')", "open"),
    Reach("io", "open", "opens any file", "fickling", "g('/dev/null')", "open"),
    Reach("logging", "FileHandler", "creates or appends to any file", "picklescan, fickling",
          "g('/dev/null')", "open"),
    Reach("distutils", "*", "writes files (file_util.write_file) and runs build commands", "picklescan, fickling",
          "__import__('distutils.file_util', fromlist=['x']).write_file('/dev/null', [])", "open"),
    Reach("socket", "*", "opens network connections", "picklescan, modelscan, fickling",
          f"g.socket().connect({_NOWHERE})", "socket.connect"),
    Reach("ssl", "*", "opens network connections (get_server_certificate leaks data through DNS)",
          "picklescan, fickling", f"g.get_server_certificate({_NOWHERE})", "socket.getaddrinfo"),
    Reach("httplib", "*", "Python 2's http.client, which pickle maps to it: HTTP connections",
          "picklescan, modelscan, fickling", "g.HTTPConnection('127.0.0.1', 9).connect()", "socket.getaddrinfo"),
    Reach("http.client", "*", "opens HTTP connections", "memlayout: what httplib is in Python 3",
          "g.HTTPConnection('127.0.0.1', 9).connect()", "socket.getaddrinfo"),
    Reach("urllib.request", "*", "fetches URLs (server-side requests, data leaks)", "picklescan, fickling",
          "g.urlopen('http://127.0.0.1:9/')", "urllib.Request"),
    Reach("requests", "*", "sends HTTP requests (requests.api.get)", "picklescan, modelscan, fickling",
          "g.get('http://127.0.0.1:9/', timeout=1)", "socket.getaddrinfo"),
    Reach("aiohttp", "*", "opens HTTP connections (aiohttp.client.ClientSession)", "picklescan, modelscan, fickling",
          "(lambda ns: (exec('async def get(g):\\n    async with g.request(\\'GET\\', \\'http://127.0.0.1:9/\\'):\\n"
          "        pass', ns), __import__('asyncio').run(ns['get'](g))))({})", "socket.connect"),
    Reach("smtplib", "*", "opens mail connections (smtplib.SMTP)", "fickling",
          "g.SMTP('127.0.0.1', 9)", "socket.getaddrinfo"),
    Reach("ftplib", "*", "opens FTP connections", "fickling", "g.FTP('127.0.0.1')", "socket.getaddrinfo"),
    Reach("poplib", "*", "opens mail connections", "fickling", "g.POP3('127.0.0.1', 9)", "socket.getaddrinfo"),
    Reach("webbrowser", "*", "opens URLs in a browser, starting a process", "picklescan, modelscan, fickling",
          "g.GenericBrowser('true').open('http://127.0.0.1:9/')", "webbrowser.open"),
    Reach("pip", "*", "installs packages: runs commands, downloads packages and runs their build code",
          "picklescan, fickling",
          "g.main(['download', '--no-deps', '--retries', '0', '--timeout', '1', '--no-cache-dir', '-d', "
          "__import__('tempfile').mkdtemp(), '--index-url', 'http://127.0.0.1:9/simple', 'memlayout-proof'])",
          "subprocess.Popen"),
    # --- torch's own code runners --------------------------------------------------------------
    Reach("torch", "load", "loads another file, with weights_only=False if the pickle says so",
          "picklescan (torch.serialization.load), fickling",
          f"g(__import__('io').BytesIO({_PAYLOAD}), weights_only=False)", "pickle.find_class"),
    Reach("torch.serialization", "load", "torch.load under its module's name",
          "picklescan, fickling", f"g(__import__('io').BytesIO({_PAYLOAD}), weights_only=False)",
          "pickle.find_class"),
    Reach("torch.storage", "_load_from_bytes", "torch.load of bytes the pickle supplies", "fickling",
          f"g({_PAYLOAD})", "pickle.find_class"),
    Reach("torch.hub", "*", "downloads and runs code and weights from the web", "fickling; memlayout",
          "g.load_state_dict_from_url('http://127.0.0.1:9/w.pt', model_dir=__import__('tempfile').mkdtemp())",
          "urllib.Request"),
    Reach("torch._inductor.codecache", "compile_file", "runs a compiler command line it is given",
          "picklescan", "g('', '', ['true'])", "subprocess.Popen"),
    Reach("torch.utils.collect_env", "run", "runs a shell command", "picklescan", "g('true')",
          "subprocess.Popen"),
    Reach("torch.jit.unsupported_tensor_ops", "execWrapper", "exec of a string", "picklescan",
          "g('x = 1', {}, {})", "exec"),
    Reach("torch.fx.experimental.symbolic_shapes", "ShapeEnv.evaluate_guards_expression", "eval of a string",
          "picklescan", "g(g.__globals__['ShapeEnv'](), 'True', [])", "exec"),
    Reach("torch.utils.bottleneck", "*", "runs code strings under the profilers (__main__.run_cprofile, "
          "run_autograd_prof)", "picklescan",
          "__import__('torch.utils.bottleneck.__main__', fromlist=['x']).run_cprofile('x = 1', {})", "exec"),
    Reach("torch.utils.data.datapipes.utils.decoder", "basichandlers", "unpickles bytes it is given",
          "picklescan", f"g('pickle', {_PAYLOAD})", "pickle.find_class"),
    Reach("torch.utils._config_module", "ConfigModule.load_config", "unpickles bytes it is given", "picklescan",
          f"g(__import__('torch._dynamo.config', fromlist=['x']), {_PAYLOAD})", "pickle.find_class"),
)
"""Every global known to run code or reach the system, each with its proof."""

_BUILTIN_MODULES = frozenset(["builtins", "__builtin__", "__builtins__"])
_WHOLE_MODULES = {reach.module: reach for reach in REACHES if reach.name == "*"}
_NAMED = {(reach.module, reach.name): reach for reach in REACHES if reach.name != "*"}


def _unaliased(module: str, name: str) -> tuple[str, str]:
    # pickle maps Python 2 names to Python 3 ones when it resolves a global
    # (protocols 0 to 2: `__builtin__.eval` is builtins.eval, `httplib` http.client).
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name


def reach_of(module: str, name: str) -> Reach | None:
    """The entry of `REACHES` a global falls under, or None.

    A module entry ("*") covers the module and its submodules; a named entry its
    name, and a dotted name's prefix (`Trace.run.__call__`). Protocol 4 resolves a
    dotted name attribute by attribute, so `pathlib` + `os.system` is os.system
    reached through pathlib's import of os (fickling GHSA-5j3x-jp52-966f): every
    module a dotted name walks through is looked up too, and a walk through a
    dunder (`__globals__`, `__builtins__`, `__subclasses__`) reaches any object.

    Args:
        module: The module as the pickle spells it.
        name: The name as the pickle spells it.

    Returns:
        The entry, or None for a global no entry covers.
    """
    for spelled in dict.fromkeys([(module, name), _unaliased(module, name)]):
        found = _reach(*spelled)
        if found is not None:
            return found
    return None


def _reach(module: str, name: str) -> Reach | None:
    if module in _BUILTIN_MODULES:
        module = "builtins"
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        found = _WHOLE_MODULES.get(".".join(parts[:end]))
        if found is not None:
            return found
    steps = name.split(".")
    for end in range(len(steps), 0, -1):
        found = _NAMED.get((module, ".".join(steps[:end])))
        if found is not None:
            return found
    for at, step in enumerate(steps[:-1]):
        if step.startswith("__") and step.endswith("__"):
            return _DUNDER_WALK
        if step in _BUILTIN_MODULES:
            return _reach("builtins", ".".join(steps[at + 1 :]))
        found = _WHOLE_MODULES.get(step)
        if found is not None:
            return found
    return None


_DUNDER_WALK = Reach(
    "*", "*", "walks through a dunder attribute (__globals__, __builtins__, __subclasses__), which reaches any "
    "object of the interpreter", "memlayout; fickling flags private and dunder names", "", "",
)


def judge(module: str, name: str, allowed: bool, member: str = "") -> JudgedGlobal:
    """The danger class of one global a pickle names.

    Args:
        module: The module as the pickle spells it.
        name: The name.
        allowed: Whether torch's weights-only loader accepts it (or, in a bare or
            joblib pickle, it is one of numpy's array globals), as the loader recorded it.
        member: Where in the file the pickle naming it is ("" for the file itself).

    Returns:
        The global with its class and why.
    """
    if allowed:
        return JudgedGlobal(module, name, Danger.ALLOW_LISTED, "", member)
    reach = reach_of(module, name)
    if reach is not None:
        return JudgedGlobal(module, name, Danger.RUNS_CODE, reach.does, member)
    return JudgedGlobal(
        module, name, Danger.CONSTRUCTS_OBJECT,
        "imports its module and calls or constructs it with arguments the file chooses", member,
    )
