"""The SLO rules file and its evaluation for the pages that show SLO state (Overview, Alerts).

One file for both: `--rules FILE` after `--` on a streamlit command line, else
analytics.slo.burn.rules_file (HANDOFFS_SLO_RULES, which `handoffs dashboard --rules FILE` sets,
else deploy/slos.yaml) — the file `handoffs alerts check` and the weekly report read.
Evaluations are cached for _data.TTL_S, keyed by the file's text, so an edit shows at once.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

import streamlit as st

from analytics.slo import burn as slo
from analytics.slo.store import evaluate_rules
from dashboard import _data

__all__ = ["evaluate", "read_rules", "rules_path"]


def rules_path() -> str:
    """The rules file this dashboard reads (it may not exist)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--rules")
    known, _ = p.parse_known_args(sys.argv[1:])
    return str(slo.rules_file(known.rules))


def read_rules(path: str) -> str | None:
    """The file's text, None when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


@st.cache_data(ttl=_data.TTL_S, show_spinner=False, max_entries=32)
def evaluate(
    store: str, database: str, path: str, text: str, as_of: str
) -> tuple[slo.SloStatus, ...]:
    """Every SLO of `text` evaluated at `as_of` (ISO UTC). RulesError for refused rules,
    _data.QueryFailed when the store refused or went away."""
    rules = slo.parse_rules(text, path=path)
    client = _data.client(_data.source())
    try:
        return evaluate_rules(client, rules, as_of=datetime.fromisoformat(as_of), database=database)
    except ValueError:
        raise
    except Exception as exc:  # the store went away or refused the query
        msg = " ".join(str(exc).split())[:300]
        raise _data.QueryFailed(f"Could not evaluate the SLOs: {msg}") from exc
