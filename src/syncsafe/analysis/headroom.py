"""The report's headroom section: per regime and headroom policy, how much of the matched-random -> oracle gap
the policy closes, how much its knob family could close on the past alone (the online bound) and what only
foresight buys, from the headroom stage's tables (reports/headroom/<regime>/<policy>.csv)."""

from __future__ import annotations

from pathlib import Path

from syncsafe.analysis.report import markdown_table
from syncsafe.artifacts import layout
from syncsafe.artifacts.base import read_csv
from syncsafe.config import Params
from syncsafe.tuning.search import headroom_summary, percent

#: The columns of a headroom table the section reads (`tuning.search.headroom` writes them).
COLUMNS = ("seed", "n_merges", "random", "controller", "oracle", "closed", "bound_violations", "bound_closed")


def headroom_section(params: Params, root: Path) -> str:
    """The section (empty when no table is there: the headroom stage did not run)."""
    rows = []
    for regime in params.regimes:
        for policy in params.analysis.headroom_policies:
            path = layout.headroom_path(root, regime, policy)
            if not path.is_file():
                continue
            s = headroom_summary(read_csv(path, "headroom table", COLUMNS))
            rows.append([regime, policy, f"{s['seeds_defined']}/{s['seeds']}",
                         f"{percent(s['controller_closed'])} ({percent(s['controller_pooled'])})",
                         f"{percent(s['online_bound_closed'])} ({percent(s['online_bound_pooled'])})",
                         percent(s["foresight_share"])])
    if not rows:
        return ""
    return ("## Headroom: where the matched-random → oracle gap comes from\n\n"
            "Simulator, on the stress harness's learners, every seed (the tables: "
            f"`{layout.HEADROOM.as_posix()}/<regime>/<policy>.csv`). Per seed, *gap closed* = (matched random − "
            "policy) / (matched random − SLO oracle) at the policy's merge count, defined where matched random sits "
            "at least one request above the oracle; the *online bound* is the best point of the policy's knob grid "
            "at that count, chosen with hindsight on that seed (every point decides on the past alone); what it "
            "leaves is what only foresight, or another controller family, buys. Means over the seeds that define "
            "the gap; in parentheses, pooled over every seed (sum(random − schedule) / sum(random − oracle)). A "
            "description of where the gap is, not a verdict: the verdict table above is the claim.\n\n"
            + markdown_table(["regime", "policy", "seeds defined", "gap closed", "online bound", "left to foresight"],
                             rows))
