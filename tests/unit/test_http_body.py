"""foundation.http_body on plain bytes: framing from the headers, chunked and Content-Length
reads, the size limit, truncation, bounded drains, and multi-member gunzip."""

from __future__ import annotations

import gzip
import io
import zlib

import pytest

from foundation.http_body import BodyError, BodyReader, Framing, framing, gunzip

NEXT = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"  # what follows the body on the connection


def _chunked(*chunks: bytes, trailers: bytes = b"", ext: bytes = b"") -> bytes:
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(c), ext, c) for c in chunks)
    return body + b"0\r\n" + trailers + b"\r\n"


def _reader(wire: bytes, fr: Framing) -> tuple[BodyReader, io.BytesIO]:
    f = io.BytesIO(wire)
    return BodyReader(f, fr), f


CHUNKED = Framing(chunked=True, length=0)


# ------------------------------------------------------------------ framing


@pytest.mark.parametrize(
    ("lengths", "codings", "want"),
    [
        ([], [], Framing(chunked=False, length=0, declared=False)),
        (["0"], [], Framing(chunked=False, length=0)),
        (["42"], [], Framing(chunked=False, length=42)),
        (["007"], [], Framing(chunked=False, length=7)),
        ([" 42 "], [], Framing(chunked=False, length=42)),
        (["42", "42"], [], Framing(chunked=False, length=42)),
        (["42, 42"], [], Framing(chunked=False, length=42)),
        ([], ["chunked"], CHUNKED),
        ([], ["Chunked"], CHUNKED),
        ([], [" chunked "], CHUNKED),
    ],
)
def test_framing_taken(lengths, codings, want):
    assert framing(lengths, codings) == want


@pytest.mark.parametrize(
    ("lengths", "codings", "message"),
    [
        (["-1"], [], "bad Content-Length '-1'"),
        (["+5"], [], "bad Content-Length '+5'"),
        (["0x10"], [], "bad Content-Length '0x10'"),
        ([""], [], "bad Content-Length ''"),
        (["5 5"], [], "bad Content-Length '5 5'"),
        (["1e3"], [], "bad Content-Length '1e3'"),
        (["1" * 19], [], "bad Content-Length"),
        (["5", "6"], [], "conflicting Content-Length values ['5', '6']"),
        (["5, 6"], [], "conflicting Content-Length values ['5', '6']"),
        (["5"], ["chunked"], "Content-Length and Transfer-Encoding together"),
        (["0"], ["chunked"], "Content-Length and Transfer-Encoding together"),
        ([], ["gzip, chunked"], "unsupported Transfer-Encoding 'gzip, chunked'"),
        ([], ["chunked", "chunked"], "unsupported Transfer-Encoding 'chunked, chunked'"),
        ([], ["identity"], "unsupported Transfer-Encoding 'identity'"),
        ([], ["xchunked"], "unsupported Transfer-Encoding 'xchunked'"),
        ([], [""], "unsupported Transfer-Encoding"),
    ],
)
def test_framing_refused_with_400(lengths, codings, message):
    with pytest.raises(BodyError) as exc:
        framing(lengths, codings)
    assert exc.value.status == 400
    assert message in exc.value.message


# ------------------------------------------------------------------ Content-Length


def test_content_length_body_is_read_exactly_and_leaves_the_next_request():
    r, f = _reader(b"hello" + NEXT, Framing(chunked=False, length=5))
    assert not r.in_step
    assert r.read(limit=5) == b"hello"
    assert r.in_step
    assert f.read() == NEXT


def test_no_body_is_in_step_at_once():
    r, f = _reader(NEXT, framing([], []))
    assert r.in_step and r.read(limit=0) == b"" and f.read() == NEXT


def test_content_length_over_the_limit_is_413_before_a_byte_is_read():
    r, f = _reader(b"x" * 100 + NEXT, Framing(chunked=False, length=100))
    with pytest.raises(BodyError) as exc:
        r.read(limit=99)
    assert exc.value.status == 413
    assert exc.value.message == "body of 100 bytes exceeds the limit of 99 bytes"
    assert f.tell() == 0
    assert not r.in_step


