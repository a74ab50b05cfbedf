"""`syncsafe tune` and `syncsafe headroom`: a controller's knobs chosen on load never judged, and how much of
the matched-random -> oracle gap an online controller can hope for (`syncsafe.tuning`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from syncsafe.cli.common import ParamsOpt, RootOpt, run_stage_command
from syncsafe.config import load_params
from syncsafe.errors import BadInput
from syncsafe.pipeline.failures import fails_cleanly as _fails_cleanly

KnobOpt = Annotated[list[str] | None, typer.Option("--knob", help="KEY=V1,V2,...: one knob's grid (replaces or adds)")]
SeedsOpt = Annotated[list[int] | None, typer.Option("--seed", help="tuning seed (repeat); default: load never judged")]
JudgedOpt = Annotated[list[int] | None, typer.Option("--judged", help="judged seed (repeat); default: params seeds")]
DrawsOpt = Annotated[int | None, typer.Option("--draws", min=1, help="matched-random draws per count; default: params")]
ScaleOpt = Annotated[float | None, typer.Option("--time-scale", min=0.01,
                                               help="trace s per wall s of the load; default: the real arm's plan, else 1")]


@_fails_cleanly
def tune(policy: Annotated[str, typer.Argument(help="controller policy")],
         regime: Annotated[str, typer.Argument(help="regime")], knob: KnobOpt = None, seed: SeedsOpt = None,
         judged: JudgedOpt = None, draws: DrawsOpt = None, time_scale: ScaleOpt = None,
         params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Choose POLICY's knobs on tuning load REGIME's judging never sees: tuned/<regime>/<policy>.yaml."""
    from syncsafe.tuning.search import BenchSettings, tune as run_tune, write_tuned
    from syncsafe.tuning.segments import TuningSplit

    p = load_params(params)
    split = TuningSplit.of(p, regime, seed, judged)
    result = run_tune(p, policy, split, knob or [], BenchSettings(root, draws, time_scale))
    path = write_tuned(result, root)
    typer.echo(path.read_text(encoding="utf-8").rstrip())
    typer.echo(f"wrote {path} (every grid point: {path.with_suffix('.trials.csv')})")


@_fails_cleanly
def headroom(regime: Annotated[str, typer.Argument(help="regime")],
             policy: Annotated[str | None, typer.Option("--policy", help="controller policy; default: wa_lookahead")] = None,
             knob: KnobOpt = None, judged: JudgedOpt = None, draws: DrawsOpt = None, time_scale: ScaleOpt = None,
             stage: Annotated[bool, typer.Option("--stage", help="the pipeline's headroom stage for REGIME: every policy "
                                                 "of analysis.headroom_policies on every seed, tracked")] = False,
             params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Split REGIME's matched-random -> oracle gap: what POLICY's family reaches on the past alone (its online bound,
    tuned with hindsight per seed) and what only foresight buys. Table: reports/headroom/<regime>/<policy>.csv
    (the headroom stage's table, rewritten with these knobs; `dvc repro` restores the stage's)."""
    from syncsafe.artifacts.layout import headroom_path
    from syncsafe.io import write_csv
    from syncsafe.tuning.search import BenchSettings, describe_headroom, headroom as run_headroom

    if stage:
        given = [name for name, value in (("--policy", policy), ("--knob", knob), ("--judged", judged),
                                          ("--draws", draws), ("--time-scale", time_scale)) if value is not None]
        if given:
            raise BadInput(f"--stage runs the pipeline's headroom stage as params declare it: it takes no "
                           f"{', '.join(given)}")
        run_stage_command("headroom", params, root, [regime])
        return
    policy = "wa_lookahead" if policy is None else policy
    p = load_params(params)
    seeds = sorted(set(p.seeds if judged is None else judged))
    if regime not in p.regimes:
        raise BadInput(f"regime {regime!r} is not in {params} regimes ({', '.join(p.regimes)})")
    table = run_headroom(p, policy, regime, seeds, knob or [], BenchSettings(root, draws, time_scale))
    path = write_csv(headroom_path(root, regime, policy), table)
    typer.echo(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    typer.echo(f"{describe_headroom(regime, policy, table)} (params' knobs); {path}")
