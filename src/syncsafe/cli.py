"""The `syncsafe` command: one subcommand per pipeline stage, plus views.

Every command validates params.yaml first; a bad key stops it with one line
naming the key and exit code 2, before anything is written. Exit codes: 0 done,
1 a run failed (a server or process died), 2 bad input (`syncsafe.errors.BadInput`:
params, arguments, input files), 3 a lost island.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import click
import typer

from syncsafe.config import ConfigError, Params, load_params
from syncsafe.errors import EXIT_BAD_INPUT, EXIT_FAILED, BadInput

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
schedules_app = typer.Typer(help="Merge schedules: bare `syncsafe schedules` shows the summary view.")
app.add_typer(schedules_app, name="schedules")
replay_app = typer.Typer(help="Serving replay: bare `syncsafe replay` shows the summary view.")
app.add_typer(replay_app, name="replay")

ParamsOpt = Annotated[Path, typer.Option("--params", help="params.yaml to read")]
RootOpt = Annotated[Path, typer.Option("--root", help="project root that data/ and runs/ live under")]
RegimeOpt = Annotated[list[str] | None, typer.Option("--regime", help="regime(s) to run; default: all")]

F = TypeVar("F", bound=Callable[..., object])


def _fails_cleanly(fn: F) -> F:
    """Turn the library's errors into one clear line on stderr and the documented exit code.

    BadInput -> 2; an error carrying its own `exit_code` (IslandLost -> 3) -> that code;
    any other failed run -> 1. Click's own exits (typer.Exit) pass through unchanged.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except BadInput as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except (ValueError, OSError, RuntimeError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(getattr(err, "exit_code", EXIT_FAILED)) from None

    return wrapper  # type: ignore[return-value]


def _regimes(params: Params, chosen: list[str] | None) -> list[str]:
    for name in chosen or []:
        if name not in params.regimes:
            raise ConfigError(f"--regime {name!r}: not a regime in params.yaml (have {sorted(params.regimes)})")
    return list(chosen or params.regimes)


