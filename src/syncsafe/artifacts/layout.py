"""The on-disk layout: every path under data/, runs/, reports/ (and logs/, models/), spelled once.

No other module writes these names; they import them from here. Two forms:

- **Root-relative** `Path` constants and `*_rel` functions, for what a stage
  declares (DVC `deps`/`outs`) and for the `path` columns the indexes store
  (always relative to the project root, POSIX form)::

      TRACES                      data/traces
      traces_rel("bursty")        data/traces/bursty
      TRAIN                       runs/train
      train_rel("bursty")         runs/train/bursty
      SCHEDULE_SETS               runs/schedule-sets
      schedule_set_rel("bursty")  runs/schedule-sets/bursty
      SCHEDULE_INDEX              runs/schedules/index.csv
      REPLAY_SETS                 runs/replay-sets
      replay_set_rel("simulator", "bursty")   runs/replay-sets/simulator/bursty
      REPLAY_INDEX                runs/replay/index.csv
      CALIBRATION                 runs/calibration
      FITTED_CALIBRATION          runs/calibration/calibration.json
      MECHANISM                   runs/calibration/mechanism.json
      REFITS                      runs/calibration/refits.json
      FIDELITY                    runs/fidelity
      FIDELITY_EVIDENCE           runs/fidelity/fidelity.json
      LIVE, LIVE_INDEX            runs/live, runs/live/index.csv
      REPORTS                     reports
      report_rel(POLICY_TABLE_FILE)   reports/policy_table.csv
      TRAIN_LOGS                  logs/train  (wall-clock facts: not stage outputs)
      study_dir(root, name), study_log_dir(root, name)   reports/studies/<name>, logs/studies/<name>
      VLLM_SERVER_LOG, LIVE_SERVER_LOG   logs/replay-vllm/server.log, logs/live/server.log
      PROFILE_SERVER_LOG          logs/profile-vllm/server.log
      SERVER_PROFILE              runs/server-profile (the profile-vllm stage)
      VLLM_SERVER_FILE, VLLM_PROFILE   runs/server-profile/server.json, runs/server-profile/profile.json
      VLLM_PLAN                   runs/replay-sets/vllm/plan.json
      REAL_BLOCKS                 runs/real-blocks (finished campaign blocks: not a stage output)
      UNTRAINED_MODEL, VLLM_CACHE, TOKENIZER_CACHE   models/serve-untrained, models/vllm-cache, models/tokenizer

- **Root-anchored** functions taking the project `root` first, for code that
  reads or writes: `trace_dir(root, regime, seed)`, `train_run_dir(root,
  regime, policy, seed)`, `schedule_set_dir(root, regime)`,
  `replay_set_dir(root, backend, regime=None)`, `live_dir(root, regime,
  seed)`, `calibration_dir(root)`, `reports_dir(root)`, ...; and `at(root,
  rel)` for any relative path above.

Inside a seed directory (`seed-<S>`, see `seed_dirname`) the file names are
the `*_FILE` constants below. The typed readers and writers of each family
live beside this module (`syncsafe.artifacts.traces`, `.train_runs`, ...).
"""

from __future__ import annotations

import os
from pathlib import Path

PathLike = str | os.PathLike[str]

# --------------------------------------------------------------------------- top-level directories

DATA = Path("data")
RUNS = Path("runs")
REPORTS = Path("reports")
#: Not stage outputs: wall-clock facts and server logs (gitignored).
LOGS = Path("logs")
#: Local model builds and caches (gitignored).
MODELS = Path("models")

# --------------------------------------------------------------------------- file names

