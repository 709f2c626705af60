"""The population's exchange: an exploit continues from the source's whole learner state with
explored hyperparameters, writes its lineage line, and scores measured before it are not
the member's."""

import json
import logging
import math
from types import SimpleNamespace

import jax.numpy as jnp
import numpy as np
import pytest

from podrace.algos.base import TrainState
from podrace.algos.normalizer import Normalizer
from podrace.algos.tunable import Tuned
from podrace.config import replace
from podrace.metrics.registry import Metrics
from podrace.pbt.config import MUTABLE
from podrace.pbt.lineage import Lineage, keep_until, read_lines
from podrace.presets import PRESETS
from podrace.runtime.pbt_exchange import Exchange

SPU = 8 * 128 * 4  # cartpole-ppo: 8 actors' rollouts (see `_cfg`)


def _cfg(tmp_path, **changes):
    cfg = PRESETS["cartpole-ppo"][1]
    base = {
        "pbt.population": 4,
        "pbt.interval_steps": 2 * cfg.steps_per_update,
        "eval.every_updates": 1,
        "log.run_dir": str(tmp_path),
    }
    return replace(cfg, **{**base, **changes})


def _learner(seed: float, step: int):
    hp = {name: jnp.float32(0.5 * (b.low + b.high)) for name, b in MUTABLE["ppo"].items()}
    state = TrainState(
        params={"w": jnp.full((3,), seed)},
        opt_state=Tuned({"mu": jnp.full((3,), seed + 0.5)}, hp),
        step=jnp.int32(step),
    )
    normalizer = Normalizer(obs=jnp.float32(seed), returns=jnp.float32(-seed), tracker=seed)
    return SimpleNamespace(state=state, normalizer=normalizer, adopt=None)


def test_a_bottom_member_continues_from_a_top_members_whole_state(tmp_path):
    cfg = _cfg(tmp_path)
    spu = cfg.steps_per_update
    exchange = Exchange(cfg, Lineage(tmp_path))
    learners = [_learner(float(m), step=5) for m in range(4)]
    metrics = [Metrics() for _ in range(4)]
    for m in range(4):
        exchange.attach(m, learners[m], metrics[m])
        exchange.observe(m, {"eval/return": 100.0 * m, "eval/version": 1, "version": 1})
    # Version 1 ends no interval (2 updates each): nobody exploits, every state is left.
    assert all(learners[m].adopt(1) is None for m in range(4))
    assert not (tmp_path / "pbt.jsonl").exists()
    # Version 2 ends member 0's first interval; it ranks last of 4 and copies member 3.
    for m in (3, 2, 1):
        assert learners[m].adopt(2) is None  # not in the bottom quarter
    adopted = learners[0].adopt(2)
    assert adopted is not None
    state, normalizer = adopted
    source = learners[3]
    assert state.params is source.state.params
    assert state.opt_state.opt is source.state.opt_state.opt
    assert int(state.step) == 5  # the member's own count of updates
    assert (
        normalizer.obs is source.normalizer.obs and normalizer.returns is source.normalizer.returns
    )
    assert normalizer.tracker == 0.0  # its envs' return tracker stays its own
    new = {k: float(v) for k, v in state.opt_state.hyperparameters.items()}
    for name, bounds in MUTABLE["ppo"].items():
        assert bounds.low <= new[name] <= bounds.high
    assert new != {k: float(v) for k, v in source.state.opt_state.hyperparameters.items()}
    (line,) = read_lines(tmp_path)
    assert line["member"] == 0 and line["copied"] == 3 and line["member_step"] == 2 * spu
    assert line["version"] == 2 and line["source_step"] == 2 * spu and line["interval"] == 1
    assert line["new"] == pytest.approx(new) and set(line["old"]) == set(MUTABLE["ppo"])
    assert metrics[0].total("pbt/exploits") == 1
    # The copied state is the source's score until the member is measured again; an
    # evaluation of a version before the exploit is not the member's.
    assert exchange.scores[0] == 300.0
    exchange.observe(0, {"eval/return": 1.0, "eval/version": 2, "version": 3})
    assert exchange.scores[0] == 300.0
    exchange.observe(0, {"eval/return": 250.0, "eval/version": 3, "version": 3})
    assert exchange.scores[0] == 250.0


