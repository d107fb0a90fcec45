"""Overview: KPI tiles with deltas against the previous period, the funnel, trends.

Every tile can list the handoffs behind it (links into the explorer). "Why handoffs are
refused" counts the refusals by error code (share of the refusals and of the settled
handoffs) with example handoffs linking into the explorer. "Where handoffs came from"
slices the funnel by origin: the shim, an adapter, or derivation from framework spans
(analytics.origin). Above the tiles, a warning when traces of the window had several agents
but no derived handoff (analytics.coverage): their handoffs are in none of these numbers, so
an empty funnel is not mistaken for a healthy one. Optional auto-refresh for a wall
screen re-runs only the body (st.fragment), moving a "Last ..." range with the clock.

On top, one line of verdict (dashboard._verdict): healthy / ticket / paging from the
burn-rate alerts of the SLO rules file the Alerts page, `handoffs alerts check` and the weekly
report read, the pair and stage losing the most handoffs in the window, and one link to act.
"""

from typing import Any

import pandas as pd
import streamlit as st

from analytics.display import markdown_link_text
from analytics.rollup import OUTCOMES, rollup
from dashboard import _charts, _data, _ui, _verdict
from dashboard._store import StoreUnavailable

#: (funnel column, tile label, kind, handoffs_behind stage, help). kind: rate | count.
KPIS = (
    ("p_e2e", "P_e2e", "rate", "committed", "committed with valid evidence / settled"),
    ("p_accept", "P_accept", "rate", "accepted", "accepted (or later) / settled"),
    ("p_execute", "P_execute", "rate", "executed", "produced a result / accepted"),
    (
        "p_evidence",
        "P_evidence",
        "rate",
        "evidenced",
        "result whose evidence was marked valid and passed the checks its envelope declares "
        "(evidence policy, reply contract) / executed",
    ),
    ("p_commit", "P_commit", "rate", "committed", "committed / evidenced"),
    (
        "unknown_rate",
        "Unknown rate",
        "rate",
        "unknown",
        "settled handoffs that ever entered unknown / settled",
    ),
    (
        "escalation_rate",
        "Escalation rate",
        "rate",
        "escalated",
        "mode escalate or reached escalated / settled",
    ),
    (
        "unresolved_now",
        "Unresolved now",
        "count",
        "unresolved",
        "in unknown and not resolved as of now",
    ),
    (
        "in_flight",
        "In flight",
        "count",
        "in_flight",
        "created in the window, not yet settled (not in the rates)",
    ),
    ("volume", "Volume", "count", "all", "handoffs created in the window"),
)
_INVERSE = {"unknown_rate", "escalation_rate", "unresolved_now"}
_NEUTRAL = {"in_flight"}  # more in flight is neither good nor bad

src = _ui.start_page("Overview")
picked = _ui.pickers(src, "overview")
auto = st.sidebar.toggle("Auto-refresh (wall screen)", key="ov_auto", persist_state="session")
every = (
    st.sidebar.selectbox(
        "Refresh every (s)", (30, 60, 300), key="ov_every", persist_state="session"
    )
    if auto
    else None
)


def _row(df: pd.DataFrame) -> dict[str, Any]:
    return df.iloc[0].to_dict() if len(df) else {}


