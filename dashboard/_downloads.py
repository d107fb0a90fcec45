"""Evidence downloads of the Explorer: the shown handoff's task as a zip of the bulk export
(analytics.evidence.export: one package per handoff and manifest.json).

The zip is built when the button is clicked (Streamlit runs the callable then, off the
page script), so showing a handoff costs nothing; it is cached briefly per task. The
download is checked with `handoffs evidence verify DIR` once unzipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import streamlit as st

from analytics.evidence.export import Selection, zip_export
from dashboard import _data

__all__ = ["task_bundle_button"]


@st.cache_data(ttl=_data.TTL_S, show_spinner=False, max_entries=16)
def _task_zip(store: str, database: str, tenant: str, task_id: str) -> bytes:
    sel = Selection(task_id=task_id, tenant=tenant or None)
    return zip_export(_data._client(store, database), database=database, selection=sel)


def task_bundle_button(src: _data.Source, package: Mapping[str, Any]) -> None:
    """A download button of the package's task as a zip of evidence packages; nothing when
    the handoff has no task."""
    task = str(package.get("task_id") or "")
    if not task:
        return
    tenant = str(package.get("tenant") or "")
    st.download_button(
        "Download the task's evidence (zip)",
        lambda: _task_zip(src.store, src.database, tenant, task),
        file_name=f"evidence-task-{task}.zip",
        mime="application/zip",
        on_click="ignore",
        icon=":material/folder_zip:",
        key="ex_task_download",
        help="One evidence package per handoff of the task and manifest.json; unzip and check "
        "with `handoffs evidence verify DIR --public-key PUB`",
    )
