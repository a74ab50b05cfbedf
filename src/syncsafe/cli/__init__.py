"""The `syncsafe` command: one subcommand per pipeline stage, plus views.

The stage commands run the same entry functions as `stages/*.py` (through
`syncsafe.pipeline.runner`, declared in `syncsafe.pipeline.declarations`), with
their command-only options on top. Every command validates params.yaml first; a bad key stops it with one line
naming the key and exit code 2, before anything is written. Exit codes: 0 done,
1 a run failed (a server or process died), 2 bad input (`syncsafe.errors.BadInput`:
params, arguments, input files), 3 a lost island.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from syncsafe.cli.common import ParamsOpt, RegimeOpt, RootOpt, run_stage_command as _run
from syncsafe.cli.real_arm import real_arm_app
from syncsafe.cli.studies import study_app
from syncsafe.cli.tuning import headroom, tune
from syncsafe.config import ConfigError, load_params
from syncsafe.errors import BadInput
from syncsafe.pipeline.failures import fails_cleanly as _fails_cleanly

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
schedules_app = typer.Typer(help="Merge schedules: bare `syncsafe schedules` shows the summary view.")
app.add_typer(schedules_app, name="schedules")
replay_app = typer.Typer(help="Serving replay: bare `syncsafe replay` shows the summary view.")
app.add_typer(replay_app, name="replay")
app.add_typer(study_app, name="study")
app.add_typer(real_arm_app, name="real-arm")


@app.command()
@_fails_cleanly
def traces(regime: RegimeOpt = None, params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Stage traces: load timeline and request list per regime and seed."""
    _run("traces", params, root, regime)


@app.command()
@_fails_cleanly
def train(
    regime: RegimeOpt = None,
    policy: Annotated[list[str] | None, typer.Option("--policy", help="policy to train; default: all")] = None,
    seed: Annotated[list[int] | None, typer.Option("--seed", help="seed to train; default: all")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="skip complete runs; continue others from their last merge")] = False,
    params: ParamsOpt = Path("params.yaml"),
    root: RootOpt = Path("."),
    nnodes: Annotated[int, typer.Option(help="hosts of the run: more than 1 runs this one as a node, via torchrun")] = 1,
    nproc_per_node: Annotated[int, typer.Option(help="islands on this host (with --nnodes)")] = 1,
    rdzv_endpoint: Annotated[str, typer.Option(help="HOST[:PORT] of the c10d rendezvous (with --nnodes)")] = "",
    local_addr: Annotated[str, typer.Option(help="this host's address on the hosts' network (with --nnodes)")] = "",
    ifname: Annotated[str, typer.Option(help="network interface gloo uses (with --nnodes)")] = "",
) -> None:
    """Stage train: DiLoCo islands as processes, merges gated by each policy, per regime x policy x seed."""
    nodes = None
    if nnodes > 1 or rdzv_endpoint:
        from syncsafe.diloco.nodes import NodeLaunch

        nodes = NodeLaunch(nnodes, nproc_per_node, rdzv_endpoint, local_addr or None, ifname or None)
    _run("train", params, root, regime, policies=policy, seeds=seed, resume=resume, nodes=nodes)


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
    _run("schedules", params, root, regime)


