"""Streamlit entry point: routing only (`streamlit run dashboard/app.py`; see `handoffs dashboard`).

A bare deep link `?handoff_id=...` on the root URL opens the explorer directly.
"""

import streamlit as st

st.set_page_config(page_title="Handoff Observatory", page_icon=":material/hub:", layout="wide")

_deep_link = "handoff_id" in st.query_params
st.navigation(
    [
        st.Page(
            "views/overview.py",
            title="Overview",
            icon=":material/monitoring:",
            default=not _deep_link,
        ),
        st.Page("views/slices.py", title="Slices", icon=":material/grid_view:"),
        st.Page("views/anomalies.py", title="Anomalies", icon=":material/report:"),
        st.Page(
            "views/explorer.py",
            title="Handoff explorer",
            icon=":material/search:",
            default=_deep_link,
        ),
        st.Page("views/reports.py", title="Reports", icon=":material/description:"),
    ]
).run()
