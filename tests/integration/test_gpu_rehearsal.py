"""The gpu profile's path, rehearsed on CPU: everything but CUDA and NCCL.

A tiny Llama is built with transformers and saved as a local Hugging Face
model directory, a local dataset directory holds JSONL documents, and the gpu
profile stacked with the tiny one (with `train.device: cpu`, small sizes) runs traces -> train (hub
model and dataset path, islands over gloo) -> export -> schedules -> a real
vLLM CPU replay of the trained export. Hub ids resolve through the local
Hugging Face cache; an id that is not there is one clear line naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from vllm_env import VLLM_PYTHON, eager, require_vllm_python
from syncsafe.cli import app
from syncsafe.config import VllmReplay, parse_params
from syncsafe.diloco.hub import local_island_texts, resolve_model
from syncsafe.errors import BadInput
from syncsafe.profiles import compose_file

REPO = Path(__file__).resolve().parents[2]


def _hub_model(directory: Path) -> Path:
    """A tiny randomly initialised Llama and its tokenizer, saved like a hub snapshot."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from syncsafe.diloco.corpus import build_stdlib_corpus
    from syncsafe.diloco.tokenizer import load_or_build_tokenizer

    corpus = build_stdlib_corpus(max_bytes=200_000)
    tokenizer = load_or_build_tokenizer(directory / "tokenizer-cache", corpus.train_texts(), corpus.fingerprint,
                                        vocab_size=400)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=1,
                         num_key_value_heads=1, intermediate_size=128, max_position_embeddings=512,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    model_dir = directory / "tiny-llama"
    LlamaForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return model_dir