INDEX_FILE = "index.csv"
#: Trace sets (data/traces/<regime>/seed-<S>/).
TIMELINE_FILE = "timeline.parquet"
REQUESTS_FILE = "requests.parquet"
TRACE_INFO_FILE = "trace.json"
#: Train runs (runs/train/<regime>/<policy>/seed-<S>/).
METRICS_FILE = "metrics.json"
SCHEDULE_FILE = "schedule.json"
DECISIONS_FILE = "decisions.jsonl"
LOSSES_FILE = "losses.csv"
MERGES_FILE = "merges.csv"
MODEL_DIR = "model"
CHECKPOINTS_DIR = "checkpoints"
TIMING_FILE = "timing.json"
#: Schedule sets: derived schedules sit in one folder per source, decision logs beside the controller's.
DECISIONS_SUFFIX = ".decisions.jsonl"
#: Replays (runs/replay-sets/<backend>/<regime>/seed-<S>/<schedule>/).
SUMMARY_FILE = "summary.json"
SIGNALS_FILE = "signals.parquet"
WINDOWS_FILE = "windows.csv"
SLO_ORACLE_DIR = "slo_oracle"
REPEAT_SUFFIX = "-repeat"
#: vLLM replay set files (runs/replay-sets/vllm/).
REPEATS_FILE = "repeats.csv"
PROFILE_FILE = "profile.json"
#: The server profile (runs/server-profile/): the engine profile (PROFILE_FILE), loads and warm-up (this).
SERVER_FILE = "server.json"
PLAN_FILE = "plan.json"
#: Where the real arm keeps its span-matched draws: runs/replay-sets/vllm/<regime>/seed-<S>/<this>/<controller>-<DDD>/.
SPAN_DRAWS_DIR = "matched_random_span"
SPAN_CADENCE_DIR = "even_cadence_span"
SERVER_METRICS_FILE = "metrics.txt"
#: Calibration (runs/calibration/) and fidelity (runs/fidelity/).
CALIBRATION_FILE = "calibration.json"
MECHANISM_FILE = "mechanism.json"
FIT_FILE = "fit.json"
REFITS_FILE = "refits.json"
TRANSFER_FILE = "transfer.csv"
REPORT_FILE = "report.md"
FIDELITY_FILE = "fidelity.json"
FIDELITY_TABLE_FILE = "fidelity.csv"
CDF_FIGURE_FILE = "cdf.png"
#: Live runs (runs/live/<regime>/seed-<S>/<run>/).
RUN_FILE = "run.json"
#: Reports (reports/).
POLICY_TABLE_FILE = "policy_table.csv"
ENVELOPE_FILE = "envelope.csv"
REPORT_METRICS_FILE = METRICS_FILE
LOSS_CURVES_FILE = "loss_curves.csv"
FIGURES_DIR = "figures"
ENVELOPE_FIGURE_FILE = "slo_by_policy_envelope.png"
#: reports/figures/<regime>_timeline_bursts_vs_merges.png and reports/figures/loss_curves.png.
TIMELINE_FIGURE_SUFFIX = "timeline_bursts_vs_merges.png"
LOSS_FIGURE_FILE = "loss_curves.png"
SERVER_LOG_FILE = "server.log"
#: runs/live/<regime>/seed-S/<run>/logs/: the follower islands' logs of a live run.
RUN_LOGS_DIR = "logs"

# --------------------------------------------------------------------------- root-relative paths

