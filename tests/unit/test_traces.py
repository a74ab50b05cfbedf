"""Trace generation per regime and the public-trace importers."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from syncsafe.config import RequestShape
from syncsafe.traces.importers import TraceImportError, import_trace
from syncsafe.traces.requests import REQUEST_COLUMNS, generate_requests
from syncsafe.traces.stage import build_traces, load_timeline
from syncsafe.traces.timeline import TIMELINE_COLUMNS, generate_timeline, regime_rng


def test_bursty_windows_follow_period_window_and_phase(params):
    cfg = params.regimes["bursty"]  # period 120, window 30, phase 15
    tl = generate_timeline("bursty", cfg, 0.5, seed=0)
    t = tl["t_s"].to_numpy()
    expected = (t >= 15) & (((t - 15) % 120) < 30)  # bursts over [15, 45) and [135, 165)
    assert (tl["busy"].to_numpy() == expected).all()
    assert t[expected][[0, -1]].tolist() == [15.0, 164.5]
    assert tl.loc[tl["busy"], "arrival_rate"].min() > tl.loc[~tl["busy"], "arrival_rate"].max()


@pytest.mark.parametrize("regime", ["bursty", "steady", "pressure_heavy"])
def test_timeline_contract_and_determinism(params, regime):
    cfg = params.regimes[regime]
    a = generate_timeline(regime, cfg, 0.5, seed=3)
    assert tuple(a.columns) == TIMELINE_COLUMNS
    assert np.allclose(np.diff(a["t_s"]), 0.5) and len(a) == 480
    for col in ("inference_pressure", "network_pressure", "checkpoint_pressure"):
        assert a[col].between(0, 1).all()
    pd.testing.assert_frame_equal(a, generate_timeline(regime, cfg, 0.5, seed=3))
    assert not a.equals(generate_timeline(regime, cfg, 0.5, seed=4))


def test_pressure_heavy_is_more_pressured_than_steady(params):
    heavy = generate_timeline("pressure_heavy", params.regimes["pressure_heavy"], 0.5, 0)
    steady = generate_timeline("steady", params.regimes["steady"], 0.5, 0)
    assert heavy["network_pressure"].mean() > steady["network_pressure"].mean() + 0.3


def test_requests_follow_the_timeline_rate(params):
    cfg = params.regimes["bursty"].model_copy(update={"duration_s": 3600})
    tl = generate_timeline("bursty", cfg, 0.5, 0)
    req = generate_requests(tl, RequestShape(), 0.5, regime_rng("bursty", 0, "requests"))
    assert tuple(req.columns) == REQUEST_COLUMNS
    assert req["arrival_s"].is_monotonic_increasing
    busy_idx = (req["arrival_s"] // 0.5).astype(int)
    in_busy = tl["busy"].to_numpy()[busy_idx]
    busy_rate = in_busy.sum() / (tl["busy"].sum() * 0.5)
    quiet_rate = (~in_busy).sum() / ((~tl["busy"]).sum() * 0.5)
    assert busy_rate == pytest.approx(tl.loc[tl["busy"], "arrival_rate"].mean(), rel=0.1)
    assert quiet_rate == pytest.approx(1.0, rel=0.1)
    assert req["prompt_tokens"].between(1, 256).all() and req["output_tokens"].between(1, 128).all()


def test_clumpier_arrivals_have_more_variance(params):
    tl = generate_timeline("steady", params.regimes["steady"].model_copy(update={"duration_s": 3600}), 0.5, 0)
    counts = {}
    for cv in (1.0, 2.0):
        req = generate_requests(tl, RequestShape(arrival_cv=cv), 0.5, np.random.default_rng(1))
        counts[cv] = np.bincount((req["arrival_s"] // 10).astype(int)).var()
    assert counts[2.0] > 1.5 * counts[1.0]


def test_build_traces_writes_every_seed(params, tmp_path):
    written = build_traces(params, "steady", tmp_path)
    assert len(written) == 2 * len(params.seeds)
    tl = load_timeline(tmp_path, "steady", 1)
    assert len(tl) == 480
    assert not list(tmp_path.rglob("*.tmp")), "no temp files left behind"
    with pytest.raises(FileNotFoundError, match="run the traces stage"):
        load_timeline(tmp_path, "bursty", 0)


# ----------------------------------------------------------------- importers


def test_azure_import(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:47.0000000,879,20\n"
                    "2023-11-16 18:15:50.9951690,396,109\n")
    req = import_trace("azure", path)
    assert tuple(req.columns) == REQUEST_COLUMNS
    assert req["arrival_s"].tolist() == pytest.approx([0.0, 0.31941, 4.314579])
    assert req["prompt_tokens"].tolist() == [374, 879, 396]


def test_burstgpt_import_drops_failed_requests(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n"
                    "45,ChatGPT,1087,0,1087,Conversation log\n"
                    "118,GPT-4,417,276,693,Conversation log\n")
    req = import_trace("burstgpt", path)
    assert req["arrival_s"].tolist() == [0.0, 113.0]
    assert req["output_tokens"].tolist() == [18, 276]


def test_mooncake_import_converts_ms(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    rows = [{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [0, 1]},
            {"timestamp": 1500, "input_length": 6472, "output_length": 26, "hash_ids": [2]}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    req = import_trace("mooncake", path)
    assert req["arrival_s"].tolist() == [0.0, 1.5]
    assert req["prompt_tokens"].tolist() == [6955, 6472]


@pytest.mark.parametrize(
    ("fmt", "name", "content", "message"),
    [
        ("azure", "a.csv", "timestamp,ContextTokens,GeneratedTokens\n1,2,3\n", r"missing column\(s\) \['TIMESTAMP'\]"),
        ("azure", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,2,3\n", "'TIMESTAMP' row 0: not a finite time"),
        ("burstgpt", "b.csv", "Timestamp,Request_tokens,Response tokens\n1,2,3\n", r"missing column\(s\) \['Request tokens'\]"),
        ("burstgpt", "b.csv", "Timestamp,Request tokens,Response tokens\n1,x,3\n", "'Request tokens' row 0: token count is not a number"),
        ("mooncake", "m.jsonl", '{"timestamp": 1, "input_len": 2, "output_length": 3}\n', r"missing column\(s\) \['input_length'\]"),
        ("mooncake", "m.jsonl", "not json\n", "cannot read as JSON lines"),
        ("sharegpt", "s.csv", "a\n1\n", "unknown trace format"),
    ],
)
def test_importers_fail_clearly_on_bad_files(tmp_path, fmt, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TraceImportError, match=message):
        import_trace(fmt, path)


def test_importer_names_the_file_on_a_wrong_header(tmp_path):
    path = tmp_path / "wrong.csv"
    path.write_text("time,in,out\n1,2,3\n")
    with pytest.raises(TraceImportError) as err:
        import_trace("azure", path)
    assert str(path) in str(err.value) and "TIMESTAMP" in str(err.value)


def test_import_missing_file(tmp_path):
    with pytest.raises(TraceImportError, match="file not found"):
        import_trace("azure", tmp_path / "none.csv")