def test_content_length_body_cut_short_is_400_and_cannot_be_drained():
    r, _ = _reader(b"abc", Framing(chunked=False, length=10))
    with pytest.raises(BodyError) as exc:
        r.read(limit=100)
    assert (exc.value.status, exc.value.message) == (400, "body truncated: got 3 of 10 bytes")
    assert not r.in_step
    assert r.drain(1000) is False


def test_drain_of_a_refused_content_length_body_keeps_the_connection_in_step():
    r, f = _reader(b"x" * 100 + NEXT, Framing(chunked=False, length=100))
    assert r.drain(100) is True
    assert r.in_step and f.read() == NEXT


def test_drain_refuses_a_body_over_its_budget_without_reading_it():
    r, f = _reader(b"x" * 100 + NEXT, Framing(chunked=False, length=100))
    assert r.drain(99) is False
    assert f.tell() == 0 and not r.in_step
    assert r.drain(100) is True  # a second call with a larger budget finishes it
    assert f.read() == NEXT


def test_drain_of_a_content_length_body_cut_short_is_false():
    r, _ = _reader(b"x" * 10, Framing(chunked=False, length=100))
    assert r.drain(1000) is False
    assert not r.in_step


# ------------------------------------------------------------------ chunked


def test_chunked_body_is_joined_and_leaves_the_next_request():
    r, f = _reader(_chunked(b"hello ", b"chunked ", b"world") + NEXT, CHUNKED)
    assert r.read(limit=100) == b"hello chunked world"
    assert r.in_step
    assert f.read() == NEXT


def test_chunk_extensions_trailers_and_hex_case_are_taken():
    wire = (
        b'5;name=value;q="quoted"\r\nhello\r\n'
        b"A ; ext\r\n0123456789\r\n"
        b"a\r\nabcdefghij\r\n"
        b"0;last\r\nX-Checksum: 1\r\nX-Other: 2\r\n\r\n"
    )
    r, f = _reader(wire + NEXT, CHUNKED)
    assert r.read(limit=100) == b"hello0123456789abcdefghij"
    assert r.in_step and f.read() == NEXT


def test_chunked_with_bare_lf_line_ends_is_taken():
    r, f = _reader(b"3\nabc\n0\n\n" + NEXT, CHUNKED)
    assert r.read(limit=10) == b"abc"
    assert f.read() == NEXT


def test_empty_chunked_body():
    r, f = _reader(b"0\r\n\r\n" + NEXT, CHUNKED)
    assert r.read(limit=0) == b""
    assert r.in_step and f.read() == NEXT


def test_chunked_body_at_the_limit_is_taken():
    r, _ = _reader(_chunked(b"x" * 60, b"y" * 40), CHUNKED)
    assert len(r.read(limit=100)) == 100


def test_chunked_over_the_limit_is_413_at_the_chunk_that_passes_it():
    """Nothing past the limit is read: the chunk that would pass it stays on the wire."""
    wire = _chunked(b"a" * 60, b"b" * 41, b"c" * 1000) + NEXT
    r, f = _reader(wire, CHUNKED)
    with pytest.raises(BodyError) as exc:
        r.read(limit=100)
    assert exc.value.status == 413
    assert exc.value.message == "chunked body exceeds the limit of 100 bytes (at 101)"
    assert f.tell() == len(b"3c\r\n" + b"a" * 60 + b"\r\n" + b"29\r\n")
    assert not r.in_step
    assert r.drain(10_000) is True  # the rest discarded: in step for the next request
    assert r.in_step and f.read() == NEXT


def test_drain_of_a_chunked_body_stops_at_its_budget():
    wire = _chunked(*[b"z" * 100] * 50) + NEXT
    r, f = _reader(wire, CHUNKED)
    assert r.drain(1000) is False
    assert not r.in_step
    assert f.tell() <= 1000 + 100
    assert r.drain(100_000) is True  # resumes where it stopped
    assert f.read() == NEXT


