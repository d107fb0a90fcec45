"""Agent pairs ranked by handoffs lost, with the stage that loses them (pure).

Why: a rate ranks a pair with 2 settled handoffs at 0% above a pair that lost 33 of 33; a
count of handoffs lost ranks by harm, and the stage losing the most says where to look. The
table is ranked by `excess_lost`, the handoffs a pair loses beyond what the fleet's own loss
rate would lose of its volume: a busy pair losing at the fleet's rate loses many handoffs and
is no problem of its own, a pair losing 33 of 33 is.
Built from a funnel frame by pair (`funnel(by=("pair",))`, or a split rolled up to
`("from_agent", "to_agent")`), so it shows exactly the numbers `handoffs metrics` shows.

Over the settled handoffs of each pair (the funnel's counts, S ⊇ A ⊇ E ⊇ V ⊇ K):

| column | handoffs |
|---|---|
| lost_accept | settled, not accepted (S − A) |
| lost_execute | accepted, not executed (A − E) |
| lost_evidence | executed without valid evidence (E − V) |
| lost_commit | evidenced, not committed (V − K) |
| lost | the four summed: settled, not committed (S − K) |
| excess_lost | lost − settled × the loss rate of all pairs of the frame: what the pair loses beyond the fleet (negative: better than the fleet) |

`failing_stage` is the stage with the largest loss (ties: the earlier stage, which the later
ones depend on), "" when nothing was lost. `rankable` is `settled >= min_n`: a smaller sample
is listed but never called worst. A minimum count rather than a confidence interval because
it is one number a reader can check in the table: below the default 20, one handoff moves a
rate by 5 points or more (0 of 2 has a 95% Wilson interval of 0–66%).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Final

from analytics.rollup import rate

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["LOST_STAGES", "MIN_N", "lost_by_pair"]

#: Settled handoffs a pair needs to be called worst (`rankable`).
MIN_N: Final = 20
#: stage -> (count entering the stage, count passing it), in funnel order.
LOST_STAGES: Final = {
    "accept": ("settled", "accepted"),
    "execute": ("accepted", "executed"),
    "evidence": ("executed", "evidenced"),
    "commit": ("evidenced", "committed"),
}
_COUNTS: Final = ("settled", "accepted", "executed", "evidenced", "committed")


def lost_by_pair(funnel_by_pair: pd.DataFrame, *, min_n: int = MIN_N) -> pd.DataFrame:
    """Per pair, handoffs lost at each stage; most lost first.

    `funnel_by_pair`: a funnel frame with a `pair` column ("from->to"), or `from_agent` and
    `to_agent` columns (then `pair` is built from them and they are kept), and the counts
    settled, accepted, executed, evidenced, committed; rows of the same pair are summed.
    Returns one row per pair: pair (and from_agent, to_agent when given), settled,
    lost_accept, lost_execute, lost_evidence, lost_commit, lost (all int, handoffs),
    excess_lost (float, handoffs lost beyond the frame's overall loss rate), failing_stage ("accept" | "execute" | "evidence" | "commit" | ""), p_accept, p_execute,
    p_evidence, p_commit, p_e2e (fractions, NaN when undefined) and rankable (bool). Sorted
    rankable pairs first, each part by lost descending, then settled descending, then pair:
    the first row is the top contributor when any pair is rankable. ValueError when min_n is not a
    non-negative int or a column is missing.
    """
    import pandas as pd

    try:
        n_min = operator.index(min_n)
    except TypeError:
        n_min = -1
    if isinstance(min_n, bool) or n_min < 0:
        raise ValueError(f"min_n must be a whole number >= 0, got {min_n!r}")
    agents = "from_agent" in funnel_by_pair and "to_agent" in funnel_by_pair
    if not agents and "pair" not in funnel_by_pair:
        raise ValueError("lost_by_pair needs a `pair` column or `from_agent` and `to_agent`")
    missing = [c for c in _COUNTS if c not in funnel_by_pair]
    if missing:
        raise ValueError(f"lost_by_pair: the frame has no {', '.join(missing)} column")
    keys = ["from_agent", "to_agent"] if agents else ["pair"]
    df = funnel_by_pair[[*keys, *_COUNTS]]
    df = df.groupby(keys, as_index=False, sort=False)[list(_COUNTS)].sum() if len(df) else df
    total = int(df["settled"].sum()) if len(df) else 0
    fleet = rate(total - int(df["committed"].sum()), total) if total else 0.0
    rows = []
    for r in df.to_dict(orient="records"):
        c = {k: int(r[k]) for k in _COUNTS}
        lost = {s: c[a] - c[b] for s, (a, b) in LOST_STAGES.items()}
        worst = max(LOST_STAGES, key=lambda s: lost[s])  # max keeps the first of equals
        pair = f"{r['from_agent']}->{r['to_agent']}" if agents else str(r["pair"])
        rows.append(
            {
                "pair": pair,
                **({k: r[k] for k in keys} if agents else {}),
                "settled": c["settled"],
                **{f"lost_{s}": n for s, n in lost.items()},
                "lost": c["settled"] - c["committed"],
                "excess_lost": c["settled"] - c["committed"] - c["settled"] * fleet,
                "failing_stage": worst if lost[worst] > 0 else "",
                **{f"p_{s}": rate(c[b], c[a]) for s, (a, b) in LOST_STAGES.items()},
                "p_e2e": rate(c["committed"], c["settled"]),
                "rankable": c["settled"] >= n_min,
            }
        )
    cols = ["pair", *(keys if agents else []), "settled", *(f"lost_{s}" for s in LOST_STAGES)]
    cols += [
        "lost",
        "excess_lost",
        "failing_stage",
        *(f"p_{s}" for s in LOST_STAGES),
        "p_e2e",
        "rankable",
    ]
    out = pd.DataFrame(rows, columns=cols)
    order = ["rankable", "excess_lost", "lost", "pair"]
    out = out.sort_values(order, ascending=[False, False, False, True], kind="stable")
    return out.reset_index(drop=True)
