"""Tenant scope by the engine's own row policies, for the embedded store.

A reader bound to one tenant must never have an expression of theirs evaluated on another
tenant's row: not in PREWHERE, not in a WHERE the optimizer moves ahead, not in a subquery a
predicate is pushed into, whatever order `AND` evaluates its arguments in. ClickHouse gives
that guarantee to row policies only: a table's row-level filter is the first step of its
read, ahead of PREWHERE, so a reader's expressions see only the rows it let through
(`additional_table_filters`, the engine filter serve used before, runs after PREWHERE).

Embedded chDB runs every query as its one `default` user and refuses `CREATE ROW POLICY` and
impersonation (`EXECUTE AS`), but loads the users of an XML users file named by the engine's
config file, row policies included. So every embedded store is opened with such a config
(`engine_config`): the `default` user gets a row policy on each table of the schema whose
condition reads the handle's `log_comment` setting:

- `log_comment` not starting with SCOPE_PREFIX (every handle of ingest, settle, derive and an
  operator's reads): the condition is a constant true, folded away at analysis;
- `log_comment = SCOPE_PREFIX + tenant` (serve's query port, for a tenant's read token, set
  by serve before the reader's statement runs): a table with a tenant column shows that
  tenant's rows, a table without one shows none.

A reader may not set `log_comment` (serve._query_policy refuses it, as a URL setting and in
any SETTINGS clause). On a ClickHouse server or cluster each reader is its own user and the
same policies are written as `CREATE ROW POLICY ... TO <user>` (`server_policies`).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from xml.sax.saxutils import escape

__all__ = [
    "CONFIG_DIR",
    "POLICY_NAME",
    "SCOPE_PREFIX",
    "SCOPE_SETTING",
    "TableScope",
    "engine_config",
    "policy_condition",
    "schema_scopes",
    "scope_value",
    "server_policies",
]

#: The engine setting whose value binds a handle to one tenant.
SCOPE_SETTING: Final = "log_comment"
#: What that setting starts with on a tenant-bound handle; the tenant's name follows.
SCOPE_PREFIX: Final = "handoffs-tenant:"
#: Folder of the store directory holding the engine's config and users files (0700).
CONFIG_DIR: Final = "engine-config"
#: The name system.row_policies shows for the embedded policies (XML policies take the
#: user's name).
POLICY_NAME: Final = "default"
_TENANT_COLUMN: Final = re.compile(r"^\s*`?(tenant|Tenant)`?\s+\S", re.MULTILINE)
_CREATE_TABLE: Final = re.compile(
    r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?`?(\w+)`?\.`?(\w+)`?", re.IGNORECASE
)
_CREATE_AS: Final = re.compile(
    r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?`?\w+`?\.`?(\w+)`?"
    r"(?:\s+ON\s+CLUSTER\s+\S+)?\s+AS\s+`?\w+`?\.`?(\w+)`?\s",
    re.IGNORECASE,
)
_CREATE_VIEW: Final = re.compile(
    r"CREATE\s+MATERIALIZED\s+VIEW\s+(?:IF\s+NOT\s+EXISTS\s+)?`?\w+`?\.`?(\w+)`?"
    r"(?:\s+ON\s+CLUSTER\s+\S+)?\s+TO\s+`?\w+`?\.`?(\w+)`?",
    re.IGNORECASE,
)
_ADD_TENANT: Final = re.compile(
    r"ALTER\s+TABLE\s+`?\w+`?\.`?(\w+)`?.*ADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r"`?(tenant|Tenant)`?\s",
    re.IGNORECASE | re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class TableScope:
    """One table's scope: its tenant column, or None (a tenant-bound reader sees no row)."""

    table: str
    column: str | None


def scope_value(tenant: str) -> str:
    """The SCOPE_SETTING value that binds a handle to `tenant` (a non-empty name)."""
    if not tenant:
        raise ValueError("a tenant scope needs a tenant name")
    return SCOPE_PREFIX + tenant


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def policy_condition(column: str | None) -> str:
    """The row policy's condition (SQL) for a table whose tenant column is `column` (None:
    no tenant column). True for every row on a handle not bound to a tenant."""
    setting = f"getSetting({_literal(SCOPE_SETTING)})"
    unbound = f"NOT startsWith({setting}, {_literal(SCOPE_PREFIX)})"
    if column is None:
        return unbound
    return f"{unbound} OR `{column}` = substring({setting}, {len(SCOPE_PREFIX) + 1})"


