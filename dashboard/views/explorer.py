"""Handoff explorer: one handoff's evidence package, its integrity check, and a JSON download.

Find by handoff_id (or its start), task_id, agent (sender or receiver) or idempotency key;
`?handoff_id=...` opens one directly (read once on arrival). "Why flagged" says, per anomaly
kind, which field of which transition (or which other handoff) made it fire; "Anomalies"
lists every kind that flags it, with the other handoffs (linked) or the fleet group and hours
it involves (dashboard/_findings.py). The integrity check runs against the store as it is now, never cached.
The handoffs of the same task are drawn as a small graph (nodes are handoffs, in causation
order); clicking one opens it. The protocol audit shows the retry chain (previous and next
attempts), the handoff this one consumes and its consumers (buttons open them), the
capability grant (with what its expiry means for the transitions) and the receipt's layers
(issued, read back, conflicts, used).
"""

import json

import pandas as pd
import streamlit as st

from analytics.audit_view import LinkedHandoff, grant_view, receipt_view
from analytics.display import markdown_link_text
from dashboard import _charts, _data, _findings, _graph, _graph_layout, _ui, _why


def _open(h: LinkedHandoff, label: str, key: str) -> None:
    """A button opening handoff `h` (a LinkedHandoff) in this page; the handoff shown is
    plain bold text instead."""
    state = h.last_state or _ui.DASH
    attempt = f"attempt {h.attempt} · " if h.attempt is not None else ""
    when = h.created.strftime("%H:%M:%S") if h.created else _ui.DASH
    text = f"{h.handoff_id} · {attempt}{state} · created {when} UTC"
    if h.handoff_id == hid:
        st.markdown(f":material/radio_button_checked: **{label} {markdown_link_text(text)}**")
        return
    if st.button(f"{label} {text}", key=key, icon=":material/arrow_forward:", type="tertiary"):
        # a new arrival for the next run: the search box is set before it is drawn
        st.query_params["handoff_id"] = h.handoff_id
        st.rerun()


def _decoded(v: object) -> object:
    """Array attributes travel as JSON text; show them as lists (the download keeps the text)."""
    if isinstance(v, str) and v.startswith("["):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


src = _ui.start_page("Handoff explorer")

got = _ui.arrived_params("explorer", ("handoff_id",))
if got:
    st.session_state["ex_query"] = got["handoff_id"]
st.session_state.setdefault("ex_query", "")
query = st.text_input(
    "Handoff id, task id, agent or idempotency key",
    key="ex_query",
    placeholder="e.g. h-3f2a…",
    persist_state="session",
).strip()

if not query:
    st.info(
        "Enter a handoff id, a task id, an agent or an idempotency key to open its evidence "
        "package.",
        icon=":material/search:",
    )
    st.stop()

with _ui.guard():
    package = _data.evidence_package(src.store, src.database, query)
    if package is None:
        matches = _data.search_handoffs(src.store, src.database, query)
        if len(matches) == 0:
            st.warning(
                "No handoff found with handoff id, task id, agent or idempotency key "
                f"“{_ui.user_text(query)}”. "
                "Check the id, or widen what the store holds (raw spans are kept 30 days, transitions 400).",
                icon=":material/search_off:",
            )
            st.stop()
        if len(matches) == 1:
            package = _data.evidence_package(
                src.store, src.database, str(matches["handoff_id"].iloc[0])
            )
        else:
            st.caption(f"{len(matches)} handoffs match “{_ui.user_text(query)}”.")
            ids = [str(h) for h in matches["handoff_id"]]
            pick = st.selectbox(
                "Open handoff", ids, index=None, placeholder="Pick one", key="ex_pick"
            )
            _why.id_table(matches, key="ex_matches")
            if pick is None:
                st.stop()
            package = _data.evidence_package(src.store, src.database, pick)
    if package is None:
        st.warning(
            f"Handoff “{_ui.user_text(query)}” has no created transition in the store.",
            icon=":material/search_off:",
        )
        st.stop()

hid = package["handoff_id"]
if st.query_params.get("handoff_id") != hid:
    # the URL names the handoff shown, so it can be shared
    _ui.set_params("explorer", {"handoff_id": hid})
terminal = package.get("terminal") or {}
transitions = package.get("transitions") or []
env = package.get("envelope") or {}
st.subheader(f"Handoff {hid}")
id_cols = st.columns(2)
with id_cols[0]:
    _why.copyable("Handoff id", hid)
with id_cols[1]:
    _why.copyable("Task id", str(package.get("task_id") or ""))
