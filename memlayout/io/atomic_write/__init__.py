"""Write a file or a folder so that readers see the old one or the whole new one, never a part.

Reports (`inspect -o`) and flattened checkpoints (`flatten -o`, `--in-place`) all go
through here. What happens depends on what the output path is, following `cp`,
`sed -i --follow-symlinks` and ruff:

- A character or block device, FIFO or socket (`/dev/null`, a pipe), and the
  process's own descriptors (`/dev/stdout`, `/dev/fd/N`, `/proc/self/fd/N`), are
  written straight into: no temporary, no rename. Renaming a file over
  `/dev/null` as root would break the machine.
- A symlink is followed (chains too) and its final target is replaced, beside the
  target, so the link stays a link. A dangling link is refused, as `cp` refuses
  to write through one.
- A regular file is written to a temporary in the target's folder, fsynced, and
  renamed over the target; the folder entry is fsynced. A new file gets
  `0666 & ~umask` (the kernel applies the umask and any default ACL); a replaced
  file keeps its mode and, where the process may, its owner and group.
- On Linux the temporary is an `O_TMPFILE`: it has no name until the commit links
  it in (`linkat` through `/proc/self/fd`), so a crash cannot leave it behind.
  Where that is not available the temporary is named
  `.memlayout-<pid>-<boot>-<start>-<random>-tmp`, recording the writing process, its
  boot and its start time, and holds an `flock` while it is written. Every later
  write into that folder removes such temporaries whose writer is dead; one still
  being written is never touched.

Writers use whichever handle they need, and may use both:

    with atomic_file(out) as output:
        torch.save(obj, output.path)          # a path: torch.save, safetensors, reloading
    with atomic_file(out) as output:
        os.copy_file_range(src_fd, output.fd, n)   # a raw descriptor
    with atomic_file(out) as output, output.open() as stream:
        stream.write(data)                    # a buffered file object

`output.path` opens the file being written (for an `O_TMPFILE`, its
`/proc/self/fd/N` name); when the block ends without an exception the file is
fsynced and committed, and on any exception it is discarded and the target is left
as it was. `output.is_stream` says the target is a device or pipe: it cannot be
re-read or sought, so verification after writing is impossible there, and
`copy_file_range` into a pipe fails (use `os.sendfile` or plain writes).

`atomic_directory` does the same for a folder (a Hugging Face model directory):
the new folder is built beside OUT and swapped in with one `renameat2` call, so
OUT is absent, the old OUT, or the whole new one at every instant.
"""

from memlayout.io.atomic_write.directory import atomic_directory
from memlayout.io.atomic_write.file import OutputFile, atomic_file, write_bytes, write_text
from memlayout.io.atomic_write.syscalls import fsync_path
from memlayout.io.atomic_write.targets import ResolvedTarget, resolve_target
from memlayout.io.atomic_write.temporaries import (
    TEMPORARY_PREFIX,
    remove_stale_temporaries,
    temporary_name,
)

__all__ = [
    "TEMPORARY_PREFIX",
    "OutputFile",
    "ResolvedTarget",
    "atomic_directory",
    "atomic_file",
    "fsync_path",
    "remove_stale_temporaries",
    "resolve_target",
    "temporary_name",
    "write_bytes",
    "write_text",
]