@schedules_app.command("index")
@_fails_cleanly
def schedules_index(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Stage schedule-index: join the per-regime indexes into runs/schedules/index.csv."""
    _run("schedule-index", params, root)


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
    if backend not in ("simulator", "vllm"):
        raise ConfigError(f"--backend {backend!r}: expected simulator or vllm")
    if backend == "vllm" and regime:
        raise ConfigError("--regime does not apply to --backend vllm (replay.vllm.regimes chooses)")
    _run(f"replay-{backend}", params, root, regime)


@replay_app.command("profile")
@_fails_cleanly
def replay_profile(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Stage profile-vllm: the server profile the real arm plans from (capacity, time scale, noise, engine
    costs). To re-profile inside the pipeline (dvc.lock updated): `syncsafe run --redo profile-vllm`."""
    _run("profile-vllm", params, root)


@replay_app.command("index")
@_fails_cleanly
def replay_index(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Stage replay-index: join the replay sets of the regimes, seeds and policies in params into runs/replay/index.csv."""
    _run("replay-index", params, root)


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
    _run("live", params, root, regime, honor_switch=stage, policy=policy, seeds=seed)


@app.command("calibrate-fit")
@_fails_cleanly
def calibrate_fit(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Stage calibrate-fit: fit the iteration-level simulator to the server profile and the fit seeds' vLLM replays.

    Writes runs/calibration/ (calibration.json, fit.json, mechanism.json, transfer.csv, report.md); with no
    possible fit, calibration.json holds the shipped defaults (fitted: false) and fit.json says why.
    """
    _run("calibrate-fit", params, root)


@app.command()
@_fails_cleanly
def fidelity(params: ParamsOpt = Path("params.yaml"), root: RootOpt = Path(".")) -> None:
    """Stage fidelity: the simulator's calibration judged on the held-out seeds' real replays (runs/fidelity/)."""
    _run("fidelity", params, root)


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
        float | None, typer.Option("--alpha", min=0.0, max=0.1,
                                   help="family-wise alpha (at most 0.1); default: params analysis.alpha")
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
    if runs is None:
        if any(x is not None for x in (mechanism, fidelity, primary, out)):
            raise ConfigError("--mechanism, --fidelity, --primary and --out go with --runs; the pipeline reads "
                              "runs/calibration, runs/fidelity and params, and writes reports/")
        _run("analyze", params, root, alpha=alpha)
        return
    from syncsafe.analysis import FidelityEvidence, MechanismEvidence, analyze_runs
    from syncsafe.pipeline.entries.analyze import summary

    if out is None:
        raise ConfigError("--out is required with --runs")
    settings = _analysis_settings(params)
    result = analyze_runs(
        runs, out,
        mechanism=_evidence_file(MechanismEvidence, mechanism, "--mechanism"),
        fidelity=_evidence_file(FidelityEvidence, fidelity, "--fidelity"),
        primary=_primary_option(primary),
        alpha=settings.alpha if alpha is None else alpha, loss_margin=settings.loss_margin,
        targets=settings.fidelity, gate_ratio_threshold=settings.gate_ratio_threshold,
    )
    typer.echo(summary(result.policy_table, result.files, out))


def _analysis_settings(params: Path):  # noqa: ANN202 - returns AnalysisConfig
    """The protocol's settings (alpha, loss margin, fidelity targets, gate threshold) from `params`, or the
    schema's defaults when there is no params file (a runs table analysed outside a pipeline checkout)."""
    from syncsafe.config import AnalysisConfig

    return load_params(params).analysis if Path(params).is_file() else AnalysisConfig()


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
    study: Annotated[str | None, typer.Option("--study", help="a study: policy x point, mean [95 % CI] over seeds "
                                                  "of --metric gap_closed (default) or slo_pct")] = None,
    root: RootOpt = Path("."),
) -> None:
    """Policy x seed table of a tracked metric (mean ± sd, matched-random envelope) from MLflow.

    Reads MLFLOW_TRACKING_URI, else <root>/mlflow.db. Web view of the same runs:
    `mlflow ui --backend-store-uri sqlite:///mlflow.db` in the project root.
    """
    from syncsafe.tracking import TrackingError, compare_table, render_table

    if fmt not in ("md", "csv"):
        raise BadInput(f"--format {fmt!r}: expected md or csv")
    if study is not None:
        from syncsafe.studies.run import experiment_name
        from syncsafe.tracking.settings import tracking_uri
        from syncsafe.tracking.studies import study_compare_table

        chosen = "gap_closed" if metric == "slo_violation_rate" else metric
        try:
            table = study_compare_table(tracking_uri(root), experiment_name(study), study, chosen)
        except ValueError as err:
            raise BadInput(str(err)) from None
        from syncsafe.analysis.report import markdown_table

        text = table.to_csv(index=False) if fmt == "csv" else markdown_table(list(table.columns), table.values.tolist())
        typer.echo(text.rstrip("\n"))
        return
    from syncsafe.pipeline.declarations import STAGES

    if stage is not None and stage not in {s.name for s in STAGES}:
        raise BadInput(f"--stage {stage!r}: not a stage of this pipeline (have {', '.join(s.name for s in STAGES)})")
    try:
        table = compare_table(regime, metric, stage=stage, pipeline_run=pipeline_run, root=root)
    except TrackingError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    typer.echo(render_table(table, fmt), nl=False)


@app.command()
@_fails_cleanly
def profile(
    name: Annotated[str, typer.Argument(help="cpu | powered | gpu | tiny (overlays in syncsafe/profiles/)")],
    out: Annotated[Path, typer.Option("--out", help="params file to write")],
    params: ParamsOpt = Path("params.yaml"),
) -> None:
    """Write params.yaml with a profile's overlay applied (validated first)."""
    import yaml

    from syncsafe import io
    from syncsafe.profiles import compose_file

    raw = compose_file(params, [name])
    io.write_text(out, yaml.safe_dump(raw, sort_keys=False))
    typer.echo(f"{out}: profile {name}")


@app.command("run")
@_fails_cleanly
def run_pipeline(
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="cores to fill; default: all of them")] = None,
    force: Annotated[bool, typer.Option("--force", help="run every item, not only the stale ones")] = False,
    redo: Annotated[list[str] | None, typer.Option(
        "--redo", help="a stage (or item) to run again though up to date, and what reads from it; e.g. "
                       "--redo profile-vllm re-profiles the server")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="list the items, what each waits for and its cores")] = False,
    root: Annotated[Path, typer.Option("--root", help="the DVC project (its params.yaml and dvc.yaml)")] = Path("."),
) -> None:
    """The pipeline of dvc.yaml, independent stage items side by side where the cores allow; dvc.lock records
    each item, so `dvc repro` afterwards has nothing to do. Per-item logs: logs/run/."""
    from syncsafe.pipeline import parallel

    parallel.check_jobs(jobs)  # before anything is read: `--jobs 0 --dry-run` is refused too
    params = load_params(root / "params.yaml")
    if dry_run:
        items = parallel.plan(params)
        todo = parallel.to_run(items, root, force, redo or [])
        for item in items:
            mark = "run " if item.name in todo else "ok  "
            extra = " alone" if item.alone else f" {item.cores} core{'s' if item.cores > 1 else ''}"
            typer.echo(f"{mark}{item.name}{extra}; after: {', '.join(sorted(item.after)) or '-'}")
        return
    outcome = parallel.run(params, root, jobs, force, echo=typer.echo, redo=redo or [])
    if outcome.failed:
        name, code, tail = outcome.failed
        typer.echo(f"error: stage {name} failed (exit {code}); the end of logs/run/{name}.log:\n{tail}", err=True)
        raise typer.Exit(code)
    total = sum(outcome.walls.values())
    typer.echo(f"ran {len(outcome.walls)} items ({total:.0f} s of stage wall time); dvc.lock records them")