TRACES = DATA / "traces"
TRAIN = RUNS / "train"
SCHEDULE_SETS = RUNS / "schedule-sets"
SCHEDULE_INDEX = RUNS / "schedules" / INDEX_FILE
REPLAY_SETS = RUNS / "replay-sets"
REPLAY_INDEX = RUNS / "replay" / INDEX_FILE
SIMULATOR = "simulator"
VLLM = "vllm"
VLLM_SET = REPLAY_SETS / VLLM
VLLM_INDEX = VLLM_SET / INDEX_FILE
VLLM_REPEATS = VLLM_SET / REPEATS_FILE
VLLM_PLAN = VLLM_SET / PLAN_FILE
#: The real arm's campaign blocks of the last replay-vllm run, and which it kept from an earlier run.
BLOCKS_FILE = "blocks.json"
VLLM_BLOCKS = VLLM_SET / BLOCKS_FILE
#: The real arm's finished campaign blocks (`realarm.blocks`), kept across replay-vllm runs so a stopped campaign
#: resumes; not a stage output (gitignored under runs/), pruned to the current plan's blocks by each finished run.
REAL_BLOCKS = RUNS / "real-blocks"
#: The server profile (the profile-vllm stage), measured once per machine and model, read by the real arm's plan.
SERVER_PROFILE = RUNS / "server-profile"
VLLM_SERVER_FILE = SERVER_PROFILE / SERVER_FILE
VLLM_PROFILE = SERVER_PROFILE / PROFILE_FILE
VLLM_SERVER_METRICS = SERVER_PROFILE / SERVER_METRICS_FILE
CALIBRATION = RUNS / "calibration"
FITTED_CALIBRATION = CALIBRATION / CALIBRATION_FILE
MECHANISM = CALIBRATION / MECHANISM_FILE
FIT = CALIBRATION / FIT_FILE
REFITS = CALIBRATION / REFITS_FILE
CALIBRATION_REPORT = CALIBRATION / REPORT_FILE
FIDELITY = RUNS / "fidelity"
FIDELITY_EVIDENCE = FIDELITY / FIDELITY_FILE
LIVE = RUNS / "live"
LIVE_INDEX = LIVE / INDEX_FILE
TRAIN_LOGS = LOGS / "train"
VLLM_SERVER_LOG = LOGS / "replay-vllm" / SERVER_LOG_FILE
PROFILE_SERVER_LOG = LOGS / "profile-vllm" / SERVER_LOG_FILE
LIVE_SERVER_LOG = LOGS / "live" / SERVER_LOG_FILE
#: Studies (syncsafe.studies, not stage outputs): reports/studies/<name>/{table.csv, seeds.csv, figure.png,
#: report.md, run.json, points/<point>.json}; the queue's logs in logs/studies/<name>/.
STUDIES = REPORTS / "studies"
STUDY_LOGS = LOGS / "studies"
STUDY_TABLE_FILE = "table.csv"
STUDY_SEEDS_FILE = "seeds.csv"
STUDY_FIGURE_FILE = "figure.png"
STUDY_POINTS_DIR = "points"
#: Tuning (syncsafe.tuning): tuned/<regime>/<policy>.yaml (+ .trials.csv), a params overlay a user reads and
#: commits (not a stage output); reports/headroom/<regime>/<policy>.csv, the online-bound split of the gap (the
#: headroom stage's output; `syncsafe headroom` rewrites it with its own knobs, and `dvc repro` restores it).
TUNED = Path("tuned")
HEADROOM = REPORTS / "headroom"
#: Scratch folders of running stages (`<kind>-<pid>-<random>`), reaped at the next stage start once their pid is gone.
SCRATCH = LOGS / "scratch"
UNTRAINED_MODEL = MODELS / "serve-untrained"
VLLM_CACHE = MODELS / "vllm-cache"
#: The tokenizer the train stage builds or caches (reused by every run).
TOKENIZER_CACHE = MODELS / "tokenizer"

SEED_PREFIX = "seed-"


def seed_dirname(seed: int) -> str:
    """`seed-<S>`: the directory of one seed in every per-seed layout."""
    return f"{SEED_PREFIX}{int(seed)}"


def parse_seed_dirname(name: str) -> int:
    """The seed of a `seed-<S>` directory name (ValueError for any other name)."""
    if not name.startswith(SEED_PREFIX):
        raise ValueError(f"{name!r}: not a seed directory ({SEED_PREFIX}<S>)")
    return int(name.removeprefix(SEED_PREFIX))


def at(root: PathLike, rel: PathLike) -> Path:
    """`rel` (a root-relative path from this module or an index's `path` column) under `root`."""
    return Path(root) / rel


def _under(base: Path, *parts: str | None) -> Path:
    for part in parts:
        if part is None:
            break
        base = base / part
    return base


# --------------------------------------------------------------------------- root-relative forms (DVC, indexes)


def traces_rel(regime: str | None = None, seed: int | None = None) -> Path:
    """data/traces[/<regime>[/seed-<S>]]."""
    return _under(TRACES, regime, None if seed is None or regime is None else seed_dirname(seed))


def train_rel(regime: str | None = None, policy: str | None = None, seed: int | None = None) -> Path:
    """runs/train[/<regime>[/<policy>[/seed-<S>]]]."""
    return _under(TRAIN, regime, policy, None if seed is None or policy is None else seed_dirname(seed))


def schedule_set_rel(regime: str | None = None, seed: int | None = None) -> Path:
    """runs/schedule-sets[/<regime>[/seed-<S>]]."""
    return _under(SCHEDULE_SETS, regime, None if seed is None or regime is None else seed_dirname(seed))


def schedule_set_index_rel(regime: str) -> Path:
    """runs/schedule-sets/<regime>/index.csv."""
    return schedule_set_rel(regime) / INDEX_FILE


def schedule_rel(regime: str, seed: int, source: str, policy: str, draw: int | None = None) -> Path:
    """Where a schedule set keeps one schedule, root-relative:
    runs/schedule-sets/<regime>/seed-<S>/ then `no_sync.json` (source no_sync), `<policy>.json` (a
    controller), `<source>/<policy>.json` (offline_bound, even_cadence) or `<source>/<policy>-<DDD>.json`
    (a numbered draw)."""
    seed_dir = schedule_set_rel(regime, seed)
    if source == "no_sync":
        return seed_dir / f"{source}.json"
    if source in ("train", "harness", "live"):
        return seed_dir / f"{policy}.json"
    return seed_dir / source / (f"{policy}.json" if draw is None else f"{policy}-{draw:03d}.json")


