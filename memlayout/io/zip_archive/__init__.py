"""torch's zip archives, read and written: the one module that knows their layout.

torch.save, torch.jit.save and torch.export all write zips through the same
miniz-based writer (caffe2/serialize/inline_container.cc), and memlayout reads
them without `zipfile` and without torch:

- Reading parses the directory with `struct` over bytes read with pread.
  `zipfile.ZipFile` builds a `ZipInfo` per entry (decoding extra fields, times and
  flags nobody here reads) and seeks and reads the file for each, which made it the
  largest single cost of listing a 400-tensor checkpoint. A checkpoint needs a few
  fields per entry, and torch stores its records uncompressed, so the walk is one
  `unpack_from` per entry plus one 30-byte pread per record for its local header.
- Writing lays out records exactly as torch's writer does (see `RecordLayout`), so
  a rewritten checkpoint is the archive torch.save would have written, record by
  record, while its bytes are moved by the kernel rather than by torch.

An archive may be a window of a larger file: torch.export's older `.pt2` layout
stores whole torch.save archives, uncompressed, as members of its own zip. Offsets
inside an archive count from the window's start; the data offsets handed back are
absolute in the file, so one memory map of the outer file serves nested records.
"""

from memlayout.io.zip_archive.crc import crc32, crc32_combine
from memlayout.io.zip_archive.reader import (
    LOCAL_HEADER_SIZE,
    RecordSpans,
    ZipEntry,
    ZipReader,
    archive_prefix,
    central_directory_bytes,
)
from memlayout.io.zip_archive.recompressed import ZIP_ERRORS, read_recompressed_archive
from memlayout.io.zip_archive.torch_layout import (
    RecordLayout,
    end_of_archive,
    layout_records,
    new_serialization_id,
    torch_archive_name,
)

__all__ = [
    "LOCAL_HEADER_SIZE",
    "ZIP_ERRORS",
    "RecordLayout",
    "RecordSpans",
    "ZipEntry",
    "ZipReader",
    "archive_prefix",
    "central_directory_bytes",
    "crc32",
    "crc32_combine",
    "end_of_archive",
    "layout_records",
    "new_serialization_id",
    "read_recompressed_archive",
    "torch_archive_name",
]
