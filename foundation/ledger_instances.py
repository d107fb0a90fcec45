"""Serve instances on one store, each with its own ledger log (sql/010_ledger_instances.sql).

A serve's instance id names its log. Its ingest_batches rows carry it in `source` as
'<source>@<instance>' and are chained from GENESIS on their own, so the batches of one
instance form one chain and the instance's log is that chain (sql/007): two serves never
interleave leaf positions. A batch whose source has no '@' is of the instance '' (one serve
without an id, or a store written before instances). `INSTANCE_SQL` reads the instance back
in the store; `instance_of` in Python. An instance's log walks from GENESIS through its own
batches and those naming no instance (`split_chains`), so a batch appended by hand is an
unsigned leaf of the log it extends, and two instances whose first batches hold the same
rows (one request sent to both: the same chain link) still keep their logs apart.

The default id is derived from the host name and the absolute spool directory and kept in
the spool directory (resolve_instance), so it is stable across restarts of one serve and
differs between two serves of one host.
"""

from __future__ import annotations

import hashlib
import re
import socket
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = [
    "INSTANCE_SQL",
    "check_instance",
    "default_instance",
    "has_instance_columns",
    "instance_filter",
    "instance_of",
    "list_instances",
    "log_links",
    "one_instance",
    "resolve_instance",
    "source_with",
    "split_chains",
]

_ID: Final = re.compile(r"[A-Za-z0-9._:-]{1,64}")
#: the instance of an ingest_batches row, from its `source` (SQL expression)
INSTANCE_SQL: Final = (
    "if(position(toString(source), '@') = 0, '', "
    "substring(toString(source), position(toString(source), '@') + 1))"
)


def check_instance(instance: str) -> str:
    """`instance` when it is a valid id (1 to 64 of letters, digits, '.', '_', ':', '-'),
    else ValueError saying what is allowed."""
    if not _ID.fullmatch(instance):
        raise ValueError(
            f"instance id {instance!r}: use 1 to 64 letters, digits, '.', '_', ':' or '-'"
        )
    return instance


def default_instance(spool_dir: Path, host: str | None = None) -> str:
    """The instance id of a serve on `host` (default: this host's name) spooling to
    `spool_dir`: the host name's valid characters, '-', 8 hex of SHA-256 over the absolute
    spool path."""
    name = re.sub(r"[^A-Za-z0-9._-]", "", host if host is not None else socket.gethostname())
    digest = hashlib.sha256(str(Path(spool_dir).resolve()).encode()).hexdigest()[:8]
    return f"{(name or 'serve')[:55]}-{digest}"


def source_with(source: str, instance: str) -> str:
    """The `source` an instance writes its batches with."""
    return f"{source}@{instance}" if instance else source


def instance_of(source: str) -> str:
    """The instance of a batch written with `source` (as INSTANCE_SQL)."""
    return source.split("@", 1)[1] if "@" in source else ""


def split_chains(
    batches: Sequence[tuple[str, str, str, int, str]],
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(ordered, unreachable) per instance of ingest_batches rows (ingest_batch,
    prev_chain_hash, chain_hash, received_at_ns, instance): `ordered[i]` walks from GENESIS
    (foundation.integrity.chain_order: the leaf order of i's log) through the batches of
    instance i and, past its first, those of no instance (`log_links`); `unreachable[i]`:
    batches of instance i on no chain from GENESIS. Pure."""
    from foundation.integrity import chain_order

    ordered: dict[str, list[str]] = {}
    seen: set[str] = set()
    for inst in sorted({i for *_r, i in batches if i} | {""}):
        ordered[inst], _rest = chain_order(log_links(batches, inst))
        seen.update(ordered[inst])
        if not ordered[inst]:
            del ordered[inst]
    unreachable: dict[str, list[str]] = {}
    for b, _p, _c, _t, inst in sorted(batches, key=lambda r: (r[3], r[0])):
        if b not in seen:
            unreachable.setdefault(inst, []).append(b)
    return ordered, unreachable


def log_links(
    batches: Sequence[tuple[str, str, str, int, str]], instance: str
) -> list[tuple[str, str, str, int]]:
    """The chain links (ingest_batch, prev, chain_hash, received_at_ns) `instance`'s log
    walks: its own batches and, except as a first batch, those of no instance."""
    from foundation.integrity import GENESIS

    return [(b, p, c, t) for b, p, c, t, i in batches if i == instance or (not i and p != GENESIS)]


#: per client, the databases found to have sql/010's columns (a schema file is never
#: undone, so a yes stays true; a no is asked again: the store may be migrated meanwhile)
_MIGRATED: Final[weakref.WeakKeyDictionary[Client, set[str]]] = weakref.WeakKeyDictionary()


def has_instance_columns(client: Client, database: str) -> bool:
    """Whether the store has sql/010 (ledger_heads.instance): a store not migrated yet has
    only the log ''. Read once per client and database once true."""
    known = _MIGRATED.get(client)
    if known is not None and database in known:
        return True
    found = bool(
        client.query(
            "SELECT count() FROM system.columns WHERE database = {d:String} "
            "AND table = 'ledger_heads' AND name = 'instance'",
            parameters={"d": database},
        ).result_rows[0][0]
    )
    if found:
        _MIGRATED.setdefault(client, set()).add(database)
    return found


def instance_filter(has_columns: bool, instance: str) -> str:
    """A WHERE condition on a table with an `instance` column (sql/010) selecting
    `instance`'s rows, as parameter {instance:String}; on a store without the column only
    the log '' has rows."""
    if has_columns:
        return "instance = {instance:String}"
    return "1" if not instance else "0"


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def list_instances(client: Client, database: str) -> list[str]:
    """Every instance with a batch or a signed head in `database`, sorted ('' first)."""
    found = {
        _s(i)
        for (i,) in client.query(
            f"SELECT DISTINCT {INSTANCE_SQL} FROM {database}.ingest_batches"
        ).result_rows
    }
    if has_instance_columns(client, database):
        found |= {
            _s(i)
            for (i,) in client.query(
                f"SELECT DISTINCT instance FROM {database}.ledger_heads"
            ).result_rows
        }
    elif client.query(f"SELECT count() FROM {database}.ledger_heads").result_rows[0][0]:
        found.add("")
    return sorted(found)


#: the file in a serve's spool directory holding its derived instance id
INSTANCE_FILE: Final = "instance-id"


def resolve_instance(spool_dir: Path, explicit: str | None) -> str:
    """The instance id of a serve spooling to `spool_dir`: `explicit` when given (checked),
    else the id kept in the spool directory's `instance-id` file, else default_instance(),
    written there, so a serve keeps its log across restarts and a copied store (its spool
    with it) keeps its instance. ValueError for an invalid id."""
    if explicit:
        return check_instance(explicit)
    path = Path(spool_dir) / INSTANCE_FILE
    if path.exists():
        return check_instance(path.read_text().strip())
    derived = default_instance(spool_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(derived + "\n")
    return derived


def one_instance(client: Client, database: str, instance: str | None) -> str:
    """`instance`, or for None the instance of the store's one log ('' when it has none);
    ValueError when None and the store holds the logs of several instances."""
    if instance is not None:
        return instance
    found = list_instances(client, database)
    if len(found) > 1:
        raise ValueError(f"the store holds the ledger logs of several serve instances "
                         f"({', '.join(repr(i) for i in found)}): name one")  # fmt: skip
    return found[0] if found else ""
