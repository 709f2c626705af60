"""A population end to end, on a tiny budget: members train side by side, exploit through
their publishers without a new compile, and a stopped population resumes whole."""

import signal

import pytest

from podrace.checkpoints.state import checkpoint_dir
from podrace.control import Lifetime
from podrace.runtime.population import prepare_population
from podrace.runtime.run import prepare
from tests.helpers.cli import ENDLESS, run_flags, run_podrace, start_podrace
from tests.helpers.configs import SMALL_SPU
from tests.helpers.populations import POPULATION_FLAGS, lineage, small_population
from tests.helpers.runs import metric_lines
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_members_train_and_exploit_without_a_new_compile(tmp_path):
    # Intervals of 4 updates: a member's compiled update has every cache entry it will have
    # once its second update ran (the first adds one), before its first exploit.
    cfg = small_population(
        tmp_path, total_steps=16 * SMALL_SPU, **{"pbt.interval_steps": 4 * SMALL_SPU}
    )
    population = prepare_population(cfg, Lifetime(), None, None, None, prepare)
    entries = {}  # each member's compiled update's cache entries after its third update
    for member in population.members:
        learner, after = member.run.learner, member.run.learner.on_update

        def first_update(version, learner=learner, after=after, index=member.index):
            if version == 3:
                entries[index] = learner.update_fn.jitted._cache_size()
            after(version)

        learner.on_update = first_update
    result = population.run()
    root = result.run_dir
    assert sorted(p.name for p in root.iterdir()) == [
        "config.json", "member-0", "member-1", "pbt.jsonl"
    ]  # fmt: skip
    assert [m.updates for m in result.members] == [16, 16]
    assert result.env_steps == 2 * 16 * SMALL_SPU
    lines = lineage(root)
    assert lines, "no member exploited the other"
    for line in lines:
        assert line["copied"] == 1 - line["member"]
        assert line["member_step"] % cfg.pbt.interval_steps == 0
        assert line["member_step"] == line["version"] * SMALL_SPU
    for member in population.members:
        # No member compiled its update again for the hyperparameters it was given since.
        assert member.run.learner.update_fn.jitted._cache_size() == entries[member.index]
        # Rollouts of a policy replaced by an exploit were taken within the lag bound.
        assert member.run.metrics.last("lag/max_seen") <= cfg.max_policy_lag
        member_lines = metric_lines(root / f"member-{member.index}")
        assert any({"learner/hp/learning_rate", "learner/hp/gamma"} <= set(x) for x in member_lines)
        exploits = [x for x in lines if x["member"] == member.index]
        assert member_lines[-1]["pbt/exploits"] == len(exploits)


def test_a_stopped_population_resumes_every_member_and_its_lineage(tmp_path):
    flags = (*POPULATION_FLAGS, "--checkpoint.every-updates", "4")
    total = 24 * SMALL_SPU
    proc = start_podrace("train", "cartpole-ppo", *run_flags(tmp_path, ENDLESS), *flags)
    root = tmp_path / "r"
    try:
        wait_until(
            lambda: (
                all(
                    any(line.get("version", 0) >= 8 for line in metric_lines(root / f"member-{m}"))
                    for m in (0, 1)
                )
                or proc.poll() is not None
            ),
            timeout=400,
        )
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert f"podrace train --resume {root}" in err
    before = lineage(root)
    saved = {m: _latest(root / f"member-{m}") for m in (0, 1)}
    assert all(step >= 8 for step in saved.values()), saved

    done = run_podrace("train", "--resume", str(root), "--total-steps", str(total), timeout=400)
    assert done.returncode == 0, done.stderr
    after = lineage(root)
    # What the checkpoints carry is kept as it was; nothing is there twice.
    kept = [x for x in before if x["member_step"] <= saved[x["member"]] * SMALL_SPU]
    assert after[: len(kept)] == kept
    assert len({(x["member"], x["member_step"]) for x in after}) == len(after)
    for m in (0, 1):
        lines = metric_lines(root / f"member-{m}")
        assert lines[-1]["version"] == 24 and lines[-1]["env_steps"] == total
        steps = [line["env_steps"] for line in lines]
        assert steps == sorted(steps)  # the resumed member continues its own counters
        assert lines[-1]["pbt/exploits"] == len([x for x in after if x["member"] == m])


def _latest(member_dir):
    return max(int(p.name) for p in checkpoint_dir(member_dir).iterdir() if p.name.isdigit())