@app.command()
@_fails_cleanly
def traces(regime: RegimeOpt = None, params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Stage traces: load timeline and request list per regime and seed."""
    from syncsafe.traces.stage import build_traces

    from syncsafe.tracking.stages import track_traces

    p = load_params(params)
    for name in _regimes(p, regime):
        written = build_traces(p, name, root)
        track_traces(p, name, root)
        typer.echo(f"traces {name}: {len(written)} files for seeds {p.seeds}")


@app.command()
@_fails_cleanly
def train(
    regime: RegimeOpt = None,
    policy: Annotated[list[str] | None, typer.Option("--policy", help="policy to train; default: all")] = None,
    seed: Annotated[list[int] | None, typer.Option("--seed", help="seed to train; default: all")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="skip complete runs; continue others from their last merge")] = False,
    params: ParamsOpt = Path("params.yaml"),
    root: RootOpt = Path("."),
) -> None:
    """Stage train: DiLoCo islands as processes, merges gated by each policy, per regime x policy x seed."""
    from syncsafe.diloco.launch import train_regime
    from syncsafe.tracking import section_params, stage_run
    from syncsafe.tracking.stages import train_runs

    p = load_params(params)
    for name in policy or []:
        if name not in p.control.policies:
            raise ConfigError(f"--policy {name!r}: not in control.policies ({p.control.policies})")
    for value in seed or []:
        if value not in p.seeds:
            raise ConfigError(f"--seed {value}: not in seeds ({p.seeds})")
    for name in _regimes(p, regime):
        section = section_params(p, ["profile", "seeds", "merge", "control", "train", f"regimes.{name}"])
        with stage_run("train", root=root, params_section=section, profile=p.profile, regime=name,
                       system_metrics=True) as tracker:
            dirs = train_regime(p, params, name, root, resume=resume, policies=policy, seeds=seed)
            tracker.extend(train_runs(p, name, dirs))
        typer.echo(f"train {name}: {len(dirs)} runs in {Path(root) / 'runs' / 'train' / name}")


@app.command("import-trace")
@_fails_cleanly
def import_trace_cmd(
    fmt: Annotated[str, typer.Argument(help="azure | burstgpt | mooncake")],
    path: Annotated[Path, typer.Argument(help="the public trace file")],
    out: Annotated[Path, typer.Option("--out", help="requests.parquet to write")],
) -> None:
    """Turn a public request trace into the request table (arrival_s, prompt_tokens, output_tokens)."""
    from syncsafe import io
    from syncsafe.traces.importers import import_trace

    requests = import_trace(fmt, path)
    io.write_parquet(out, requests)
    span = requests["arrival_s"].iloc[-1] if len(requests) else 0.0
    typer.echo(f"{out}: {len(requests)} requests over {span:.1f} s")


@schedules_app.callback(invoke_without_command=True)
@_fails_cleanly
def schedules_view(ctx: typer.Context, root: RootOpt = Path(".")) -> None:
    """Per regime and policy: merges per seed and the busy-overlap fraction."""
    if ctx.invoked_subcommand is not None:
        return
    from syncsafe.schedules.view import print_summary, summarize

    print_summary(summarize(root))


@schedules_app.command("build")
@_fails_cleanly
def schedules_build(regime: RegimeOpt = None, params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Stage schedules: controller schedules plus matched-random, offline-bound and no-sync baselines."""
    from syncsafe.schedules.stage import build_schedules
    from syncsafe.tracking.stages import track_schedules

    p = load_params(params)
    for name in _regimes(p, regime):
        index = build_schedules(p, name, root)
        track_schedules(p, name, index, root)
        typer.echo(f"schedules {name}: {len(index)} schedules")


@schedules_app.command("index")
@_fails_cleanly
def schedules_index(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Stage schedule-index: join the per-regime indexes into runs/schedules/index.csv."""
    from syncsafe.schedules.stage import build_index

    index = build_index(load_params(params), root)
    typer.echo(f"runs/schedules/index.csv: {len(index)} schedules")


@replay_app.callback(invoke_without_command=True)
@_fails_cleanly
def replay_view(ctx: typer.Context, root: RootOpt = Path(".")) -> None:
    """Per backend, regime and policy: SLO violation rate and p95 across seeds."""
    if ctx.invoked_subcommand is not None:
        return
    from syncsafe.serving.view import print_replay_summary

    print_replay_summary(root)


@replay_app.command("run")
@_fails_cleanly
def replay_run(
    backend: Annotated[str, typer.Option("--backend", help="simulator | vllm")],
    regime: RegimeOpt = None,
    params: ParamsOpt = Path("params.yaml"),
    root: RootOpt = Path("."),
) -> None:
    """Stage replay: schedules against the serving backend under each seed's load."""
    from syncsafe.tracking import section_params, stage_run
    from syncsafe.tracking.stages import replay_runs

    p = load_params(params)
    section = section_params(p, ["seeds", "replay"])
    if backend == "simulator":
        from syncsafe.serving.replay import replay_simulator

        for name in _regimes(p, regime):
            with stage_run("replay-simulator", root=root, params_section=section, profile=p.profile,
                           regime=name) as tracker:
                index = replay_simulator(p, name, root)
                tracker.extend(replay_runs("simulator", index, root))
            typer.echo(f"replay simulator {name}: {len(index)} replays")
    elif backend == "vllm":
        from syncsafe.serving.vllm_replay import replay_vllm, server_log_path

        if regime:
            raise ConfigError("--regime does not apply to --backend vllm (replay.vllm.regimes chooses)")
        with stage_run("replay-vllm", root=root, params_section=section, profile=p.profile,
                       system_metrics=True) as tracker:
            index = replay_vllm(p, root)
            tracker.extend(replay_runs("vllm", index, root))
            if server_log_path(root).is_file():
                tracker.log_artifact(server_log_path(root))
        typer.echo(f"replay vllm: {len(index)} replays")
    else:
        raise ConfigError(f"--backend {backend!r}: expected simulator or vllm")


@replay_app.command("index")
@_fails_cleanly
def replay_index(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Stage replay-index: join the replay sets of the regimes, seeds and policies in params into runs/replay/index.csv."""
    from syncsafe.serving.replay import build_replay_index

    typer.echo(f"runs/replay/index.csv: {len(build_replay_index(root, load_params(params)))} replays")


@app.command()
@_fails_cleanly
def live(
    regime: Annotated[list[str] | None, typer.Option("--regime", help="regime(s); default: live.regimes")] = None,
    policy: Annotated[str | None, typer.Option("--policy", help="controller policy; default: live.policy")] = None,
    seed: Annotated[list[int] | None, typer.Option("--seed", help="seed(s); default: live.seeds, else all")] = None,
    stage: Annotated[bool, typer.Option("--stage", help="the DVC stage: nothing but an empty index unless live.enabled")] = False,
    params: ParamsOpt = Path("params.yaml"),
    root: RootOpt = Path("."),
) -> None:
    """The controller as a sidecar beside a real vLLM server on the wall clock, gating real DiLoCo merges."""
    from syncsafe.config import CONTROLLER_POLICIES
    from syncsafe.serving.live import build_live_index, run_live
    from syncsafe.tracking import section_params, stage_run

    p = load_params(params)
    if stage and not p.live.enabled:
        typer.echo(f"live: off (live.enabled: false); {len(build_live_index(root))} runs in runs/live/index.csv")
        return
    name = policy or p.live.policy
    if name not in CONTROLLER_POLICIES:
        raise ConfigError(f"--policy {name!r}: not a controller policy ({list(CONTROLLER_POLICIES)})")
    seeds = seed or p.live.seeds or p.seeds
    for value in seeds:
        if value not in p.seeds:
            raise ConfigError(f"--seed {value}: not in seeds ({p.seeds})")
    regimes = _regimes(p, regime) if regime else p.live.regimes
    section = section_params(p, ["live", "replay.vllm", "replay.slo", "control", "merge", "train"])
    for r in regimes:
        with stage_run("live", root=root, params_section=section, profile=p.profile, regime=r,
                       system_metrics=True) as tracker:
            index = run_live(p, params, r, name, seeds, root)
            for row in index[(index["regime"] == r) & index["seed"].isin(seeds)].itertuples():
                tracker.metrics[f"{row.condition}.seed-{row.seed}.slo_violation_rate"] = float(row.slo_violation_rate)
                tracker.metrics[f"{row.condition}.seed-{row.seed}.n_merges"] = int(row.n_merges)
            tracker.log_artifact(Path(root) / "runs" / "live" / "index.csv")
    typer.echo(f"live {', '.join(regimes)}: {len(index)} runs in runs/live/index.csv")


@app.command("calibrate-fit")
@_fails_cleanly
def calibrate_fit(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Stage calibrate-fit: fit the iteration-level simulator to the server profile and the fit seeds' vLLM replays.

    Writes runs/calibration/ (calibration.json, fit.json, mechanism.json, transfer.csv, report.md); with no
    possible fit, calibration.json holds the shipped defaults (fitted: false) and fit.json says why.
    """
    from syncsafe.analysis.calibration import calibrate_fit_stage
    from syncsafe.tracking import section_params, stage_run

    p = load_params(params)
    with stage_run("calibrate-fit", root=root, params_section=section_params(p, ["replay"]), profile=p.profile) as tracker:
        result = calibrate_fit_stage(p, root)
        tracker.metrics.update({f"calibration.{k}": float(v)
                                for k, v in result.calibration.model_dump(exclude={"fitted"}).items()})
        for path in result.files.values():
            tracker.log_artifact(path)
    c = result.calibration
    state = "fitted" if c.fitted else f"default ({result.fit.get('reason')})"
    typer.echo(f"calibrate-fit: {state}; merge share {c.merge_compute_share:.3g}, iteration {c.iter_base_ms:.3g} ms "
               f"+ {c.decode_ms_per_seq:.3g} ms/seq + {c.prefill_ms_per_token:.3g} ms/prompt token")
    for regime in sorted(result.mechanism.regimes):
        typer.echo(f"{regime:16s} {result.mechanism.describe(regime)}")


@app.command()
@_fails_cleanly
def fidelity(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Stage fidelity: the simulator's calibration judged on the held-out seeds' real replays (runs/fidelity/)."""
    from syncsafe.analysis.calibration import fidelity_stage
    from syncsafe.tracking import section_params, stage_run

    p = load_params(params)
    with stage_run("fidelity", root=root, params_section=section_params(p, ["replay", "analysis"]),
                   profile=p.profile) as tracker:
        result = fidelity_stage(p, root)
        e = result.evidence
        for key in ("p95_rel_error_max", "p95_rel_error_mean", "slo_abs_error_pp_max", "slo_abs_error_pp_mean",
                    "sync_ratio_sim_over_real"):
            if getattr(e, key) is not None:
                tracker.metrics[f"fidelity.{key}"] = float(getattr(e, key))
        for path in result.files.values():
            tracker.log_artifact(path)
    typer.echo(f"fidelity ({result.evidence.calibration}): "
               + ("licensed" if result.evidence.licenses() else "not licensed") + f": {result.evidence.describe()}")


@app.command()
@_fails_cleanly
def calibrate(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """calibrate-fit then fidelity (for orchestrators that run them as one task)."""
    calibrate_fit(params, root)
    fidelity(params, root)


@app.command()
@_fails_cleanly
def analyze(
    runs: Annotated[
        Path | None,
        typer.Option("--runs", help="per-run table (CSV or Parquet) from anywhere; default: this pipeline's replays"),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="output directory; default: reports/ (pipeline mode)")] = None,
    mechanism: Annotated[
        Path | None, typer.Option("--mechanism", help="JSON of real-backend (vLLM) sync and pressure ratios per regime")
    ] = None,
    fidelity: Annotated[
        Path | None, typer.Option("--fidelity", help="JSON of the simulator's held-out fidelity (runs/fidelity/fidelity.json)")
    ] = None,
    primary: Annotated[
        str | None, typer.Option("--primary", help="declared primary test as POLICY@REGIME; default: none (one Holm family)")
    ] = None,
    alpha: Annotated[
        float | None, typer.Option("--alpha", min=0.0, max=1.0, help="family-wise alpha; default: params analysis.alpha")
    ] = None,
    params: ParamsOpt = Path("params.yaml"),
    root: RootOpt = Path("."),
) -> None:
    """Stage analyze: the evidence protocol (sync-excess, envelope, rank test, multiplicity, claim tiers) and the report.

    With --runs: any per-run table (columns regime, policy, seed, draw,
    slo_violation_rate; optional matched_to, backend, eval_loss and latency
    columns) into --out, with optional --mechanism, --fidelity and --primary.
    Without: the pipeline's simulator replays, the calibration's mechanism
    and fidelity evidence and the training outputs into reports/.
    """
    from syncsafe.analysis import FidelityEvidence, MechanismEvidence, analyze_runs

    if runs is not None:
        if out is None:
            raise ConfigError("--out is required with --runs")
        result = analyze_runs(
            runs, out,
            mechanism=_evidence_file(MechanismEvidence, mechanism, "--mechanism"),
            fidelity=_evidence_file(FidelityEvidence, fidelity, "--fidelity"),
            primary=_primary_option(primary),
            alpha=0.05 if alpha is None else alpha,
        )
    else:
        from syncsafe.analysis.pipeline import analyze_pipeline
        from syncsafe.tracking.stages import track_analysis

        if any(x is not None for x in (mechanism, fidelity, primary, out)):
            raise ConfigError("--mechanism, --fidelity, --primary and --out go with --runs; the pipeline reads "
                              "runs/calibration, runs/fidelity and params, and writes reports/")
        p = load_params(params)
        result = analyze_pipeline(p, root, alpha=alpha)
        track_analysis(p, result.policy_table, list(result.files.values()), root)
        out = Path(root) / "reports"
    for rec in result.policy_table.itertuples(index=False):
        typer.echo(f"{rec.regime:16s} {rec.policy:18s} {rec.tier}")
    typer.echo(f"wrote {', '.join(sorted(p.name for p in result.files.values()))} to {out}")


def _evidence_file(model: type, path: Path | None, option: str):  # noqa: ANN202 - returns an instance of `model`
    """Read an evidence JSON for `option`, or None; bad files are bad input naming the option."""
    from pydantic import ValidationError

    if path is None:
        return None
    try:
        return model.read(path)
    except FileNotFoundError:
        raise ConfigError(f"{option} {path}: file not found") from None
    except ValidationError as err:
        raise ConfigError(f"{option} {path}: not a {model.__name__} file: {err}") from None


def _primary_option(text: str | None) -> tuple[str, str] | None:
    if text is None:
        return None
    policy, at, regime = text.partition("@")
    if not (policy and at and regime):
        raise ConfigError(f"--primary {text!r}: expected POLICY@REGIME, e.g. wa_diloco@bursty")
    return policy, regime


@app.command()
@_fails_cleanly
def compare(
    regime: Annotated[str | None, typer.Option("--regime", help="one regime; default: all")] = None,
    metric: Annotated[
        str, typer.Option("--metric", help="tracked metric: slo_violation_rate, n_merges, busy_overlap, ...")
    ] = "slo_violation_rate",
    fmt: Annotated[str, typer.Option("--format", help="md | csv")] = "md",
    stage: Annotated[str | None, typer.Option("--stage", help="stage to read when several log the metric")] = None,
    pipeline_run: Annotated[
        str | None, typer.Option("--pipeline-run", help="one pipeline run id; default: latest run per seed and draw")
    ] = None,
    root: RootOpt = Path("."),
) -> None:
    """Policy x seed table of a tracked metric (mean ± sd, matched-random envelope) from MLflow.

    Reads MLFLOW_TRACKING_URI, else <root>/mlflow.db. Web view of the same runs:
    `mlflow ui --backend-store-uri sqlite:///mlflow.db` in the project root.
    """
    from syncsafe.tracking import TrackingError, compare_table, render_table

    if fmt not in ("md", "csv"):
        raise BadInput(f"--format {fmt!r}: expected md or csv")
    try:
        table = compare_table(regime, metric, stage=stage, pipeline_run=pipeline_run, root=root)
    except TrackingError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(render_table(table, fmt), nl=False)


@app.command()
@_fails_cleanly
def profile(
    name: Annotated[str, typer.Argument(help="cpu | gpu")],
    out: Annotated[Path, typer.Option("--out", help="params file to write")],
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Write params.yaml with a profile's overlay applied (validated first)."""
    import yaml

    from syncsafe import io
    from syncsafe.config import parse_params, read_yaml
    from syncsafe.profiles import apply_profile

    try:
        text = Path(params).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{params}: file not found") from None
    raw = apply_profile(read_yaml(text, str(params)), name)
    parse_params(raw, f"{params} + profile {name}")
    io.write_text(out, yaml.safe_dump(raw, sort_keys=False))
    typer.echo(f"{out}: profile {name}")


@app.command()
@_fails_cleanly
def check(params: ParamsOpt = Path("params.yaml")) -> None:
    """Validate params.yaml and print the resolved settings."""
    p = load_params(params)
    typer.echo(p.model_dump_json(indent=2))


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="syncsafe")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
