"""ingest.chdb._native.row_hashes: the row hashes of a request read from a Native String column
split in C must be exactly what reading the column row by row gives, for every column,
including ones the fast split must refuse."""

from __future__ import annotations

import hashlib
import random

import pytest

from ingest.chdb._framing import varint
from ingest.chdb._native import row_hashes


def _cells(values: list[bytes]) -> bytes:
    return b"".join(varint(len(v)) + v for v in values)


def _reference(column: bytes, rows: int, flags: bytes) -> list[bytes]:
    """Row by row, as the stream's block is defined: each cell a varint length + bytes."""
    out, pos = [], 0
    for i in range(rows):
        n, shift = 0, 0
        while True:
            x = column[pos]
            pos += 1
            n |= (x & 0x7F) << shift
            if x < 0x80:
                break
            shift += 7
        if flags[i]:
            out.append(column[pos : pos + n])
        pos += n
    return out


def _hash(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).hexdigest().encode()


def _check(values: list[bytes], flags: list[int], tail: bytes = b"\x09Timestamp") -> list[bytes]:
    # the next column's header follows in a real block: the split must not read into it
    prefix = b"\x01\x02junk"
    block = prefix + _cells(values) + tail
    got = row_hashes(memoryview(block), len(prefix), len(values), bytes(flags))
    want = _reference(block[len(prefix) :], len(values), bytes(flags))
    assert got == want
    return got


def test_an_ok_request_of_transitions_and_other_spans() -> None:
    rng = random.Random(7)
    flags = [rng.random() < 0.8 for _ in range(5000)]
    values = [_hash(i) if f else b"" for i, f in enumerate(flags)]
    got = _check(values, [int(f) for f in flags])
    assert len(got) == sum(flags)


@pytest.mark.parametrize(
    ("values", "flags"),
    [
        ([], []),
        ([b""], [0]),
        ([_hash(1)], [1]),
        ([b"", b"", _hash(2)], [0, 0, 1]),
        # a flagged row without a hash (a request that is not ok): read row by row
        ([_hash(1), b"", _hash(3)], [1, 1, 1]),
        # a hash on an unflagged row: not in the result
        ([_hash(1), _hash(2)], [1, 0]),
        # a hash of another length, non-hex digits, the separator bytes inside a hash
        ([_hash(1)[:63], _hash(2)], [1, 1]),
        ([_hash(1)[:40] + b"@" + _hash(1)[41:], _hash(2)], [1, 1]),
        ([_hash(1)[:40] + b"\x00" + _hash(1)[41:], b""], [1, 0]),
        ([_hash(1).upper(), _hash(2)], [1, 1]),
        ([b"x" * 200, _hash(2)], [1, 1]),  # a two-byte length
        # flag values other than 0/1
        ([_hash(1), _hash(2)], [2, 1]),
    ],
)
def test_columns_the_split_must_read_exactly(values: list[bytes], flags: list[int]) -> None:
    _check(values, flags)
