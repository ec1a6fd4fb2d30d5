"""The zip format's fixed-size records (APPNOTE.TXT 4.3.7, 4.3.9, 4.3.12, 4.3.14-16).

The reader and torch's layout both build on them; nothing here reads or writes.
"""

from __future__ import annotations

import struct

LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
LOCAL_HEADER_MAGIC = b"PK\x03\x04"
CENTRAL_ENTRY = struct.Struct("<4sHHHHHHIIIHHHHHII")
CENTRAL_MAGIC = b"PK\x01\x02"
END_RECORD = struct.Struct("<4sHHHHIIH")
END_MAGIC = b"PK\x05\x06"
ZIP64_LOCATOR = struct.Struct("<4sIQI")
ZIP64_LOCATOR_MAGIC = b"PK\x06\x07"
ZIP64_END_RECORD = struct.Struct("<4sQHHIIQQQQ")
ZIP64_END_MAGIC = b"PK\x06\x06"
DESCRIPTOR_MAGIC = b"PK\x07\x08"
DESCRIPTOR_32 = struct.Struct("<4sIII")
DESCRIPTOR_64 = struct.Struct("<4sIQQ")
ZIP64_EXTRA_ID = 0x0001
STORED, DEFLATED = 0, 8
SATURATED = 0xFFFFFFFF
