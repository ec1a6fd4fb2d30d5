"""The atomic writer on real paths: devices, pipes, sockets, symlinks, modes, owners, temporaries.

Each case is run for real, as root where the machine allows it (the case users hit
in containers), and skipped with a reason where it cannot be set up.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from memlayout.errors import OutputError
from memlayout.io.atomic_write import (
    TEMPORARY_PREFIX,
    atomic_directory,
    atomic_file,
    remove_stale_temporaries,
    temporary_name,
    write_bytes,
    write_text,
)

IS_ROOT = os.geteuid() == 0
DEMO = str(Path(__file__).resolve().parents[2] / "fixtures" / "demo_checkpoint.pt")


def listing(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def run_python(code: str, *args: str, umask: int | None = None) -> subprocess.CompletedProcess[str]:
    prefix = f"import os; os.umask({umask:#o})\n" if umask is not None else ""
    return subprocess.run(
        [sys.executable, "-c", prefix + textwrap.dedent(code), *args], capture_output=True, text=True, timeout=60
    )


# --- devices, pipes, sockets: written straight into ---------------------------


@pytest.mark.skipif(not IS_ROOT, reason="making a device node needs root")
def test_a_character_device_is_written_into_and_stays_a_device(tmp_path: Path) -> None:
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.chmod(null, 0o666)  # mknod applies the umask
    inode = os.lstat(null).st_ino
    write_text(str(null), "report")
    status = os.lstat(null)
    assert stat.S_ISCHR(status.st_mode) and status.st_rdev == os.makedev(1, 3)
    assert (stat.S_IMODE(status.st_mode), status.st_ino) == (0o666, inode)
    assert listing(tmp_path) == ["null"]


@pytest.mark.skipif(not IS_ROOT, reason="the case that broke /dev/null needs root")
def test_inspect_to_dev_null_as_root_leaves_dev_null_a_device(tmp_path: Path) -> None:
    # Proven first on a node of our own, so that a regression cannot break the machine's.
    own = tmp_path / "null"
    os.mknod(own, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    probe = subprocess.run(
        [sys.executable, "-m", "memlayout", "inspect", DEMO, "--format", "json", "-o", str(own)],
        capture_output=True, text=True, timeout=120,
    )
    assert probe.returncode == 1, probe.stderr
    assert stat.S_ISCHR(os.lstat(own).st_mode), "the writer replaced a device node; /dev/null not tried"
    before = os.lstat("/dev/null")
    result = subprocess.run(
        [sys.executable, "-m", "memlayout", "inspect", DEMO, "--format", "json", "-o", "/dev/null"],
        capture_output=True, text=True, timeout=120,
    )
    after = os.lstat("/dev/null")
    assert result.returncode == 1, result.stderr
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert (after.st_ino, stat.S_IMODE(after.st_mode)) == (before.st_ino, stat.S_IMODE(before.st_mode))


def test_a_fifo_is_written_into_without_a_temporary(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    write_bytes(str(fifo), b"x" * 200_000)  # more than a pipe buffer: the reader must drain it
    reader.join(timeout=30)
    assert received == [b"x" * 200_000]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert listing(tmp_path) == ["pipe"]


def test_a_fifo_gets_a_torch_save_stream_that_torch_load_reads(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    with atomic_file(str(fifo)) as output:
        assert output.is_stream
        torch.save({"w": torch.arange(10)}, output.path)
    reader.join(timeout=30)
    (tmp_path / "copy.pt").write_bytes(received[0])
    assert torch.equal(torch.load(tmp_path / "copy.pt")["w"], torch.arange(10))


def test_a_unix_socket_gets_the_bytes_of_a_path_writer(tmp_path: Path) -> None:
    path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    received: list[bytes] = []

    def serve() -> None:
        connection, _ = server.accept()
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
        received.append(b"".join(chunks))
        connection.close()

    thread = threading.Thread(target=serve)
    thread.start()
    with atomic_file(str(path)) as output:
        torch.save({"w": torch.ones(4)}, output.path)  # a socket has no path to open: spooled
    thread.join(timeout=30)
    server.close()
    (tmp_path / "copy.pt").write_bytes(received[0])
    assert torch.equal(torch.load(tmp_path / "copy.pt")["w"], torch.ones(4))
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_own_stdout_paths_write_to_stdout_whether_a_pipe_or_a_file(tmp_path: Path) -> None:
    code = """
        import sys
        from memlayout.io.atomic_write import write_text
        for target in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"):
            print("before", target, flush=True)
            write_text(target, "via " + target + "\\n")
        """
    expected = "".join(f"before {t}\nvia {t}\n" for t in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"))
    to_pipe = run_python(code)
    assert (to_pipe.returncode, to_pipe.stdout) == (0, expected), to_pipe.stderr
    redirected = tmp_path / "out.txt"
    with open(redirected, "w") as stream:  # a shell `>`: the fd's offset is kept, nothing truncated
        subprocess.run([sys.executable, "-c", textwrap.dedent(code)], stdout=stream, timeout=60, check=True)
    assert redirected.read_text() == expected
    assert listing(tmp_path) == ["out.txt"]


# --- symlinks: followed, the link stays a link ---------------------------------


def test_a_symlink_chain_is_followed_and_the_target_replaced_beside_it(tmp_path: Path) -> None:
    data, links = tmp_path / "data", tmp_path / "links"
    data.mkdir()
    links.mkdir()
    target = data / "report.json"
    target.write_text("old")
    os.chmod(target, 0o640)
    (links / "first").symlink_to(target)
    (links / "second").symlink_to("first")  # relative, to a link
    write_text(str(links / "second"), "new")
    assert target.read_text() == "new"
    assert os.path.islink(links / "second") and os.path.islink(links / "first")
    assert os.readlink(links / "second") == "first"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640
    assert listing(links) == ["first", "second"]
    assert listing(data) == ["report.json"]


def test_a_dangling_symlink_is_refused_like_cp_and_left_alone(tmp_path: Path) -> None:
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "missing" / "x.json")
    with pytest.raises(OutputError, match="does not exist"):
        write_text(str(link), "x")
    assert os.readlink(link) == str(tmp_path / "missing" / "x.json")
    # cp refuses the same: it will not write through a dangling symlink.
    source = tmp_path / "source"
    source.write_text("x")
    assert subprocess.run(["cp", str(source), str(link)], capture_output=True).returncode != 0


def test_a_symlink_loop_is_one_error(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OutputError, match="symbolic links"):
        write_text(str(tmp_path / "a"), "x")


def test_a_folder_as_file_output_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="folder"):
        write_text(str(tmp_path), "x")


def test_inspect_dash_o_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from memlayout.cli.app import app

    target = tmp_path / "real.json"
    target.write_text("{}")
    (tmp_path / "link.json").symlink_to("real.json")
    result = CliRunner().invoke(app, ["inspect", DEMO, "--format", "json", "-o", str(tmp_path / "link.json")])
    assert result.exit_code == 1, result.stderr
    assert os.path.islink(tmp_path / "link.json")
    assert '"findings"' in target.read_text()


# --- modes and owners -----------------------------------------------------------


@pytest.mark.parametrize(("umask", "file_mode", "folder_mode"), [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                                  (0o002, 0o664, 0o775), (0o000, 0o666, 0o777)])
def test_new_files_and_folders_follow_the_umask(tmp_path: Path, umask: int, file_mode: int, folder_mode: int) -> None:
    # In a child process: the umask is per process, and tests run in parallel.
    result = run_python(
        """
        import os, sys
        from memlayout.io.atomic_write import atomic_directory, write_text
        write_text(sys.argv[1] + "/new.json", "x")
        with atomic_directory(sys.argv[1] + "/folder") as staging:
            write_text(staging + "/inner.json", "y")
        """,
        str(tmp_path), umask=umask,
    )
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "new.json").st_mode) == file_mode
    assert stat.S_IMODE(os.stat(tmp_path / "folder").st_mode) == folder_mode
    assert stat.S_IMODE(os.stat(tmp_path / "folder" / "inner.json").st_mode) == file_mode


def test_a_replaced_file_keeps_its_mode_even_under_a_strict_umask(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    target.write_text("old")
    os.chmod(target, 0o604)
    result = run_python("from memlayout.io.atomic_write import write_text; import sys; write_text(sys.argv[1], 'n')",
                        str(target), umask=0o077)
    assert result.returncode == 0, result.stderr
    assert target.read_text() == "n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o604


@pytest.mark.skipif(not IS_ROOT, reason="giving a file to another owner needs root")
def test_a_replaced_file_keeps_its_owner_and_group(tmp_path: Path) -> None:
    target = tmp_path / "model.pt"
    target.write_bytes(b"old")
    os.chown(target, 1234, 4321)
    os.chmod(target, 0o2640)  # setgid survives only if chown happened first
    write_bytes(str(target), b"new")
    status = os.stat(target)
    assert (status.st_uid, status.st_gid, stat.S_IMODE(status.st_mode)) == (1234, 4321, 0o2640)


# --- the API: a path, a descriptor, a file object -------------------------------


def test_writers_by_descriptor_and_by_path_write_the_same_file(tmp_path: Path) -> None:
    source = tmp_path / "source.bin"
    source.write_bytes(os.urandom(1 << 20))
    out = tmp_path / "out.bin"
    with atomic_file(str(out)) as output:
        assert not output.is_stream
        with open(source, "rb") as stream:
            copied = 0
            while copied < source.stat().st_size:
                copied += os.copy_file_range(stream.fileno(), output.fd, (1 << 20) - copied)
        # The path opens the same file: a verifier can re-read what the fd wrote.
        assert Path(output.path).read_bytes() == source.read_bytes()
        assert listing(tmp_path) == ["source.bin"]  # still no name in the folder
    assert out.read_bytes() == source.read_bytes()
    assert listing(tmp_path) == ["out.bin", "source.bin"]


def test_a_failed_block_leaves_the_old_file_and_nothing_else(tmp_path: Path) -> None:
    out = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(3)}, out)
    before = out.read_bytes()
    with pytest.raises(ValueError), atomic_file(str(out)) as output:
        torch.save({"w": torch.ones(3)}, output.path)
        raise ValueError("verification failed")
    assert out.read_bytes() == before
    assert listing(tmp_path) == ["model.pt"]


def test_without_o_tmpfile_the_named_temporary_is_removed_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "O_TMPFILE")
    out = tmp_path / "r.json"
    with pytest.raises(ValueError), atomic_file(str(out)) as output:
        names = listing(tmp_path)
        assert len(names) == 1 and names[0].startswith(TEMPORARY_PREFIX)
        assert output.path == str(tmp_path / names[0])
        raise ValueError
    assert listing(tmp_path) == []
    write_text(str(out), "ok")
    assert listing(tmp_path) == ["r.json"]


# --- stale temporaries: removed only when their writer is dead ------------------

_WRITER = """
import os, signal, sys, time
import memlayout.io.atomic_write as aw
del os.O_TMPFILE  # a filesystem without O_TMPFILE: temporaries have names
kind = sys.argv[2]
if kind == "file":
    context = aw.atomic_file(sys.argv[1] + "/out.bin")