m = st.columns([3, 1, 1])
m[0].markdown(
    f"**Task** `{package.get('task_id') or _ui.DASH}` · **Tenant** `{package.get('tenant') or _ui.DASH}`  \n"
    f"**Mode** {env.get('mode') or _ui.DASH} · **From** {env.get('from_agent') or _ui.DASH} "
    f"→ **To** {env.get('to_agent') or _ui.DASH} · **Topology** {env.get('topology') or _ui.DASH}"
)
state = str(terminal.get("state") or _ui.DASH)
m[1].metric("Terminal state" if terminal.get("is_terminal", True) else "Last state (open)", state)
m[2].metric("Transitions", f"{len(transitions):,}")

with _ui.guard():
    verdict = _data.verify_package(src, package)
if verdict.ok:
    st.success(
        "Integrity check passed: the stored transitions match the package and the ingest ledger.",
        icon=":material/verified:",
    )
else:
    st.error(
        "Integrity check FAILED:\n\n" + "\n".join(f"- {p}" for p in verdict.problems),
        icon=":material/gpp_bad:",
    )
_why.why_flagged(package)
_findings.findings_panel(package)

st.plotly_chart(_charts.timeline_figure(transitions), key="ex_timeline")
if package.get("task_id"):
    with _ui.guard():
        siblings = _data.task_handoffs(
            src.store, src.database, str(package.get("tenant") or ""), str(package["task_id"])
        )
    if len(siblings) == 1:
        st.caption(f"Task `{package['task_id']}` has no other handoff.")
    elif len(siblings):
        rows = siblings.to_dict("records")
        has_cause = any(r["causation_id"] for r in rows)
        picked = st.plotly_chart(
            _graph.task_figure(
                _graph_layout.task_layers(rows),
                {str(r["handoff_id"]): str(r["last_state"]) for r in rows},
                current=hid,
            ),
            key="ex_task_graph",
            on_select="rerun",
            selection_mode=("points",),
            config={"displayModeBar": False},
        )
        st.caption(
            f"The {len(rows):,} handoffs of task `{package['task_id']}`: each node is a handoff "
            "(this one ringed), coloured by its last state; "
            + (
                "an arrow runs from the handoff named by handoff.causation_id to the one it caused."
                if has_cause
                else "no handoff names a causation id, so they follow each other in created order."
            )
            + " Click a node to open that handoff."
        )
        _why.id_table(
            siblings[
                [
                    c
                    for c in (
                        "handoff_id",
                        "from_agent",
                        "to_agent",
                        "mode",
                        "created",
                        "last_state",
                    )
                    if c in siblings
                ]
            ],
            key="ex_task_handoffs",
            current=hid,
        )
        for pt in (picked.selection.points if picked else None) or []:
            data = pt.get("customdata") if isinstance(pt, dict) else None
            if isinstance(data, list | tuple) and data and str(data[0]) != hid:
                # a new arrival for the next run: the search box is set before it is drawn
                st.query_params["handoff_id"] = str(data[0])
                st.rerun()
tdf = _why.transitions_frame(package)
if len(tdf):
    # "legal": the state machine's verdict; the evidence flag is the row's, as stored
    st.dataframe(tdf, hide_index=True, key="ex_transitions")

st.markdown("#### Protocol audit")
with _ui.guard():
    links = _data.handoff_links(
        src.store,
        src.database,
        str(package.get("tenant") or ""),
        hid,
        str(package.get("task_id") or ""),
        tuple(str(env.get(k) or "") for k in ("retry_of", "causation_id")),
    )
chain_col, cause_col = st.columns(2)
with chain_col:
    st.markdown("**Retry chain**")
    if links.attempts:
        st.caption(
            f"{len(links.attempts)} attempts of this task at {env.get('to_agent') or _ui.DASH} "
            "(linked by retry_of, or the same idempotency key), in attempt order."
        )
        for i, h in enumerate(links.attempts):
            rel = (
                "This:"
                if h.handoff_id == hid
                else "Previous:"
                if links.previous and h.handoff_id == links.previous.handoff_id
                else "Next:"
                if any(n.handoff_id == h.handoff_id for n in links.next)
                else "Attempt:"
            )
            _open(h, rel, key=f"ex_attempt_{i}")
    else:
        st.caption("The only attempt: no retry of it, and it retries nothing.")
with cause_col:
    st.markdown("**Causation**")
    if links.upstream is not None:
        _open(links.upstream, "Consumes the result of", key="ex_upstream")
    elif links.upstream_unresolved:
        st.caption(
            f"Caused by `{links.upstream_unresolved}`, which names no stored handoff "
            "(a message id, or not stored)."
        )
    for i, h in enumerate(links.downstream):
        _open(h, "Consumed by", key=f"ex_downstream_{i}")
    if links.upstream is None and not links.upstream_unresolved and not links.downstream:
        st.caption("Consumes no other handoff's result, and none in its task consumes its own.")