def schema_scopes(statements: Iterable[str]) -> list[TableScope]:
    """Every table and materialized view the DDL `statements` create, with its tenant column
    (a view takes its target table's, a table made `AS` another that one's), plus
    `schema_version`. Pure."""
    columns: dict[str, str | None] = {"schema_version": None}
    views: list[tuple[str, str]] = []
    for stmt in statements:
        if (m := _CREATE_VIEW.search(stmt)) or (m := _CREATE_AS.search(stmt + "\n")):
            views.append((m.group(1), m.group(2)))
        elif m := _CREATE_TABLE.search(stmt):
            c = _TENANT_COLUMN.search(stmt[m.end() :])
            columns[m.group(2)] = c.group(1) if c else None
        elif m := _ADD_TENANT.search(stmt):
            columns[m.group(1)] = m.group(2)
    for view, target in views:
        columns[view] = columns.get(target)
    return [TableScope(t, c) for t, c in sorted(columns.items())]


def users_xml(database: str, scopes: Iterable[TableScope]) -> str:
    """The engine's users file: the `default` user, unrestricted, with a row policy on each
    table of `database` in `scopes`. Pure."""
    tables = "".join(
        f"        <{s.table}><filter>{escape(policy_condition(s.column))}</filter></{s.table}>\n"
        for s in scopes
    )
    return (
        "<clickhouse>\n"
        "  <profiles><default></default></profiles>\n"
        "  <quotas><default></default></quotas>\n"
        "  <users>\n"
        "    <default>\n"
        "      <password></password>\n"
        "      <networks><ip>::1</ip><ip>127.0.0.1</ip></networks>\n"
        "      <profile>default</profile>\n"
        "      <quota>default</quota>\n"
        "      <access_management>1</access_management>\n"
        "      <named_collection_control>1</named_collection_control>\n"
        f"      <databases>\n        <{database}>\n{tables}        </{database}>\n"
        "      </databases>\n"
        "    </default>\n"
        "  </users>\n"
        "</clickhouse>\n"
    )


def config_xml(users_path: Path) -> str:
    """The engine's config file: users (and their row policies) from `users_path`. Pure."""
    return (
        "<clickhouse>\n"
        "  <user_directories>\n"
        f"    <users_xml><path>{escape(str(users_path))}</path></users_xml>\n"
        "  </user_directories>\n"
        "</clickhouse>\n"
    )


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` for this user only (0600), atomically; unchanged text is not
    written again."""
    try:
        if path.read_text() == text:
            os.chmod(path, 0o600)
            return
    except OSError:
        pass
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def engine_config(store_dir: str | Path, database: str, statements: Iterable[str]) -> Path:
    """Write the embedded engine's config and users files under `store_dir`/CONFIG_DIR (the
    folder 0700, the files 0600) for `database`'s schema `statements`; returns the config
    file's path, for the engine's `config-file` option. Rewritten at every open, so a
    schema that gained a table gains its policy."""
    folder = Path(store_dir) / CONFIG_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    users = folder / "users.xml"
    config = folder / "config.xml"
    _write_private(users, users_xml(database, schema_scopes(statements)))
    _write_private(config, config_xml(users))
    return config


def server_policies(
    database: str,
    scopes: Iterable[TableScope],
    readers: dict[str, str],
    *,
    cluster: str | None = None,
) -> str:
    """`CREATE ROW POLICY` statements for a ClickHouse server: each reader user of `readers`
    (user -> tenant) sees its tenant's rows of every table in `scopes` and no row of a table
    without a tenant column; every other user (the writer, an operator) keeps every row.
    `cluster`: created ON CLUSTER, on the local and the Distributed tables alike. Pure."""
    if not readers:
        return ""
    others = ", ".join(f"`{u}`" for u in sorted(readers))
    on = f" ON CLUSTER {_literal(cluster)}" if cluster else ""
    out = []
    for s in scopes:
        for user, tenant in sorted(readers.items()):
            cond = "0" if s.column is None else f"`{s.column}` = {_literal(tenant)}"
            out.append(
                f"CREATE ROW POLICY OR REPLACE `tenant_scope_{user}`{on} ON {database}.{s.table} "
                f"USING {cond} TO `{user}`;"
            )
        out.append(
            f"CREATE ROW POLICY OR REPLACE tenant_scope_unbound{on} ON {database}.{s.table} "
            f"USING 1 TO ALL EXCEPT {others};"
        )
    return "\n".join(out) + "\n"
