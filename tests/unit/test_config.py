"""params.yaml validation: every impossible value names its key and writes nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel
from typer.testing import CliRunner

from syncsafe.cli import app
from syncsafe.config import ConfigError, load_params, parse_params
from syncsafe.profiles import available, compose_file, merge_patch


def test_shipped_params_are_valid(repo_root):
    p = load_params(repo_root / "params.yaml")
    assert p.profile == "cpu"
    assert set(p.regimes) == {"bursty", "steady", "pressure_heavy", "azure_conv"}
    bursty = p.regimes["bursty"]
    assert (bursty.period_s, bursty.window_s) == (120, 30)
    azure = p.regimes["azure_conv"]
    assert (azure.kind, azure.format, azure.duration_s, azure.segment_stride_s) == ("trace", "azure", 600, 300)
    assert (repo_root / azure.path).is_file()


def _mutate(raw: dict, dotted: str, value) -> dict:
    node = raw
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node[key]
    node[leaf] = value
    return raw


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("control.bogus", 1, "control.bogus: unknown key"),
        ("merge.window_s", "eight", "merge.window_s: Input should be a valid number"),
        ("seeds", "zero", "seeds: Input should be a valid list"),
        ("control.min_h", 90, "min_h (90) must be <= max_h (16)"),
        ("merge.window_s", 0, "merge.window_s: Input should be greater than 0"),
        ("merge.window_s", -4, "merge.window_s: Input should be greater than 0"),
        ("regimes.bursty.window_s", 200, "regimes.bursty: window_s (200.0) must not be longer than period_s (120.0)"),
        ("regimes.bursty.window_s", 0, "regimes.bursty.window_s: Input should be greater than 0"),
        ("regimes.bursty.kind", "spiky", "regimes.bursty: Input tag 'spiky'"),
        ("merge.min_gap_s", 30, "merge.min_gap_s (30.0) must be <="),
        ("merge.window_s", 7.3, "merge.window_s (7.3) must be a multiple of traces.step_s"),
        ("profile", "tpu", "profile: 'tpu' does not match the overlays these params hold ([], label 'cpu')"),
        # a misspelt regime in a per-regime pin would leave the regime it meant unpinned
        ("replay.vllm.time_scale", {"burst": 2.5}, "replay.vllm.time_scale: regime(s) ['burst'] not among the regimes"),
        ("replay.vllm.span_s", {"bursty": 100, "stedy": 90}, "replay.vllm.span_s: regime(s) ['stedy'] not among"),
    ],
)
def test_bad_value_names_the_key(raw_params, key, value, expected):
    with pytest.raises(ConfigError) as err:
        parse_params(_mutate(raw_params, key, value))
    assert expected in str(err.value)


def test_unknown_top_level_key(raw_params):
    raw_params["regime"] = {}
    with pytest.raises(ConfigError, match=r"params.yaml: regime: unknown key"):
        parse_params(raw_params)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_params(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("key", "value"),
    [("control.min_h", 90), ("regimes.bursty.window_s", -1), ("regimes.bursty.window_s", 500), ("typo", 1)],
)
def test_cli_stops_with_exit_2_and_writes_nothing(tmp_path: Path, raw_params, key, value):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(_mutate(raw_params, key, value)))
    root = tmp_path / "project"
    root.mkdir()
    result = CliRunner().invoke(app, ["traces", "--params", str(params), "--root", str(root)])
    assert result.exit_code == 2
    assert key.split(".")[-1] in result.output
    assert result.output.count("\n") == 1, "one clear line"
    assert list(root.iterdir()) == []


def test_cli_rejects_unknown_regime(params_file, tmp_path):
    result = CliRunner().invoke(app, ["traces", "--regime", "nope", "--params", str(params_file), "--root", str(tmp_path)])
    assert result.exit_code == 2
    assert "--regime 'nope'" in result.output


def test_gpu_profile_overlay_is_valid(repo_root, tmp_path, cli):
    out = tmp_path / "params.gpu.yaml"
    cli("profile", "gpu", "--params", repo_root / "params.yaml", "--out", out)
    gpu = load_params(out)
    assert gpu.profile == "gpu" and gpu.train.islands == 8 and len(gpu.seeds) == 10
    assert gpu.regimes["bursty"].period_s == 120  # untouched keys keep the cpu values
    assert gpu.replay.vllm.budget_s == 3600
    assert all(gpu.replay.vllm.pinned_time_scale(r) is None and gpu.replay.vllm.pinned_span_s(r) is None
               for r in gpu.regimes)  # the load is set by the GPU node's capacity, the span by power
    assert gpu.train.hub.model.startswith("HuggingFaceTB/")


# --------------------------------------------------------------------------- profiles


def test_every_profile_composes_to_valid_params_labelled_by_its_overlays(repo_root):
    assert available() == ["cpu", "gpu", "powered", "tiny"]
    assert compose_file(repo_root / "params.yaml", ["cpu"]) == yaml.safe_load((repo_root / "params.yaml").read_text())
    for name in ("gpu", "powered", "tiny"):
        p = parse_params(compose_file(repo_root / "params.yaml", [name]))
        assert p.profile == name and p.overlays == [name]


def test_the_three_sizes_pin_their_real_plans_and_powered_holds_the_papers_standard(repo_root):
    from syncsafe.realarm.design import vllm_regimes, vllm_seed_split

    for name in ("cpu", "powered", "tiny"):
        p = parse_params(compose_file(repo_root / "params.yaml", [name]))
        for regime in vllm_regimes(p):  # the same plan on every machine: time scale and span from params
            assert p.replay.vllm.pinned_time_scale(regime) and p.replay.vllm.pinned_span_s(regime), (name, regime)
    cpu = parse_params(compose_file(repo_root / "params.yaml", ["cpu"]))
    fit, held = vllm_seed_split(cpu)
    assert vllm_regimes(cpu) == [cpu.analysis.primary.regime] and len(fit) >= 1 and len(held) >= 1
    powered = parse_params(compose_file(repo_root / "params.yaml", ["powered"]))
    v = powered.replay.vllm
    assert set(vllm_regimes(powered)) >= {"bursty", "azure_conv"} and len(v.seeds or []) >= 4 and v.draws >= 3
    assert v.min_requests >= 300 and v.min_merge_active >= 30


def test_gpu_profile_spells_where_and_what_it_trains(repo_root):
    cpu = load_params(repo_root / "params.yaml")
    gpu = parse_params(compose_file(repo_root / "params.yaml", ["gpu"]))
    assert (cpu.train.device, cpu.train.source) == ("cpu", "builtin")
    assert (gpu.train.device, gpu.train.source) == ("cuda", "hub")


def test_tiny_profile_is_one_regime_one_seed_and_a_small_corpus(tiny_params):
    p = load_params(tiny_params)
    assert p.profile == "tiny" and p.overlays == ["tiny"]
    assert list(p.regimes) == ["bursty"] and p.regimes["bursty"].duration_s == 120
    assert p.regimes["bursty"].period_s == 120  # untouched keys keep the base values
    assert p.seeds == [0] and p.control.policies == ["fixed_h", "wa_diloco"]
    assert (p.train.corpus_bytes, p.train.eval_batches, p.schedules.random_draws) == (300_000, 2, 2)


def test_merge_patch_merges_mappings_removes_nulls_and_replaces_the_rest():
    base = {"a": {"x": 1, "y": 2}, "b": [1, 2], "c": 3}
    assert merge_patch(base, {"a": {"y": 5, "z": 6}, "b": [9], "c": None}) == {"a": {"x": 1, "y": 5, "z": 6}, "b": [9]}
    assert base == {"a": {"x": 1, "y": 2}, "b": [1, 2], "c": 3}  # the base is left alone


@pytest.mark.parametrize("label", ["gpu", "tiny", "cpu+gpu"])
def test_a_hand_set_profile_label_is_refused_not_a_hybrid(repo_root, label):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["profile"] = label  # what `dvc exp run --set-param profile=gpu` does
    with pytest.raises(ConfigError, match=rf"profile: '{re.escape(label)}' does not match .* `syncsafe profile"):
        parse_params(raw)


def test_a_composed_profile_relabelled_by_hand_is_refused(repo_root):
    raw = compose_file(repo_root / "params.yaml", ["gpu"])
    raw["profile"] = "cpu"
    with pytest.raises(ConfigError, match=r"profile: 'cpu' does not match the overlays these params hold \(\['gpu'\]"):
        parse_params(raw)


def test_set_param_profile_on_the_cli_is_one_line_exit_2(repo_root, tmp_path):
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    raw["profile"] = "gpu"
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["check", "--params", str(params)])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "syncsafe profile gpu" in result.output


@pytest.mark.parametrize(
    ("names", "expected"),
    [(["tpu"], "profile 'tpu': expected one of ['cpu', 'gpu', 'powered', 'tiny']"),
     (["tiny", "tiny"], "each profile may be applied once")],
)
def test_unknown_or_repeated_profile_is_refused(repo_root, names, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        compose_file(repo_root / "params.yaml", names)


def test_composed_params_are_not_composed_again(repo_root, tmp_path, cli):
    out = tmp_path / "params.gpu.yaml"
    cli("profile", "gpu", "--params", repo_root / "params.yaml", "--out", out)
    with pytest.raises(ConfigError, match=r"already composed from \['gpu'\].*compose from the base params.yaml"):
        compose_file(out, ["tiny"])
    assert compose_file(out, ["cpu"]) == yaml.safe_load(out.read_text())  # cpu: no overlay, nothing to refuse
    assert compose_file(out, ["gpu"]) == yaml.safe_load(out.read_text())  # already the gpu profile: unchanged


def test_overlays_stack_in_order_with_a_joined_label(repo_root):
    p = parse_params(compose_file(repo_root / "params.yaml", ["gpu", "tiny"]))
    assert p.profile == "gpu+tiny" and p.overlays == ["gpu", "tiny"]
    assert p.train.source == "hub" and p.seeds == [0] and p.train.eval_batches == 2  # tiny wins where both set


def test_no_code_branches_on_the_profile_label():
    """`profile` is a label: behaviour follows explicit settings (train.device, train.source, ...)."""
    repo = Path(__file__).resolve().parents[2]
    pattern = re.compile(r"""\.profile\s*(==|!=|in|not in)\s*[("'\[{]|["']\s*(==|!=)\s*\w+\.profile\b|uses_cuda\(""")
    files = [*(repo / "src" / "syncsafe").rglob("*.py"), *(repo / "dags").glob("*.py"), *(repo / "stages").glob("*.py")]
    hits = [f"{path.relative_to(repo)}:{n}: {line.strip()}" for path in sorted(files)
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert hits == []


# --------------------------------------------------------------------------- defaults


def _spelled_differently(model: BaseModel, spelled: dict, path: str) -> list[str]:
    """Keys params.yaml spells whose value differs from the schema default (recursing into sections)."""
    out = []
    for name, field in type(model).model_fields.items():
        if name not in spelled:
            continue
        value, key = getattr(model, name), f"{path}{name}"
        if isinstance(value, BaseModel):
            out += _spelled_differently(value, spelled[name], key + ".")
        elif not field.is_required() and name != "regimes":  # each regime is data, not a setting with a default
            default = field.get_default(call_default_factory=True)
            if default != value:
                out.append(f"{key}: schema default {default!r}, params.yaml {value!r}")
    return out


def test_params_yaml_spells_the_schema_defaults(repo_root):
    """One source of truth: a key params.yaml spells holds the schema default (no silent drift between them)."""
    raw = yaml.safe_load((repo_root / "params.yaml").read_text())
    assert _spelled_differently(parse_params(raw), raw, "") == []


def test_an_overlay_mapping_over_a_single_value_is_a_new_mapping_without_its_nulls():
    # params.yaml pins one time scale for every regime; an overlay's {bursty: null} must leave no pin, not a null
    assert merge_patch({"time_scale": 2.5}, {"time_scale": {"bursty": None, "steady": 1.0}}) == \
        {"time_scale": {"steady": 1.0}}
    assert merge_patch({"time_scale": {"bursty": 2.5}}, {"time_scale": {"bursty": None}}) == {"time_scale": {}}