grant_col, receipt_col = st.columns(2)
with grant_col:
    st.markdown("**Grant**")
    grant = grant_view(package)
    if grant is None:
        st.caption("The create carried no capability grant.")
    else:
        st.dataframe(
            pd.DataFrame(
                {
                    "field": [
                        "caller",
                        "subject",
                        "tenant",
                        "approval",
                        "capabilities",
                        "resources",
                        "expires at",
                    ],
                    "value": [
                        grant.caller or _ui.DASH,
                        grant.subject or _ui.DASH,
                        grant.tenant or _ui.DASH,
                        grant.approval or _ui.DASH,
                        ", ".join(grant.capabilities) or _ui.DASH,
                        ", ".join(grant.resources) or _ui.DASH,
                        grant.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC")
                        if grant.expires_at
                        else grant.expires_text or _ui.DASH,
                    ],
                }
            ),
            hide_index=True,
            width="stretch",
            key="ex_grant",
        )
        for note in grant.notes:
            st.warning(f"Grant {note}.", icon=":material/gpp_maybe:")
with receipt_col:
    st.markdown("**Receipt**")
    receipt = receipt_view(package, links.downstream)
    if receipt is None:
        st.caption("No receipt was issued, and none was read back.")
    else:
        issued = (
            f"`{receipt.receipt_id}` at {receipt.issued_at.strftime('%Y-%m-%d %H:%M:%S')} UTC"
            if receipt.receipt_id and receipt.issued_at
            else _ui.DASH
        )
        until = (
            receipt.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC")
            if receipt.expires_at
            else receipt.expires_text or _ui.DASH
        )
        if receipt.read_back is None:
            back = "not read back"
        else:
            back = ("yes" if receipt.read_back else "no") + (
                f", by {receipt.read_back_by} at "
                f"{receipt.read_back_at.strftime('%Y-%m-%d %H:%M:%S')} UTC"
                if receipt.read_back_at
                else ""
            )
        st.markdown(
            f"**Issued** {issued}  \n**Valid until** {until}  \n**Read back** {back}  \n"
            f"**Conflicts** {', '.join(receipt.conflicts) if receipt.conflicts else 'none'}"
        )
        for note in receipt.notes:
            st.warning(f"Receipt {note}.", icon=":material/receipt_long:")

left, right = st.columns(2)
with left:
    st.markdown("**Envelope**")
    st.json({k: _decoded(v) for k, v in env.items()}, expanded=2)
    st.markdown("**Input summary**")
    summary = package.get("input_summary") or {}
    if isinstance(summary, dict):
        st.json(
            {k: v for k, v in summary.items() if v} or {"objective": "not recorded"}, expanded=True
        )
    else:
        st.write(summary)
with right:
    st.markdown("**Evidence references**")
    refs = _why.evidence_refs_frame(package)
    if len(refs):
        st.dataframe(refs, hide_index=True, key="ex_evidence_refs")
    else:
        st.write("none")
    st.markdown("**Terminal state and receipt**")
    st.json(terminal, expanded=True)
    st.markdown("**Execution**")
    st.json(package.get("execution") or {}, expanded=False)

st.markdown("**Other spans of the trace**")
related = package.get("related_spans") or []
if related:
    # the handoff each span is a transition of, linked (blank: a span of no handoff)
    spans = pd.DataFrame(related)
    if "handoff_id" in spans:
        spans.insert(
            0,
            "handoff",
            [f"explorer?handoff_id={h}" if h else None for h in spans.pop("handoff_id")],
        )
    st.dataframe(
        spans,
        hide_index=True,
        key="ex_related",
        column_config={
            "handoff": st.column_config.LinkColumn(
                "handoff", display_text=r"explorer\?handoff_id=(.*)"
            )
        },
    )
else:
    st.write("none stored (raw spans are kept 30 days)")

with st.expander("Integrity section"):
    st.json(package.get("integrity") or {}, expanded=False)

st.download_button(
    "Download evidence package (JSON)",
    json.dumps(package, indent=2, sort_keys=True, default=str),
    file_name=f"evidence-{hid}.json",
    mime="application/json",
    on_click="ignore",
    icon=":material/download:",
    key="ex_download",
)
from dashboard._downloads import task_bundle_button  # noqa: E402 - the task's packages, zipped

task_bundle_button(src, package)
_ui.footer(src, "Handoff explorer")