def test_lines_without_the_metric_leave_the_score(tmp_path):
    exchange = Exchange(_cfg(tmp_path, **{"pbt.metric": "episode/return"}), Lineage(tmp_path))
    exchange.observe(1, {"version": 3})
    assert math.isnan(exchange.scores[1])
    exchange.observe(1, {"version": 4, "episode/return": 20.0})
    assert exchange.scores[1] == 20.0


def test_lineage_lines_are_whole_json_lines(tmp_path):
    lineage = Lineage(tmp_path)
    lineage.write({"member": 1, "member_step": 10})
    lineage.write({"member": 0, "member_step": 20})
    lines = (tmp_path / "pbt.jsonl").read_text().splitlines()
    assert [json.loads(t)["member"] for t in lines] == [1, 0]
    np.testing.assert_equal(len(lines), 2)


def test_a_resume_keeps_the_lineage_its_checkpoints_carry(tmp_path):
    lineage = Lineage(tmp_path)
    for member, step in [(0, 100), (1, 100), (0, 200), (1, 300), (0, 300)]:
        lineage.write({"member": member, "member_step": step})
    with open(tmp_path / "pbt.jsonl", "a") as f:
        f.write('{"member": 1, "memb')  # cut by a kill
    keep_until(tmp_path, {0: 200, 1: 300})
    assert [(x["member"], x["member_step"]) for x in read_lines(tmp_path)] == [
        (0, 100), (1, 100), (0, 200), (1, 300)
    ]  # fmt: skip
    superseded = (tmp_path / "pbt-superseded.jsonl").read_text().splitlines()
    assert json.loads(superseded[0]) == {"member": 0, "member_step": 300}
    assert len(superseded) == 2  # and the cut line, kept for the record
    keep_until(tmp_path, {0: 200, 1: 300})  # resuming the same checkpoints again: no change
    assert len(read_lines(tmp_path)) == 4
    assert len((tmp_path / "pbt-superseded.jsonl").read_text().splitlines()) == 2


def _ranked_on_info_x(tmp_path, caplog) -> tuple[Exchange, list]:
    """An exchange of 4 members ranked on `info/x`, its warnings caught by `caplog`."""
    caplog.set_level(logging.WARNING, logger="podrace")
    exchange = Exchange(_cfg(tmp_path, **{"pbt.metric": "info/x"}), Lineage(tmp_path))
    learners = [_learner(float(m), step=5) for m in range(4)]
    for m in range(4):
        exchange.attach(m, learners[m], Metrics())
    return exchange, learners


def test_an_info_metric_no_episode_reports_is_warned_of_once(tmp_path, caplog):
    exchange, learners = _ranked_on_info_x(tmp_path, caplog)
    for m in range(4):
        exchange.observe(m, {"episode/return": 10.0, "episodes": 3, "version": 1})
    for version in (1, 2, 3, 4):
        for m in range(4):
            assert learners[m].adopt(version) is None
    warned = [r.getMessage() for r in caplog.records if "info/x" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "no member is ranked" in warned[0]


def test_an_info_metric_is_not_warned_of_before_episodes_end_or_once_reported(tmp_path, caplog):
    exchange, learners = _ranked_on_info_x(tmp_path, caplog)
    exchange.observe(0, {"episodes": 0, "version": 1})  # no episode ended yet
    learners[0].adopt(1), learners[0].adopt(2)
    exchange.observe(1, {"episode/return": 10.0, "info/x": 2.0, "version": 1})
    learners[1].adopt(1), learners[1].adopt(2)
    assert not [r for r in caplog.records if "info/x" in r.getMessage()]