app.command()(tune)
app.command()(headroom)


@app.command("dvc-yaml")
@_fails_cleanly
def dvc_yaml(
    check: Annotated[bool, typer.Option("--check", help="write nothing; exit 1 naming what differs")] = False,
    root: Annotated[Path | None, typer.Option("--root", help="where dvc.yaml and dags/ are; default: this checkout")] = None,
) -> None:
    """Write dvc.yaml and the nightly DAG's stage order (dags/syncsafe_stages.json) from the stage declarations.

    Code deps are paths of this checkout's src/syncsafe (the package imported), relative to it.
    """
    from syncsafe.pipeline import dvc_yaml as render

    root = render.project_root() if root is None else root
    if check:
        diffs = render.differences(root)
        if diffs:
            typer.echo(f"not generated from the declarations (run `syncsafe dvc-yaml`): {', '.join(diffs)}", err=True)
            raise typer.Exit(1)
        typer.echo("dvc.yaml and the DAG's stage order match the declarations")
        return
    for path in render.write(root):
        typer.echo(f"wrote {path}")


@app.command()
@_fails_cleanly
def check(params: ParamsOpt = Path("params.yaml")) -> None:
    """Validate params.yaml and print the resolved settings."""
    p = load_params(params)
    typer.echo(p.model_dump_json(indent=2))


def main() -> None:  # pragma: no cover - console entry point
    app(prog_name="syncsafe")