def schedule_decisions_rel(regime: str, seed: int, policy: str) -> Path:
    """runs/schedule-sets/<regime>/seed-<S>/<policy>.decisions.jsonl (a harness controller's decision log)."""
    return schedule_set_rel(regime, seed) / f"{policy}{DECISIONS_SUFFIX}"


def replay_set_rel(backend: str | None = None, regime: str | None = None) -> Path:
    """runs/replay-sets[/<backend>[/<regime>]]."""
    return _under(REPLAY_SETS, backend, regime)


def live_rel(regime: str | None = None, seed: int | None = None) -> Path:
    """runs/live[/<regime>[/seed-<S>]]."""
    return _under(LIVE, regime, None if seed is None or regime is None else seed_dirname(seed))


def headroom_rel(regime: str | None = None) -> Path:
    """reports/headroom[/<regime>]."""
    return _under(HEADROOM, regime)


def report_rel(name: str) -> Path:
    """reports/<name> (a file name of this module, or figures/<...>)."""
    return REPORTS / name


# --------------------------------------------------------------------------- root-anchored forms


def trace_dir(root: PathLike, regime: str, seed: int) -> Path:
    """<root>/data/traces/<regime>/seed-<S>/."""
    return at(root, traces_rel(regime, seed))


def train_run_dir(root: PathLike, regime: str, policy: str, seed: int) -> Path:
    """<root>/runs/train/<regime>/<policy>/seed-<S>/."""
    return at(root, train_rel(regime, policy, seed))


def train_run_dirs(root: PathLike, regime: str | None = None) -> list[Path]:
    """Every train run directory under <root>/runs/train (of `regime`, else of all), sorted."""
    base = at(root, train_rel(regime))
    return sorted(base.glob(f"*/{SEED_PREFIX}*" if regime else f"*/*/{SEED_PREFIX}*"))


def train_run_key(run_dir: PathLike) -> tuple[str, str, int]:
    """(regime, policy, seed) of a train run directory."""
    run_dir = Path(run_dir)
    return run_dir.parent.parent.name, run_dir.parent.name, parse_seed_dirname(run_dir.name)


def merge_checkpoint_dir(run_dir: PathLike, merge: int) -> Path:
    """<run_dir>/checkpoints/merge-<K>/: every island's state and the controller's after merge K (resume)."""
    return Path(run_dir) / CHECKPOINTS_DIR / f"merge-{merge:04d}"


def merge_checkpoint_dirs(run_dir: PathLike) -> list[tuple[int, Path]]:
    """(K, <run_dir>/checkpoints/merge-<K>/) of every merge checkpoint on disk, by K."""
    found = (Path(run_dir) / CHECKPOINTS_DIR).glob("merge-*")
    return sorted((int(path.name.split("-")[1]), path) for path in found)


def latest_checkpoint_pointer(run_dir: PathLike) -> Path:
    """<run_dir>/checkpoints/LATEST: the number of the newest complete merge checkpoint."""
    return Path(run_dir) / CHECKPOINTS_DIR / "LATEST"


def island_state_file(checkpoint_dir: PathLike, island: int) -> Path:
    """island-<i>.pt in a merge checkpoint."""
    return Path(checkpoint_dir) / f"island-{island}.pt"


def controller_state_file(checkpoint_dir: PathLike) -> Path:
    """controller.json in a merge checkpoint: the controller's state, the policy's state and the merge log."""
    return Path(checkpoint_dir) / "controller.json"


def train_timing_path(root: PathLike, regime: str, policy: str, seed: int) -> Path:
    """<root>/logs/train/<regime>/<policy>/seed-<S>/timing.json (wall-clock facts, outside the stage outputs)."""
    return Path(root) / TRAIN_LOGS / regime / policy / seed_dirname(seed) / TIMING_FILE


def timing_path(run_dir: PathLike) -> Path:
    """The timing.json of a train run directory <root>/runs/train/<regime>/<policy>/seed-<S>."""
    run_dir = Path(run_dir)
    return train_timing_path(run_dir.parents[4], *train_run_key(run_dir))


