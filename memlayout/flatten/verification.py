"""What reading OUT back proves, one clause per kind of change, for flatten's summary.

A writer's check covers some kinds of change and not others: a record copied
from IN is proved by its CRC-32 against IN's bytes, a tensor re-strided into
dense order by its values against IN's, bit for bit, and a file written from
buffers in memory by its bytes against those buffers. Each writer names the
clauses its check covered, so the summary never claims more; clauses are free
of counts, so a model directory's files merge theirs.
"""

from __future__ import annotations

COPIED_BY_CRC = (
    "bytes copied from IN: each record of OUT, read back, has the CRC-32 of the bytes meant for it, IN's taken "
    "from IN's file"
)
RESTRIDED_VALUES = "tensors re-strided into dense order: every value, read back from OUT, equals IN's, bit for bit"
ZIP_LAYOUT = "layout and sharing, read back as metadata, match the plan, and torch.load(mmap=True) opens OUT"
MAIN_NAMES = "OUT's pickle looks up the script's classes in __main__, as IN's does"
BUFFERS_WRITTEN = "OUT's bytes, read back, equal the flat buffers IN's tensors were copied into, bit for bit"
LAYOUT = "layout and sharing, read back as metadata, match the plan"
BYTE_FOR_BYTE = "a file already flat, copied: OUT's bytes equal IN's, compared in full"
SAFETENSORS_TENSORS = (
    "a file rewritten in flat order: every tensor, read back from OUT, equals the flat buffers IN's file was "
    "copied into, bit for bit"
)
CONVERTED_COPIES = "tensors copied: OUT's bytes equal IN's, compared in full"
CONVERTED_DENSE = "tensors made dense: OUT's bytes equal IN's values, gathered again from IN's file"
CONVERTED_HEADER = "OUT's header lists every tensor as written, with its ties and metadata"
