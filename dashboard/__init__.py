"""The Streamlit dashboard: entry routes, one file per page; loaders live in analytics/."""

__all__: list[str] = []