def train_log_dir(root: PathLike, regime: str) -> Path:
    """<root>/logs/train/<regime>/ (island logs of a regime's training)."""
    return Path(root) / TRAIN_LOGS / regime


def schedule_set_dir(root: PathLike, regime: str) -> Path:
    """<root>/runs/schedule-sets/<regime>/."""
    return at(root, schedule_set_rel(regime))


def schedule_set_index(root: PathLike, regime: str) -> Path:
    """<root>/runs/schedule-sets/<regime>/index.csv."""
    return at(root, schedule_set_index_rel(regime))


def replay_set_dir(root: PathLike, backend: str, regime: str | None = None) -> Path:
    """<root>/runs/replay-sets/<backend>[/<regime>]/."""
    return at(root, replay_set_rel(backend, regime))


def replay_dir_for_schedule(root: PathLike, backend: str, schedule_rel: PathLike) -> Path:
    """runs/replay-sets/<backend>/<regime>/seed-<S>/<schedule stem>/ for a schedule-set path
    (runs/schedule-sets/<regime>/seed-<S>/.../<stem>.json)."""
    rel = Path(schedule_rel).relative_to(SCHEDULE_SETS).with_suffix("")
    return replay_set_dir(root, backend) / rel


def control_replay_dir(no_sync_dir: PathLike, control: int) -> Path:
    """The replay directory of a seed's `control`-th no-sync control: the no-sync replay's own for the first
    (control 0), `no_sync-repeat<control>` beside it for the later ones."""
    no_sync_dir = Path(no_sync_dir)
    return no_sync_dir if control == 0 else no_sync_dir.with_name(f"{no_sync_dir.name}{REPEAT_SUFFIX}{control}")


def span_draw_dir(root: PathLike, regime: str, seed: int, controller: str, draw: int) -> Path:
    """<root>/runs/replay-sets/vllm/<regime>/seed-<S>/matched_random_span/<controller>-<DDD>/ (a real-arm draw
    with its schedule.json)."""
    return replay_set_dir(root, VLLM, regime) / seed_dirname(seed) / SPAN_DRAWS_DIR / f"{controller}-{draw:03d}"


def span_cadence_dir(root: PathLike, regime: str, seed: int, controller: str) -> Path:
    """<root>/runs/replay-sets/vllm/<regime>/seed-<S>/even_cadence_span/<controller>/ (the real arm's evenly
    spaced schedule with the controller's count in the span, with its schedule.json)."""
    return replay_set_dir(root, VLLM, regime) / seed_dirname(seed) / SPAN_CADENCE_DIR / controller


def slo_oracle_dir(root: PathLike, regime: str, seed: int, controller: str) -> Path:
    """<root>/runs/replay-sets/simulator/<regime>/seed-<S>/slo_oracle/<controller>/."""
    return replay_set_dir(root, SIMULATOR, regime) / seed_dirname(seed) / SLO_ORACLE_DIR / controller


def replay_label(path: PathLike) -> str:
    """What follows seed-<S>/ in a replay path (`fixed_h`, `matched_random/fixed_h-000`)."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if part.startswith(SEED_PREFIX):
            return "/".join(parts[i + 1:])
    return Path(path).name


def live_dir(root: PathLike, regime: str, seed: int) -> Path:
    """<root>/runs/live/<regime>/seed-<S>/."""
    return at(root, live_rel(regime, seed))


def calibration_dir(root: PathLike) -> Path:
    """<root>/runs/calibration/."""
    return at(root, CALIBRATION)


def fidelity_dir(root: PathLike) -> Path:
    """<root>/runs/fidelity/."""
    return at(root, FIDELITY)


def reports_dir(root: PathLike) -> Path:
    """<root>/reports/."""
    return at(root, REPORTS)


def tuned_path(root: PathLike, regime: str, policy: str) -> Path:
    """<root>/tuned/<regime>/<policy>.yaml."""
    return at(root, TUNED / regime / f"{policy}.yaml")


def headroom_path(root: PathLike, regime: str, policy: str) -> Path:
    """<root>/reports/headroom/<regime>/<policy>.csv."""
    return at(root, headroom_rel(regime) / f"{policy}.csv")


def study_dir(root: PathLike, name: str) -> Path:
    """<root>/reports/studies/<name>/."""
    return Path(root) / STUDIES / name


def study_log_dir(root: PathLike, name: str) -> Path:
    """<root>/logs/studies/<name>/."""
    return Path(root) / STUDY_LOGS / name
