"""foundation.store.tsv_rows: the TabSeparated text of the small writes (signed heads,
ledger pieces), and the same rows read back from a real embedded store."""

from __future__ import annotations

import os

import pytest

from foundation.store import insert_rows, tsv_rows


def test_values_become_tabseparated_text():
    assert tsv_rows([[1, "a", None, True, b"\x00\xff"]]) == b"1\ta\t\\N\t1\t\\x00\\xff\n"
    assert tsv_rows([["tab\there", "line\nbreak", "back\\slash", "cr\r"]]) == (
        b"tab\\there\tline\\nbreak\tback\\\\slash\tcr\\r\n"
    )
    assert tsv_rows([]) == b""


def test_an_unknown_type_is_refused_by_name():
    with pytest.raises(TypeError, match="dict"):
        tsv_rows([[{"a": 1}]])


def test_rows_read_back_unchanged(chdb_client, fresh_db):
    t = f"{fresh_db}.tsv_check"
    chdb_client.command(
        f"CREATE TABLE {t} (n UInt64, h FixedString(32), s String, at DateTime64(9, 'UTC'), "
        "m Nullable(Int64), u String) ENGINE = MergeTree ORDER BY n"
    )
    raw = os.urandom(32)
    odd = "x\ty\nz\\w\r \u202e ünï"
    rows = [
        [1, raw, odd, "2026-12-02 04:00:00.123456789", None, ""],
        [2, bytes(32), "", "1970-01-01 00:00:00.000000001", -7, "\\N"],
    ]
    insert_rows(chdb_client, t, ["n", "h", "s", "at", "m", "u"], rows)
    got = chdb_client.query(f"SELECT n, h, s, toString(at), m, u FROM {t} ORDER BY n").result_rows
    h0 = got[0][1] if isinstance(got[0][1], bytes) else got[0][1].encode("latin-1")
    assert h0 == raw
    assert got[0][2] == odd and got[0][3] == "2026-12-02 04:00:00.123456789" and got[0][4] is None
    assert got[1][2:] == ("", "1970-01-01 00:00:00.000000001", -7, "\\N")
