"""The Streamlit dashboard: entry routes, one file per page; loaders live in analytics/.

`streamlit_command()` builds the `streamlit run` command line and `streamlit_env()` the
environment that `handoffs dashboard` (and `handoffs demo`) start it with.
"""

from dashboard._cli import APP_PATH, streamlit_command, streamlit_env

__all__ = ["APP_PATH", "streamlit_command", "streamlit_env"]