def _dataset(directory: Path, n_docs: int = 60) -> Path:
    from syncsafe.diloco.corpus import build_stdlib_corpus

    texts = build_stdlib_corpus(max_bytes=200_000).train_texts()[:n_docs]
    directory.mkdir(parents=True)
    (directory / "part-000.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return directory


def test_hub_ids_resolve_through_the_local_cache_or_fail_naming_the_id(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    snapshot = cache / "models--SomeOrg--tiny" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--SomeOrg--tiny" / "refs").mkdir()
    (cache / "models--SomeOrg--tiny" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert Path(resolve_model("SomeOrg/tiny")) == snapshot
    with pytest.raises(BadInput, match=r"train.hub.model: hub model 'SomeOrg/absent' is not in the local Hugging Face cache"):
        resolve_model("SomeOrg/absent")
    with pytest.raises(BadInput, match=r"replay.vllm.model: .* neither a model directory nor a hub id"):
        resolve_model("./no/such/dir", "replay.vllm.model")


def test_gpu_profile_replay_of_an_absent_hub_model_exits_2_naming_it(tmp_path, monkeypatch):
    """The replay used to read the hub id as a local path (FileNotFoundError): now one line, exit 2."""
    from huggingface_hub import constants

    from syncsafe.realarm.arm import served_model

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    raw = compose_file(REPO / "params.yaml", ["gpu"])
    raw["train"]["hub"]["model"] = "SomeOrg/never-downloaded"
    with pytest.raises(BadInput, match="'SomeOrg/never-downloaded' is not in the local Hugging Face cache"):
        served_model(parse_params(raw), tmp_path)
    # and the train stage refuses it before any island starts: exit 2, one line naming it
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert CliRunner().invoke(app, ["traces", "--regime", "bursty", "--params", str(path), "--root", str(tmp_path)]
                              ).exit_code == 0
    result = CliRunner().invoke(app, ["train", "--regime", "bursty", "--params", str(path), "--root", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "train.hub.model: hub model 'SomeOrg/never-downloaded'" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "logs" / "train").exists(), "no island was started"


@pytest.mark.slow
def test_bad_input_an_island_finds_is_exit_2_naming_it_not_a_lost_island(tmp_path, monkeypatch):
    """A dataset too small to shard passes the launcher's check (it has documents) and fails in the islands:
    the stage exits 2 with the island's line, never 3 ("island lost")."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    params = _gpu_params(tmp_path)
    raw = yaml.safe_load(params.read_text())
    raw["train"]["hub"]["dataset"] = str(_dataset(tmp_path / "one-doc", n_docs=1))
    params.write_text(yaml.safe_dump(raw))
    root = tmp_path / "project"
    assert CliRunner().invoke(app, ["traces", "--params", str(params), "--root", str(root)]).exit_code == 0
    result = CliRunner().invoke(app, ["train", "--params", str(params), "--root", str(root)])
    assert result.exit_code == 2, result.output
    assert "fewer than" in result.output and "documents" in result.output and "island lost" not in result.output


@pytest.mark.slow
def test_more_fragments_than_the_hub_model_has_layers_is_exit_2_naming_the_key(tmp_path, monkeypatch):
    """The builtin model's layers are known when params are read; a hub model's only once an island loads it."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    params = _gpu_params(tmp_path)  # a 2-layer hub Llama
    raw = yaml.safe_load(params.read_text())
    raw["train"]["sync"] = {"mode": "streaming", "fragments": 3}
    params.write_text(yaml.safe_dump(raw))
    root = tmp_path / "project"
    assert CliRunner().invoke(app, ["traces", "--params", str(params), "--root", str(root)]).exit_code == 0
    result = CliRunner().invoke(app, ["train", "--params", str(params), "--root", str(root)])
    assert result.exit_code == 2, result.output
    assert "train.sync.fragments 3: the model has 2 decoder layers" in result.output
    assert "island lost" not in result.output


def test_local_dataset_shards_round_robin_and_repeat(tmp_path):
    data = _dataset(tmp_path / "data", n_docs=5)
    docs = [json.loads(line)["text"] for line in (data / "part-000.jsonl").read_text().splitlines()]
    stream = local_island_texts(data, 1, 3)
    assert [next(stream) for _ in range(4)] == [docs[1], docs[4], docs[1], docs[4]]
    with pytest.raises(BadInput, match="fewer than 7 documents"):
        next(local_island_texts(data, 6, 7))


def _gpu_params(tmp_path: Path) -> Path:
    cpu = yaml.safe_load((REPO / "params.yaml").read_text())
    raw = compose_file(REPO / "params.yaml", ["gpu", "tiny"])  # one regime (bursty, 120 s), one seed
    raw["traces"] = cpu["traces"]  # request sizes the tiny model serves
    primary = raw.get("analysis", {}).get("primary", {}).get("policy", "wa_diloco")
    raw["control"]["policies"] = [primary]
    raw["schedules"] = {**raw.get("schedules", {}), "random_draws": 1, "source": "train"}
    raw["train"].update({
        "device": "cpu", "islands": 2, "seq_len": 32, "batch_size": 2, "eval_batches": 2, "merge_eval_batches": 1,
        "torch_threads": 1, "collective_timeout_s": 60, "inner_lr": 0.001,
        "hub": {"model": str(_hub_model(tmp_path)), "dataset": str(_dataset(tmp_path / "dataset")),
                "dataset_config": None, "text_field": "text"},
    })  # fmt: skip
    raw["replay"]["simulator"] = {**raw["replay"].get("simulator", {}), "calibration": None}
    # a 6 s span: 3 no-sync controls, the primary, its draw and its span cadence, each about 25 requests of the
    # gpu profile's four-fold arrival rates (12 s of wall time each at the pinned time scale below). The
    # rehearsal checks the path that serves the trained export, not merge interference (the shared real run
    # does): a floor of 20 requests and none merge-active, as the trained primary's first merge falls after the span.
    # The time scale is pinned, well under any machine's capacity: the gpu profile's busiest window at half speed
    # needs about 23 requests/s at the 70 % target; the profile checks that rate instead of searching the knee.
    vllm = {"python": str(VLLM_PYTHON), "regimes": ["bursty"], "seeds": [0], "draws": 1, "span_s": 6, "budget_s": 450,
            "time_scale": 0.5,
            "min_requests": 20, "min_merge_active": 0,
            "warmup_s": 0, "startup_timeout_s": 900, "server_args": VllmReplay().server_args, "capacity_probe_s": 2}
    raw["replay"]["vllm"].update({k: v for k, v in vllm.items() if k in VllmReplay.model_fields})
    eager(raw)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
@pytest.mark.real_server
def test_gpu_profile_trains_exports_and_serves_on_cpu(tmp_path, monkeypatch):
    require_vllm_python()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    params = _gpu_params(tmp_path)
    p = parse_params(yaml.safe_load(params.read_text()))
    assert p.profile == "gpu+tiny" and (p.train.device, p.train.source) == ("cpu", "hub")
    root = tmp_path / "project"
    policy = p.control.policies[0]
    for cmd in (["traces"], ["train"], ["schedules", "build"], ["schedules", "index"], ["replay", "profile"],
                ["replay", "run", "--backend", "vllm"]):
        result = CliRunner().invoke(app, [*cmd, "--params", str(params), "--root", str(root)])
        assert result.exit_code == 0, f"{cmd}: {result.output}"
    run = root / "runs" / "train" / "bursty" / policy / "seed-0"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["islands"] == 2 and metrics["n_merges"] >= 1
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["hidden_size"] == 64
    index = pd.read_csv(root / "runs" / "replay-sets" / "vllm" / "index.csv")
    assert policy in set(index["policy"]) and "no_sync" in set(index["policy"])
    limits = p.replay.vllm
    for rec in index.itertuples():
        summary = json.loads((root / rec.path / "summary.json").read_text())
        assert Path(summary["model"]) == run / "model"  # the trained export is what was served
        requests = pd.read_parquet(root / rec.path / "requests.parquet")
        assert len(requests) > 5
        # every request answered, or the failures counted and the replay marked invalid by them (a loaded machine
        # can make the CPU server fail requests; the replay must then say so, never pass as evidence)
        failed = requests["error"].fillna("") != ""
        assert summary["failure_rate"] == pytest.approx(failed.mean())
        if failed.mean() > limits.max_failure_rate:
            assert not summary["valid"] and "failure rate" in summary["invalid_reason"]
        ok = ~failed
        assert (requests.loc[ok, "output_tokens_received"] == requests.loc[ok, "output_tokens"]).all()