else:
    context = aw.atomic_directory(sys.argv[1] + "/out")
with context as output:
    if kind == "file":
        os.write(output.fd, b"partial")
    print("writing", flush=True)
    if sys.argv[3] == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
"""


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def start_writer(started: list[subprocess.Popen[str]], directory: Path, kind: str, fate: str) -> None:
    process = subprocess.Popen([sys.executable, "-c", _WRITER, str(directory), kind, fate],
                               stdout=subprocess.PIPE, text=True)
    started.append(process)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "writing"
    if fate == "die":
        process.wait(timeout=30)
        assert process.returncode == -signal.SIGKILL


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_killed_writers_temporary_is_removed_by_the_next_write(
    tmp_path: Path, writer: list[subprocess.Popen[str]], kind: str
) -> None:
    start_writer(writer, tmp_path, kind, "die")
    left = [n for n in listing(tmp_path) if n.startswith(TEMPORARY_PREFIX)]
    assert len(left) == 1, "the killed writer should have left its named temporary"
    write_text(str(tmp_path / "next.json"), "x")
    assert listing(tmp_path) == ["next.json"]


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_temporary_still_being_written_is_never_touched(
    tmp_path: Path, writer: list[subprocess.Popen[str]], kind: str
) -> None:
    start_writer(writer, tmp_path, kind, "live")
    before = [n for n in listing(tmp_path) if n.startswith(TEMPORARY_PREFIX)]
    assert len(before) == 1
    write_text(str(tmp_path / "next.json"), "x")
    assert remove_stale_temporaries(str(tmp_path)) == []
    assert [n for n in listing(tmp_path) if n.startswith(TEMPORARY_PREFIX)] == before


def test_a_temporary_locked_by_a_writer_in_another_pid_namespace_is_kept(tmp_path: Path) -> None:
    # A dead PID in this namespace, but the lock is held: a writer elsewhere is alive.
    import fcntl

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    name = temporary_name("tmp").split("-")
    name[1] = dead.stdout.strip()  # .memlayout-<pid>-...
    path = tmp_path / "-".join(name)
    path.write_bytes(b"")
    with open(path, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        assert remove_stale_temporaries(str(tmp_path)) == []
    assert remove_stale_temporaries(str(tmp_path)) == [path.name]


def test_names_memlayout_did_not_make_are_never_removed(tmp_path: Path) -> None:
    for name in (".memlayout-notes", ".memlayout-1-xyz.tmp", ".memlayout-abc123.tmp"):
        (tmp_path / name).write_text("mine")
    (tmp_path / ".memlayout-1-00000000-0-ab-tmp").symlink_to("elsewhere")  # not a file memlayout made
    write_text(str(tmp_path / "x.json"), "x")
    assert len(listing(tmp_path)) == 5


def test_a_stale_aside_folder_is_put_back_when_its_target_is_missing(tmp_path: Path) -> None:
    # A crash between the two renames of the no-RENAME_EXCHANGE path: OUT is aside.
    old = tmp_path / "old-out"
    old.mkdir()
    (old / "notes.txt").write_text("keep me")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    parts = temporary_name("aside-out").split("-", 5)
    parts[1] = dead.stdout.strip()
    os.rename(old, tmp_path / "-".join(parts))
    remove_stale_temporaries(str(tmp_path))
    assert listing(tmp_path) == ["out"]
    assert (tmp_path / "out" / "notes.txt").read_text() == "keep me"


# --- folders ---------------------------------------------------------------------


def test_a_non_empty_folder_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(OutputError) as refused, atomic_directory(str(out)):
        pytest.fail("the block must not run")
    assert "--force" in refused.value.one_line()
    assert listing(out) == ["notes.txt"]
    assert listing(tmp_path) == ["out"]


def test_force_replaces_only_what_is_written_and_keeps_the_rest_as_the_same_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    (out / "sub" / "deep.txt").write_text("deep")
    (out / "model.safetensors").write_text("old weights")
    os.chmod(out, 0o750)
    notes_inode = os.stat(out / "notes.txt").st_ino
    with atomic_directory(str(out), force=True) as staging:
        Path(staging, "model.safetensors").write_text("new weights")
        Path(staging, "config.json").write_text("{}")
    assert listing(out) == ["config.json", "model.safetensors", "notes.txt", "sub"]
    assert (out / "model.safetensors").read_text() == "new weights"
    assert os.stat(out / "notes.txt").st_ino == notes_inode
    assert (out / "sub" / "deep.txt").read_text() == "deep"
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o750
    assert listing(tmp_path) == ["out"]


def test_an_empty_folder_is_filled_and_keeps_its_mode(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.chmod(out, 0o705)
    with atomic_directory(str(out)) as staging:
        Path(staging, "a").write_text("a")
    assert listing(out) == ["a"]
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o705
    assert listing(tmp_path) == ["out"]


def test_a_failed_folder_block_leaves_the_old_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "a").write_text("old")
    with pytest.raises(RuntimeError), atomic_directory(str(out), force=True) as staging:
        Path(staging, "a").write_text("new")
        raise RuntimeError("verification failed")
    assert (out / "a").read_text() == "old"
    assert listing(tmp_path) == ["out"]


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_many_writers_racing_for_one_out_leave_one_writers_whole_output(tmp_path: Path, kind: str) -> None:
    # Eight threads, released together, each writing its own complete OUT of three
    # parts; whoever wins, OUT is one writer's three parts and nothing is left over.
    out = tmp_path / "out"
    start = threading.Barrier(8)
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            start.wait(timeout=30)
            if kind == "file":
                write_bytes(str(out), b"".join(f"{writer}:{part};".encode() * 10_000 for part in range(3)))
                return
            with atomic_directory(str(out), force=True) as staging:
                for part in range(3):
                    Path(staging, f"part{part}").write_text(f"{writer}:{part}")
        except BaseException as exc:  # collected: the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(writer,)) for writer in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    if kind == "file":
        content = out.read_bytes().decode()
        writers = {piece.split(":")[0] for piece in content.split(";") if piece}
        assert len(writers) == 1 and len(content) == len(f"{writers.pop()}:0;") * 30_000
    else:
        texts = [(out / f"part{part}").read_text() for part in range(3)]
        assert len({text.split(":")[0] for text in texts}) == 1 and listing(out) == ["part0", "part1", "part2"]
    assert listing(tmp_path) == ["out"]