def test_chunk_lines_count_toward_the_drain_budget():
    """One-byte chunks with long extensions cost their line bytes, not one byte each."""
    ext = b";" + b"e" * 4000
    r, f = _reader(_chunked(*[b"z"] * 100, ext=ext), CHUNKED)
    assert r.drain(50_000) is False
    assert f.tell() < 50_000 + 5000


def test_drain_of_an_unread_chunked_body_is_in_step():
    r, f = _reader(_chunked(b"abc", b"def", trailers=b"T: 1\r\n") + NEXT, CHUNKED)
    assert r.drain(100) is True
    assert r.in_step and f.read() == NEXT


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (b"", "chunked body truncated: the connection closed before its end"),
        (b"5\r\nhel", "body truncated: got 3 of 5 bytes"),
        (b"5\r\nhello\r\n", "chunked body truncated"),
        (b"5\r\nhello", "chunked body truncated"),
        (b"5\r\nhello\r\n0\r\n", "chunked body truncated"),
        (b"5\r\nhelloX\r\n0\r\n\r\n", "a chunk is longer than its size"),
        (b"zz\r\n", "bad chunk size b'zz'"),
        (b"-5\r\n", "bad chunk size b'-5'"),
        (b"0x5\r\n", "bad chunk size b'0x5'"),
        (b"\r\n", "bad chunk size b''"),
        (b"1" * 16 + b"\r\n", "bad chunk size"),
        (b"5" + b" " * 5000 + b"\r\n", "a line longer than 4096 bytes"),
        (b"0\r\n" + b"T: x\r\n" * 65 + b"\r\n", "more than 64 trailer lines"),
    ],
)
def test_malformed_or_cut_chunked_body_is_400_and_not_drainable(wire, message):
    r, _ = _reader(wire, CHUNKED)
    with pytest.raises(BodyError) as exc:
        r.read(limit=1 << 20)
    assert exc.value.status == 400
    assert message in exc.value.message
    assert not r.in_step
    assert r.drain(1 << 20) is False
    fresh, _ = _reader(wire, CHUNKED)
    assert fresh.drain(1 << 20) is False


# ------------------------------------------------------------------ gunzip


def test_gunzip_one_member():
    assert gunzip(gzip.compress(b"payload"), limit=100) == b"payload"


def test_gunzip_takes_every_member_in_order():
    data = gzip.compress(b"first;") + gzip.compress(b"") + gzip.compress(b"second")
    assert gunzip(data, limit=100) == b"first;second"


def test_gunzip_limit_is_on_the_total_output_of_all_members():
    data = gzip.compress(b"a" * 60) + gzip.compress(b"b" * 60)
    assert gunzip(data, limit=120) == b"a" * 60 + b"b" * 60
    with pytest.raises(BodyError) as exc:
        gunzip(data, limit=119)
    assert (exc.value.status, exc.value.message) == (413, "body exceeds 119 bytes after gunzip")


def test_gunzip_bomb_stops_at_the_limit():
    bomb = gzip.compress(b"\0" * (64 << 20))
    with pytest.raises(BodyError) as exc:
        gunzip(bomb, limit=1 << 20)
    assert exc.value.status == 413


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not gzip at all", "body is not valid gzip (member 1)"),
        (zlib.compress(b"zlib, not gzip"), "body is not valid gzip (member 1)"),
        (gzip.compress(b"x", mtime=0)[:-4], "gzip body is truncated (member 1)"),
        (
            gzip.compress(b"x", mtime=0) + b"trailing garbage",
            "bad data after a gzip member (member 2)",
        ),
        (gzip.compress(b"x", mtime=0) + b"\0\0\0\0", "bad data after a gzip member (member 2)"),
        (
            gzip.compress(b"x", mtime=0) + gzip.compress(b"y", mtime=0)[:12],
            "gzip body is truncated (member 2)",
        ),
    ],
)
def test_gunzip_refuses_bad_truncated_or_trailing_data_with_400(data, message):
    with pytest.raises(BodyError) as exc:
        gunzip(data, limit=1000)
    assert exc.value.status == 400
    assert message in exc.value.message
