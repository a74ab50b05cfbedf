"""`syncsafe run`'s schedule: which items wait for which, what starts beside what, and the time-left estimate."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncsafe.config import parse_params

from syncsafe.pipeline.parallel import Item, downstream, plan, startable
from syncsafe.pipeline.progress import Progress, bar_state, clock


@pytest.fixture
def items(raw_params) -> dict[str, Item]:
    raw_params["train"].update({"islands": 2, "torch_threads": 2})
    return {i.name: i for i in plan(parse_params(raw_params))}


def test_an_item_waits_for_exactly_the_items_whose_outputs_it_reads(items):
    assert items["traces@bursty"].after == frozenset()
    assert items["train@bursty"].after == {"traces@bursty"}
    assert items["schedules@steady"].after == {"traces@steady", "train@steady"}  # not another regime's
    regimes = [n.split("@")[1] for n in items if n.startswith("train@")]
    assert items["schedule-index"].after == {f"schedules@{r}" for r in regimes}
    assert {f"train@{r}" for r in regimes} | {"schedule-index"} <= items["replay-vllm"].after
    assert {"calibrate-fit", "replay-vllm", "schedules@bursty"} <= items["replay-simulator@bursty"].after
    assert "replay-simulator@steady" not in items["replay-simulator@bursty"].after


def test_items_come_in_an_order_where_everything_an_item_reads_is_before_it(items):
    seen: set[str] = set()
    for name, item in items.items():
        assert item.after <= seen, name
        seen.add(name)


def test_cores_and_alone_come_from_the_declarations_and_params(items):
    assert items["train@bursty"].cores == 4  # 2 islands x 2 torch threads
    assert items["schedules@bursty"].cores == 1
    assert items["replay-vllm"].alone
    assert not items["live"].alone  # live.enabled is false in params.yaml: its `off` is a file write


def test_downstream_of_a_changed_item_is_everything_that_reads_it_transitively(items):
    hit = downstream(list(items.values()), {"train@steady"})
    assert {"train@steady", "schedules@steady", "schedule-index", "replay-vllm", "replay-simulator@bursty",
            "analyze"} <= hit
    assert "train@bursty" not in hit and "schedules@bursty" not in hit and "traces@steady" not in hit


def _names(started):
    return [i.name for i in started]


def test_independent_items_fill_the_cores_in_order(items):
    pending = [items[n] for n in ("traces@bursty", "traces@steady", "traces@pressure_heavy")]
    assert _names(startable(pending, [], set(), jobs=2)) == ["traces@bursty", "traces@steady"]
    assert _names(startable(pending[1:], [items["traces@bursty"]], set(), jobs=2)) == ["traces@steady"]


def test_an_item_never_starts_before_what_it_reads_is_done(items):
    pending = [items["schedules@bursty"]]
    assert startable(pending, [], {"traces@bursty"}, jobs=8) == []
    assert _names(startable(pending, [], {"traces@bursty", "train@bursty"}, jobs=8)) == ["schedules@bursty"]


def test_an_item_bigger_than_the_machine_runs_alone_and_nothing_squeezes_beside_a_full_machine(items):
    done = {f"traces@{r}" for r in ("bursty", "steady")}
    pending = [items["train@bursty"], items["train@steady"], items["traces@pressure_heavy"]]
    assert _names(startable(pending, [], done, jobs=2)) == ["train@bursty"]  # 4 cores on 2: alone
    assert startable(pending[1:], [items["train@bursty"]], done, jobs=2) == []
    assert _names(startable(pending, [], done, jobs=9)) == ["train@bursty", "train@steady", "traces@pressure_heavy"]
    assert _names(startable(pending, [], done, jobs=8)) == ["train@bursty", "train@steady"]


def test_the_real_server_stage_starts_on_an_idle_machine_and_nothing_beside_it(items):
    vllm = items["replay-vllm"]
    done = set(vllm.after)
    other = items["traces@bursty"]  # a 1-core item
    assert startable([vllm, other], [other], done, jobs=8) == []  # waits for the machine to empty
    assert _names(startable([vllm, other], [], done, jobs=8)) == ["replay-vllm"]
    assert startable([other], [vllm], done, jobs=8) == []


def test_bar_state_reads_the_last_tqdm_state_of_a_log(tmp_path: Path):
    log = tmp_path / "x.log"
    log.write_text("loading\ntrain bursty:  10%|#  | 8/80 [00:20<03:00, 2.5s/run]\r"
                   "train bursty:  11%|#  | 9/80 [00:22<02:57, 2.5s/run]")
    assert bar_state(log) == ("9/80", 177.0)
    log.write_text("replay:   0%|   | 0/48 [00:00<?, ?it/s]")
    assert bar_state(log) == ("0/48", None)
    log.write_text("x 1/2 [1:02:03<1:00:00, 1s/it]\nno bar on the last line\n")
    assert bar_state(log) == ("1/2", 3600.0)
    assert bar_state(tmp_path / "missing.log") is None
    assert clock(3723) == "1:02:03" and clock(65) == "1:05"


def test_time_left_uses_the_bar_then_siblings_and_counts_what_was_never_timed(items, tmp_path: Path):
    progress = Progress(jobs=2, timings={"analyze": 30.0})
    log = tmp_path / "train.log"
    log.write_text("t: 50%| | 40/80 [01:40<01:40, 2.5s/run]")
    train_b, train_s, sched = items["train@bursty"], items["train@steady"], items["schedules@bursty"]
    left, untimed, fragments = progress.left([(train_b, log, 100.0)], [train_s, sched, items["analyze"]])
    # running: 100 s on 2 cores; train@steady projected from its running sibling (200 s) on 2 cores;
    # analyze 30 s on 1 core from the last run; schedules never timed
    assert untimed == 1
    assert left == pytest.approx((2 * 100 + 2 * 200 + 30) / 2)
    assert "train@bursty 40/80" in fragments[0]
    progress.finished(train_b, 180.0)  # a finished sibling's wall wins over a projection
    assert progress.estimate(train_s) == 180.0


def test_the_real_arm_never_timed_shows_its_declared_wall_not_zero(items, tmp_path: Path, raw_params):
    params = parse_params(raw_params)
    replay = items["replay-vllm"]
    cfg = params.replay.vllm
    assert replay.declared_s is not None and replay.declared_s >= cfg.budget_s + cfg.warmup_max_s
    progress = Progress(jobs=2, timings={})
    log = tmp_path / "replay.log"
    log.write_text("replay vllm: measuring the server's capacity for bursty\n")  # no bar yet
    left, untimed, _ = progress.left([(replay, log, 60.0)], [])
    assert untimed == 0 and left == pytest.approx(replay.declared_s - 60.0)
    assert Progress(jobs=2, timings={"replay-vllm": 500.0}).estimate(replay) == 500.0  # a timing wins
    profile = items["profile-vllm"]
    assert profile.declared_s is not None and profile.declared_s >= cfg.warmup_max_s
    assert all(i.declared_s is None for n, i in items.items() if n not in ("replay-vllm", "profile-vllm"))
