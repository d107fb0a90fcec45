"""Which store errors are about the data (the same write fails every time) and which mean
the store is unavailable for a while (back-pressure: 503 + Retry-After, keep retrying).

Only errors about the values themselves count as about the data: they cannot go away by
waiting, so after Ingestor's max_refusals such failures the group is parked in spool/dead
(and only when none of its rows is visible in the store). Everything else — a store that
is unreachable, out of memory or disk, read-only, lacking permission, failing I/O
("Cannot open file"), a missing table, an unknown code or no code at all — is the store
being unavailable: nothing is parked, the writer retries until it can write.
"""

from __future__ import annotations

import re

__all__ = ["DATA_ERROR_CODES", "error_code", "is_about_data"]

#: ClickHouse error codes about the inserted values (src/Common/ErrorCodes.cpp).
DATA_ERROR_CODES = frozenset(
    {
        6,  # CANNOT_PARSE_TEXT
        26,  # CANNOT_PARSE_QUOTED_STRING
        27,  # CANNOT_PARSE_INPUT_ASSERTION_FAILED
        38,  # CANNOT_PARSE_DATE
        41,  # CANNOT_PARSE_DATETIME
        53,  # TYPE_MISMATCH
        69,  # ARGUMENT_OUT_OF_BOUND
        70,  # CANNOT_CONVERT_TYPE
        72,  # CANNOT_PARSE_NUMBER
        117,  # INCORRECT_DATA
        128,  # TOO_LARGE_ARRAY_SIZE
        131,  # TOO_LARGE_STRING_SIZE
        190,  # SIZES_OF_ARRAYS_DONT_MATCH
        321,  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
        349,  # CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
        407,  # DECIMAL_OVERFLOW
        469,  # VIOLATED_CONSTRAINT
    }
)

_CODE = re.compile(r"\bCode:\s*(\d+)")


def error_code(exc: BaseException) -> int | None:
    """The ClickHouse error code of `exc`: its `code` attribute (clickhouse-connect), else
    the `Code: N` its message carries (the embedded backend), else None."""
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    m = _CODE.search(str(exc))
    return int(m.group(1)) if m else None


def is_about_data(exc: BaseException) -> bool:
    """True when the store refused the values themselves: a clickhouse-connect DataError
    (a value the client cannot encode) or a DatabaseError with a code in DATA_ERROR_CODES.
    False for everything else (the store is unavailable; see the module docstring)."""
    from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError

    if isinstance(exc, DataError):
        return True
    if not isinstance(exc, DatabaseError) or isinstance(exc, OperationalError):
        return False
    return error_code(exc) in DATA_ERROR_CODES
