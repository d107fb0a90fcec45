"""Reading the signed tree heads of the ledger logs (sql/007; per instance, sql/010)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from foundation.keys import SignedHead
from foundation.ledger_instances import has_instance_columns, instance_filter, one_instance

if TYPE_CHECKING:
    from clickhouse_connect.driver.client import Client

__all__ = ["covers", "newest_head", "newest_heads", "read_heads"]


def _s(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


_HEAD_COLUMNS: Final = """tree_size, toString(root), toUnixTimestamp64Nano(signed_at), batches,
                   toString(chain_hash), key_id, signature"""


def _heads(
    client: Client, database: str, instance: str | None, order: str, cols: bool | None = None
) -> list[SignedHead]:
    """The heads of `instance`'s log (None: every log's) in `order`; `cols` whether the store
    has sql/010's instance columns (None: read it)."""
    if cols is None:
        cols = has_instance_columns(client, database)
    where = "" if instance is None else f"WHERE {instance_filter(cols, instance)}"
    rows = client.query(
        f"""SELECT {_HEAD_COLUMNS}, {"instance" if cols else "''"}
            FROM {database}.ledger_heads {where} ORDER BY {order}""",
        parameters={"instance": instance or ""},
    ).result_rows
    return [
        SignedHead(int(n), _s(r), int(t), int(b), _s(c), _s(k), _s(sig), _s(i))
        for n, r, t, b, c, k, sig, i in rows
    ]


def read_heads(client: Client, database: str, instance: str | None = "") -> list[SignedHead]:
    """Every signed head of `instance`'s log (None: of every instance), by tree size then
    signing time."""
    return _heads(client, database, instance, "tree_size, signed_at")


def newest_head(client: Client, database: str, instance: str | None = None) -> SignedHead | None:
    """The newest signed head of `instance`'s log (None: the store's one log; largest tree,
    then latest), None when none."""
    instance = one_instance(client, database, instance)
    heads = _heads(client, database, instance, "tree_size DESC, signed_at DESC LIMIT 1")
    return heads[0] if heads else None


def covers(client: Client, database: str, head: SignedHead) -> bool:
    """Whether the stored pieces (sql/008) of the head's log reach `head`: a batch position
    ending at its size with its chain link (a store signed by an older serve has none)."""
    where = instance_filter(has_instance_columns(client, database), head.instance)
    return bool(
        client.query(
            f"""SELECT count() FROM {database}.ledger_positions
                WHERE first_leaf <= {{n:UInt64}} AND first_leaf + leaves = {{n:UInt64}}
                  AND chain_hash = {{c:String}} AND {where}""",
            parameters={"n": head.tree_size, "c": head.chain_hash, "instance": head.instance},
        ).result_rows[0][0]
    )


def newest_heads(client: Client, database: str) -> dict[str, SignedHead]:
    """The newest signed head of every instance's log (largest tree, then latest)."""
    if not has_instance_columns(client, database):
        heads = _heads(client, database, "", "tree_size DESC, signed_at DESC LIMIT 1", False)
        return {"": heads[0]} if heads else {}
    order = "tree_size DESC, signed_at DESC LIMIT 1 BY instance"
    heads = _heads(client, database, None, order, True)
    return {h.instance: h for h in heads}
