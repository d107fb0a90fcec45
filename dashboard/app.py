"""Streamlit entry point: routing only (`streamlit run dashboard/app.py`; see `handoffs dashboard`).

Pages live in dashboard/views/, not pages/: a `pages/` folder next to the entry file puts
Streamlit in its old directory mode, which bypasses st.navigation on a page's first load.
A deep link `?handoff_id=...` on the root URL is forwarded to the explorer.
"""

import streamlit as st

st.set_page_config(page_title="Handoff Observatory", page_icon=":material/hub:", layout="wide")

overview = st.Page(
    "views/overview.py", title="Overview", icon=":material/monitoring:", default=True
)
explorer = st.Page("views/explorer.py", title="Handoff explorer", icon=":material/search:")
page = st.navigation(
    [
        overview,
        st.Page("views/slices.py", title="Slices", icon=":material/grid_view:"),
        st.Page("views/anomalies.py", title="Anomalies", icon=":material/report:"),
        st.Page("views/alerts.py", title="Alerts", icon=":material/notifications:"),
        st.Page("views/graph.py", title="Fleet graph", icon=":material/share:"),
        explorer,
        st.Page("views/reports.py", title="Reports", icon=":material/description:"),
    ]
)
if page is overview and "handoff_id" in st.query_params:
    st.switch_page(explorer, query_params={"handoff_id": st.query_params["handoff_id"]})
page.run()
