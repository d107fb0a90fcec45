"""`handoffs serve` builds the whole CLI parser; that must not load the analytics stack.

pandas/numpy/plotly/streamlit cost ~100 MB of RSS in the serve process (against its RSS budget of 500 MB);
only the commands that need them import them, inside the command functions.
"""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pandas", "numpy", "plotly", "streamlit", "pyarrow")


def test_building_the_parser_leaves_heavy_modules_out() -> None:
    code = (
        "import sys, handoffs.cli; handoffs.cli.build_parser(); "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "", f"loaded at parser build: {out.stdout.strip()}"


def test_analytics_names_still_resolve_on_use() -> None:
    code = (
        "import sys, analytics; from analytics import Window, funnel, weekly_report; "
        "assert callable(funnel) and callable(weekly_report) and Window; "
        "assert set(analytics.__all__) <= set(dir(analytics)); "
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "True"
