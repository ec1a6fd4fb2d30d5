"""load.detect holds, without importing pickle, what the pickle module itself says."""

from __future__ import annotations

import pickle
import pickletools

from memlayout.load import detect


def test_the_highest_protocol_is_pickles() -> None:
    assert pickle.HIGHEST_PROTOCOL == detect.PICKLE_HIGHEST_PROTOCOL
    assert detect.has_proto_signature(pickle.dumps(1, protocol=pickle.HIGHEST_PROTOCOL))


def test_every_pickle_dumps_writes_opens_with_an_opening_opcode() -> None:
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        for value in (1, [1], {"a": 1}, "text", None, (1, 2), 2**80):
            head = pickle.dumps(value, protocol=protocol)
            assert detect.opens_like_a_pickle("", head), (protocol, value)
    memo_get = next(op for op in pickletools.opcodes if op.name == "BINGET")
    assert ord(memo_get.code) not in detect.opening_opcodes()