def _split_at(split: pd.DataFrame, p: _ui.Picked) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(rows of this window, rows of the previous period) of an hourly split."""
    if not len(split):
        return split, split
    return split[split["bucket"] >= p.start], split[split["bucket"] < p.start]


#: (column of analytics.origin.funnel_by_origin, header) shown per origin
ORIGIN_COLUMNS = (
    ("volume", "handoffs"),
    ("settled", "settled"),
    ("p_accept", "P_accept"),
    ("p_execute", "P_execute"),
    ("p_e2e", "P_e2e"),
)


def origins(p: _ui.Picked) -> None:
    """The funnel per origin: shim, adapter:<name> or derived:<rule>."""
    st.subheader("Where handoffs came from")
    with _ui.guard():
        df = _data.origins(src.store, src.database, *p.args, tenant=p.tenant)
    if not len(df):
        st.caption("No handoff was created in this window.")
        return
    table = pd.DataFrame({"origin": df["origin"]})
    for col, header in ORIGIN_COLUMNS:
        fmt = _ui.fmt_count if col in ("volume", "settled") else _ui.fmt_rate
        table[header] = [fmt(v) for v in df[col]]
    st.dataframe(table, hide_index=True, key="ov_origins")
    st.caption(
        "`shim`: the project's shim (or another emitter of the wire contract); "
        "`adapter:<name>`: one of its framework adapters; `derived:<rule>`: derived by "
        "`handoffs serve` from the spans a framework already exports (docs/derived-handoffs.md)."
    )


#: example handoffs listed per error code
REFUSAL_EXAMPLES = 10


def refusals(p: _ui.Picked) -> None:
    """The refusals of the window by error code, and the handoffs behind one code."""
    st.subheader("Why handoffs are refused")
    with _ui.guard():
        rows = _data.rejections(
            src.store, src.database, *p.args, tenant=p.tenant, examples=REFUSAL_EXAMPLES
        )
    if rows is None:
        st.caption("Refusal reasons are not available from this installation's analytics.")
        return
    if not rows:
        st.caption("No handoff was refused in this window.")
        return
    df = pd.DataFrame(
        {
            "error code": [r["error_code"] for r in rows],
            "refused": [int(r["count"]) for r in rows],
            "share of refusals": [_ui.fmt_rate(r["share_of_rejections"]) for r in rows],
            "share of settled": [_ui.fmt_rate(r["share_of_settled"]) for r in rows],
            # codes outside the documented vocabulary are grouped as "other": name them
            "codes sent": [
                ", ".join(r.get("raw_codes") or ()) if r["error_code"] == "other" else ""
                for r in rows
            ],
            "example": [
                _ui.explorer_link(r["examples"][0]) if r["examples"] else None for r in rows
            ],
        }
    )
    st.dataframe(
        df,
        hide_index=True,
        key="ov_refusals",
        column_config={
            "example": st.column_config.LinkColumn(
                "example handoff", display_text=r"explorer\?handoff_id=(.*)"
            ),
        },
    )
    codes = [str(r["error_code"]) for r in rows]
    code = st.selectbox(
        "Refusals with error code",
        codes,
        index=None,
        placeholder="Pick a code to list its handoffs",
        format_func=lambda c: f"{c} ({int(rows[codes.index(c)]['count']):,})",
        key="ov_refusal_code",
    )
    if code is not None:
        examples = list(rows[codes.index(code)]["examples"])
        st.caption(
            f"{len(examples)} of {int(rows[codes.index(code)]['count']):,} handoffs refused "
            f"with `{code}`; each opens its evidence package."
        )
        st.markdown(
            "\n".join(f"- [{markdown_link_text(h)}]({_ui.explorer_link(h)})" for h in examples)
        )


def outcome_row(cur: dict) -> None:
    """One line under the tiles: how the window's handoffs ended (analytics OUTCOMES), each
    count a link to the handoffs behind it when there are any."""
    parts = []
    for o in OUTCOMES:
        n = int(cur.get(f"outcome_{o}", 0) or 0)
        label = o.replace("_", " ")
        parts.append(f"{label} **{_ui.fmt_count(n)}**")
    st.markdown(
        "Outcomes: " + " · ".join(parts),
        help="Handoffs of the window that entered rejected, expired, failed, canceled or "
        "escalated; unknown open: entered unknown, not resolved; unknown resolved: entered "
        "unknown and left it later. List them under “Handoffs behind a number”.",
    )


#: scopes named in the blind-spot warning at most
BLIND_SCOPES = 5


def blind_spots(p: _ui.Picked) -> None:
    """A warning naming the window's blind-spot traces (several agents ran, no handoff was
    derived), their scopes and an example trace; nothing when there are none. A failed read
    is a caption, not a stop: the funnel below does not depend on it."""
    try:
        rows = _data.blind_spots(src.store, src.database, *p.args, tenant=p.tenant)
    except (_data.QueryFailed, StoreUnavailable):
        st.caption("Blind spots (traces no rule derives handoffs from) could not be read.")
        return
    total = sum(int(r["traces"]) for r in rows)
    if not total:
        return
    scopes = ", ".join(
        _ui.user_text(r["scope"] or "(no scope)")
        + f" ({int(r['traces']):,}"
        + ("" if p.tenant else f", tenant {_ui.user_text(r['tenant'])}")
        + ")"
        for r in rows[:BLIND_SCOPES]
    )
    more = f" and {len(rows) - BLIND_SCOPES} more" if len(rows) > BLIND_SCOPES else ""
    example = next((r["examples"][0] for r in rows if r["examples"]), "")
    st.warning(
        f"**{total:,} traces in which several agents ran but no handoff was derived** — "
        f"scopes {scopes}{more}, e.g. trace {_ui.user_text(example, limit=64)}. Their handoffs "
        "are in none of the numbers on this page: no derivation rule knows these spans. List "
        "them with `handoffs blind-spots`; what to do: docs/derived-handoffs.md, “Blind spots”.",
        icon=":material/visibility_off:",
    )


@st.fragment(run_every=every)
def body() -> None:
    p = picked.refreshed() if auto else picked
    _verdict.show(src, p)  # one line above the fold: the SLOs' verdict and what to look at
    blind_spots(p)  # above the fold, and shown with an empty funnel too
    with _ui.guard():
        # one query split by tenant (and hour or day): tiles, trend, tenant list roll it up
        split = _data.tenant_split(src.store, src.database, *p.split_args())
        if p.aligned:  # the split also holds the previous period's hours
            rows, before = _split_at(split, p)
            prev = _row(rollup(before, tenant=p.tenant))
        else:  # the previous period only feeds the deltas: its totals, filtered in SQL
            rows = split
            prev = _row(_data.funnel(src.store, src.database, *p.previous().args, tenant=p.tenant))
    cur = _row(rollup(rows, tenant=p.tenant))
    if not cur or not cur.get("volume"):
        st.info(
            f"No handoffs were created in this window ({p.describe()}"
            + (f", tenant {_ui.user_text(p.tenant)}" if p.tenant else "")
            + "). Pick a longer range, or send spans to `handoffs serve` (try `handoffs demo`).",
            icon=":material/inbox:",
        )
        return

    for start in (0, 5):
        cols = st.columns(5)
        for col, (key, label, kind, _, help_) in zip(cols, KPIS[start : start + 5], strict=True):
            if kind == "rate":
                value, delta = (
                    _ui.fmt_rate(cur.get(key)),
                    _ui.delta_rate(cur.get(key), prev.get(key)),
                )
            else:
                value, delta = (
                    _ui.fmt_count(cur.get(key)),
                    _ui.delta_count(cur.get(key), prev.get(key)),
                )
            col.metric(
                label,
                value,
                delta,
                delta_color="off"
                if key in _NEUTRAL
                else _ui.delta_color(delta, inverse=key in _INVERSE),
                delta_arrow="off" if _ui.delta_color(delta) == "off" else "auto",
                help=f"{help_}. Delta: against the previous {p.end - p.start} period.",
                border=True,
            )
    st.caption(
        f"{_ui.fmt_count(cur.get('settled'))} settled handoffs in {p.describe()}"
        + (f" · tenant {_ui.user_text(p.tenant)}" if p.tenant else "")
        + ". Rates use settled handoffs; “—” means the stage had no handoffs to measure."
    )
    st.caption(
        f"P_evidence {_ui.fmt_rate(cur.get('p_evidence'))} counts checked evidence; the "
        f"emitters marked {_ui.fmt_rate(cur.get('p_evidence_claimed'))} of the executed "
        "results valid (list the difference: “Evidence disputed” below)."
    )
    outcome_row(cur)

    left, right = st.columns(2)
    left.plotly_chart(_charts.funnel_figure(cur), key="ov_funnel")
    if p.bucket == "day" and p.aligned and len(rows):
        rows = rows.assign(bucket=rows["bucket"].dt.floor("D"))  # hourly rows -> daily trend
    trend = rollup(rows, ("bucket",), tenant=p.tenant)
    right.plotly_chart(
        _charts.trend_figure(trend, bucket=p.bucket, x_range=(p.start, p.end)), key="ov_trend"
    )

    refusals(p)

    st.subheader("Handoffs behind a number")
    stages = [stage for *_, stage, _ in KPIS] + ["evidence_disputed"]
    stages += [f"outcome_{o}" for o in OUTCOMES]
    labels = [f"{label} — {stage.replace('_', ' ')}" for _, label, _, stage, _ in KPIS]
    labels += ["Evidence disputed — marked valid, failed a check"]
    labels += [f"Outcome — {o.replace('_', ' ')}" for o in OUTCOMES]
    choice = st.selectbox(
        "Number",
        labels,
        index=None,
        placeholder="Pick a number to list its handoffs",
        key="ov_behind",
    )
    if choice is not None:
        stage = stages[labels.index(choice)]
        with _ui.guard():
            df = _data.handoffs_behind(
                src.store, src.database, *p.args, stage=stage, tenant=p.tenant
            )
        st.caption(f"Up to 200 handoffs, stage `{stage}`; click one to open its evidence package.")
        _ui.handoffs_table(df, key="ov_behind_table")

    origins(p)


body()
_ui.footer(src, "Overview")
