"""`kind: trace` regimes: segments, derived timelines, token clipping and bad trace files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from syncsafe.cli import app
from syncsafe.config import TraceRegime, parse_params
from syncsafe.traces.importers import import_trace
from syncsafe.traces.requests import REQUEST_COLUMNS
from syncsafe.traces.stage import TRACE_INFO, build_traces, load_timeline, trace_dir
from syncsafe.traces.timeline import TIMELINE_COLUMNS
from syncsafe.traces.trace_regime import (
    TraceLevels,
    build_trace_sets,
    clip_tokens,
    derive_timeline,
    scale_output,
    scale_rate,
    token_limit,
)

AZURE = Path(__file__).resolve().parents[2] / "assets" / "traces" / "azure_llm_2023_conv.parquet"


def _with_regime(raw: dict, **regime) -> dict:
    raw["regimes"]["tr"] = {"kind": "trace", "duration_s": 240, **regime}
    return raw


def test_shipped_azure_trace_is_the_published_sample():
    req = import_trace("azure", AZURE)
    assert len(req) == 19366
    assert req["arrival_s"].iloc[-1] == pytest.approx(3501.72, abs=0.01)
    assert req["prompt_tokens"].median() == 1020 and req["output_tokens"].max() == 1000
    assert (AZURE.parent / "README.md").read_text().count("CC BY 4.0") >= 1


def test_segments_match_the_source_file_per_seed(raw_params):
    raw_params["seeds"] = list(range(10))
    params = parse_params(_with_regime(raw_params, path=str(AZURE), format="azure", duration_s=600,
                                       offset_s=30, stride_s=300))
    source = import_trace("azure", AZURE)
    t = source["arrival_s"].to_numpy()
    sets = build_trace_sets(params, "tr")
    assert sorted(sets) == list(range(10))
    for seed, cut in sets.items():
        start = 30 + 300 * seed
        inside = source[(t >= start) & (t < start + 600)]
        req = cut.requests
        assert tuple(req.columns) == REQUEST_COLUMNS
        assert len(req) == len(inside) == cut.info["n_requests"]
        assert req["arrival_s"].min() >= 0 and req["arrival_s"].max() < 600
        np.testing.assert_allclose(req["arrival_s"].to_numpy(), inside["arrival_s"].to_numpy() - start)
        assert (cut.info["segment_start_s"], cut.info["segment_end_s"]) == (start, start + 600)
        assert len(cut.timeline) == 1200 and tuple(cut.timeline.columns) == TIMELINE_COLUMNS
        # clipped count: requests of the segment whose prompt + output exceed the model's 512 tokens
        over = (inside["prompt_tokens"] + inside["output_tokens"]) > 512
        assert cut.info["n_clipped"] == int(over.sum()) > 0
        assert ((req["prompt_tokens"] + req["output_tokens"]) <= 512).all()
        assert (req["prompt_tokens"] >= 1).all() and (req["output_tokens"] >= 1).all()


def test_stride_defaults_to_duration(raw_params):
    params = parse_params(_with_regime(raw_params, path=str(AZURE), format="azure", duration_s=100))
    assert params.regimes["tr"].segment_stride_s == 100
    assert [c.info["segment_start_s"] for c in build_trace_sets(params, "tr").values()] == [0, 100]


def test_clip_tokens_keeps_proportion_and_counts():
    req = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0, 3.0], "prompt_tokens": [100, 900, 10, 5000],
                        "output_tokens": [20, 300, 502, 1]})
    out, clipped = clip_tokens(req, 512)
    assert clipped.tolist() == [False, True, False, True]
    assert out["output_tokens"].tolist() == [20, 128, 502, 1]  # 300 * 512 // 1200 = 128; at least 1
    assert out["prompt_tokens"].tolist() == [100, 384, 10, 511]
    assert req["prompt_tokens"].tolist() == [100, 900, 10, 5000], "input left as it was"


def test_token_limit_rule(params):
    assert token_limit(params) == 512  # --max-model-len 512 in the shipped server_args
    args = ["--dtype", "float32", "--max-model-len=300"]
    assert token_limit(params.model_copy(update={"replay": params.replay.model_copy(update={
        "vllm": params.replay.vllm.model_copy(update={"server_args": args})})})) == 300
    bare = params.replay.vllm.model_copy(update={"server_args": ["--dtype", "float32"]})
    assert token_limit(params.model_copy(update={"replay": params.replay.model_copy(update={"vllm": bare})})) == \
        params.train.model.max_position_embeddings


def test_rate_scale_thins_and_replicates_deterministically():
    req = pd.DataFrame({"arrival_s": np.arange(4000) * 0.1, "prompt_tokens": 10, "output_tokens": 5})
    half = scale_rate(req, 0.5, "r")
    assert 1850 < len(half) < 2150 and half["arrival_s"].is_monotonic_increasing
    pd.testing.assert_frame_equal(half, scale_rate(req, 0.5, "r"))
    double = scale_rate(req, 2.0, "r")
    assert len(double) == 8000 and (double["arrival_s"].to_numpy()[::2] == req["arrival_s"].to_numpy()).all()


def test_output_scale_shortens_answers_and_keeps_every_arrival(raw_params, tmp_path):
    req = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0], "prompt_tokens": [10, 20, 30], "output_tokens": [1, 10, 101]})
    scaled = scale_output(req, 0.25)
    assert scaled["output_tokens"].tolist() == [1, 2, 25], "rounded, at least one token"
    assert scaled[["arrival_s", "prompt_tokens"]].equals(req[["arrival_s", "prompt_tokens"]])
    assert scale_output(req, 1.0) is req
    full = build_traces(parse_params(_with_regime(raw_params, path=str(AZURE), format="azure")), "tr", tmp_path / "a")
    short = build_traces(parse_params(_with_regime(raw_params, path=str(AZURE), format="azure", output_scale=0.25)),
                         "tr", tmp_path / "b")
    assert len(full) == len(short)
    for seed in parse_params(raw_params).seeds:
        a = pd.read_parquet(trace_dir(tmp_path / "a", "tr", seed) / "requests.parquet")
        b = pd.read_parquet(trace_dir(tmp_path / "b", "tr", seed) / "requests.parquet")
        assert a["arrival_s"].equals(b["arrival_s"]), "the arrival pattern stays the trace's"
        assert b["output_tokens"].mean() < 0.4 * a["output_tokens"].mean()
        info = json.loads((trace_dir(tmp_path / "b", "tr", seed) / TRACE_INFO).read_text())
        assert info["output_scale"] == 0.25


def _hand_regime(**extra) -> TraceRegime:
    return TraceRegime(kind="trace", path="hand.csv", duration_s=5.0, smooth_s=2.0, network_base=0.1,
                       checkpoints_per_hour=0.0, **extra)


def test_derived_timeline_on_a_hand_made_trace():
    # step 0.5 s, trailing window 2 s = 4 steps; arrivals (tokens): 0.1 (100), 0.2 (100), 1.1 (400), 3.6 (200)
    seg = pd.DataFrame({"arrival_s": [0.1, 0.2, 1.1, 3.6], "prompt_tokens": [60, 60, 300, 150],
                        "output_tokens": [40, 40, 100, 50]})
    levels = TraceLevels(busy_level=150.0, pressure_ref=200.0)
    tl = derive_timeline(seg, _hand_regime(), 0.5, levels, "hand", 0)
    assert tl["t_s"].tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5]
    # arrivals per step: [2,0,1,0,0,0,0,1,0,0]; trailing mean over min(k+1, 4) steps of 0.5 s
    np.testing.assert_allclose(tl["arrival_rate"], [4.0, 2.0, 2.0, 1.5, 0.5, 0.5, 0.0, 0.5, 0.5, 0.5])
    # tokens per step: [200,0,400,0,0,0,0,200,0,0] -> load (tokens/s)
    load = np.array([400.0, 200.0, 400.0, 300.0, 200.0, 200.0, 0.0, 100.0, 100.0, 100.0])
    np.testing.assert_allclose(tl["inference_pressure"], np.minimum(load / 200.0, 1.0))
    assert tl["busy"].tolist() == (load > 150.0).tolist()
    np.testing.assert_allclose(tl["network_pressure"], 0.1 + 0.25 * (load > 150.0))
    assert (tl["checkpoint_pressure"] == 0.05).all()


def test_derived_timeline_is_causal():
    rng = np.random.default_rng(0)
    seg = pd.DataFrame({"arrival_s": np.sort(rng.uniform(0, 60, 300)), "prompt_tokens": rng.integers(1, 400, 300),
                        "output_tokens": rng.integers(1, 100, 300)})
    cfg = _hand_regime().model_copy(update={"duration_s": 60.0, "smooth_s": 10.0})
    levels = TraceLevels(busy_level=1500.0, pressure_ref=3000.0)
    base = derive_timeline(seg, cfg, 0.5, levels, "hand", 0)
    late = seg["arrival_s"] >= 31.0
    changed = seg.copy()
    changed.loc[late, "prompt_tokens"] *= 7
    changed = pd.concat([changed, pd.DataFrame({"arrival_s": [40.0] * 50, "prompt_tokens": 300, "output_tokens": 9})])
    after = derive_timeline(changed.sort_values("arrival_s"), cfg, 0.5, levels, "hand", 0)
    before = base["t_s"] <= 30.5
    pd.testing.assert_frame_equal(base[before], after[before])
    assert not base.equals(after)


def test_traces_stage_writes_the_trace_set(params_file, raw_params, tmp_path):
    raw = _with_regime(raw_params, path=str(AZURE), format="azure", rate_scale=0.25)
    params = parse_params(raw)
    written = build_traces(params, "tr", tmp_path)
    assert len(written) == 3 * len(params.seeds)
    info = json.loads((trace_dir(tmp_path, "tr", 1) / TRACE_INFO).read_text())
    assert info["token_limit"] == 512 and info["segment_start_s"] == 240 and info["rate_scale"] == 0.25
    req = pd.read_parquet(trace_dir(tmp_path, "tr", 1) / "requests.parquet")
    assert len(req) == info["n_requests"] and 0 < info["n_clipped"] <= len(req)
    assert len(load_timeline(tmp_path, "tr", 1)) == 480


# ----------------------------------------------------------------- bad trace files through the CLI

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD_ROWS = "".join(f"{pd.Timestamp('2023-11-16 18:15:00') + pd.Timedelta(seconds=s)},100,20\n" for s in range(0, 100, 2))


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (HEADER, ["no rows"]),
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:00,3\n", ["missing column", "GeneratedTokens"]),
        (HEADER + "2023-11-16 18:15:05,1,1\n2023-11-16 18:15:01,1,1\n", ["'TIMESTAMP' row 1", "backwards"]),
        (HEADER + "2023-11-16 18:15:05,1,1\nnot-a-date,1,1\n", ["'TIMESTAMP' row 1", "not a finite time"]),
        (HEADER + "2023-11-16 18:15:05,,1\n", ["'ContextTokens' row 0", "not a number"]),
        (HEADER + "2023-11-16 18:15:05,1,inf\n", ["'GeneratedTokens' row 0", "infinite"]),
        (HEADER + "2023-11-16 18:15:05,-4,1\n", ["'ContextTokens' row 0", "negative"]),
        (HEADER + "2023-11-16 18:15:05,4.5,1\n", ["'ContextTokens' row 0", "not a whole number"]),
    ],
)
def test_bad_azure_file_exits_2_naming_file_and_column(tmp_path, raw_params, content, words):
    bad = tmp_path / "bad.csv"
    bad.write_text(content)
    _expect_bad_input(tmp_path, _with_regime(raw_params, path=str(bad), format="azure", duration_s=30),
                      [str(bad), *words])
    out = tmp_path / "out" / "requests.parquet"
    result = CliRunner().invoke(app, ["import-trace", "azure", str(bad), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert not out.parent.exists()


def test_negative_time_in_a_request_table(tmp_path, raw_params):
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,prompt_tokens,output_tokens\n-1.5,3,4\n2,3,4\n")
    _expect_bad_input(tmp_path, _with_regime(raw_params, path=str(bad), format="requests", duration_s=30),
                      [str(bad), "'arrival_s' row 0", "negative time"])


def test_segment_past_the_trace_end_names_seed_and_length(tmp_path, raw_params):
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + GOOD_ROWS)  # 98 s long
    raw_params["seeds"] = [0, 1, 2]
    _expect_bad_input(tmp_path, _with_regime(raw_params, path=str(trace), format="azure", duration_s=40),
                      [str(trace), "seed 2", "passes the trace end", "98.0 s"])


def test_empty_segment_names_the_seed(tmp_path, raw_params):
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + "2023-11-16 18:15:00,1,1\n2023-11-16 18:16:40,1,1\n")  # a 100 s hole
    raw_params["seeds"] = [0, 1]
    _expect_bad_input(tmp_path, _with_regime(raw_params, path=str(trace), format="azure", duration_s=30, offset_s=10),
                      [str(trace), "seed 0", "holds no request"])


def _expect_bad_input(tmp_path: Path, raw: dict, words: list[str]) -> None:
    params_file = tmp_path / "params.yaml"
    params_file.write_text(yaml.safe_dump(raw))
    root = tmp_path / "project"
    result = CliRunner().invoke(app, ["traces", "--regime", "tr", "--params", str(params_file), "--root", str(root)])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and "Traceback" not in line, line
    for word in words:
        assert word in line, (word, line)
    assert not root.exists() or not any(p.is_file() for p in root.rglob("*")), "nothing written"
