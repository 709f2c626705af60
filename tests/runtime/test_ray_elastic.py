"""Ray workers that come and go: a worker killed with finished rollouts not yet consumed
(fixed order), the elastic order through a killed worker, a lost node and a node that
joins, a recurrent policy, resuming an elastic run, and the new flags' errors.

Every test starts its own Ray (a private local one, or `ray start` processes with token
auth) and stops exactly what it started; waits are `wait_until`, verdicts count updates and
stamps, never seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from podrace.config import ConfigError, replace
from podrace.control import ComponentError
from podrace.presets import PRESETS
from podrace.runtime.ray.processes import process_tree
from tests.helpers.cli import run_podrace
from tests.helpers.configs import small_ray
from tests.helpers.runs import last_line, record_batches
from tests.runtime import ray_drills, ray_helpers
from tests.waiting import wait_until

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.filterwarnings("ignore:os.fork", "ignore::UserWarning")


def elastic(tmp_path, **changes):
    return small_ray(tmp_path, **{"ray.data_order": "elastic", **changes})


def record_stamps(run) -> list[list[tuple[int, int, int]]]:
    """The stamps of every batch the learner takes, in order (appended as it takes them)."""
    return record_batches(
        run, lambda _, rollouts: [(r.actor_id, r.restart, r.seq) for r in rollouts]
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fixed_order_worker_killed_with_finished_rollouts_waiting(tmp_path):
    """The learner is held inside update 3 while worker 0 runs ahead (lag bound 4): its
    rollouts 4-7 are finished, rollout 4 is queued for the learner and 5-7 are not yet.
    SIGKILL it then: nothing it finished is lost (`ray/lost_rollouts` 0, every seq it made
    consumed once), and its replacement starts at the seq after its last finished one."""
    from podrace.runtime.run import prepare

    cfg = small_ray(tmp_path, total_steps=2 * 8 * 16 * 12, **{"layout.max_policy_lag": 4})
    run = prepare(cfg)
    update, calls, hold = run.learner.update_fn, [], threading.Event()

    def held_update(state, trajs, keys):
        calls.append(1)
        if len(calls) == 4:  # update 3, from version 3: rollouts up to seq 7 may be made
            hold.wait(120)
        return update(state, trajs, keys)

    run.learner.update_fn = held_update
    slot0 = run.fleet.slots[0]
    victim, seen = slot0.pid, {}
    assert victim > 0  # the fixed order starts once every worker is ready

    def kill_when_ahead() -> None:
        progress = lambda: ray.get(slot0.handle.progress.remote())  # noqa: E731
        wait_until(lambda: run.lifetime.stopping or progress()[0] == 8, timeout=120)
        seen["produced_until"], seen["in_outbox"] = progress()
        inbox = run.fleet.order.inboxes.get(0, ())
        seen["waiting"] = [r.seq for r in inbox]  # received, not yet given to the learner
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: run.lifetime.stopping or slot0.pid != victim, timeout=120)
        hold.set()

    killer = threading.Thread(target=kill_when_ahead, daemon=True)
    killer.start()
    result = run.run()
    killer.join(10)
    assert seen["produced_until"] == 8 and seen["waiting"], seen
    assert result.updates == 12 and result.ray.restarts == 1
    ray_helpers.assert_consumed_once(result.ray.stamps, 2, 12)
    first_life = sorted(s for w, r, s in result.ray.stamps if (w, r) == (0, 0))
    assert first_life == list(range(8))  # every rollout it finished was consumed
    replacement = [s for w, r, s in result.ray.stamps if (w, r) == (0, 1)]
    assert replacement[0] == seen["produced_until"]  # it starts after the last finished
    lost = seen["produced_until"] - len(first_life)
    assert result.ray.lost_rollouts == last_line(result.run_dir)["ray/lost_rollouts"] == lost == 0
    assert not process_tree(run.cluster.connection.temp_dir)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_elastic_order_learns_through_a_killed_worker_without_waiting_for_it(tmp_path):
    """SIGKILL a worker mid-run in the elastic order: the learner goes on with the other
    worker's rollouts (updates taken while the replacement starts), each update still takes
    exactly `rollouts_per_update` rollouts, and no stamp is consumed twice."""
    from podrace.runtime.run import prepare

    cfg = elastic(tmp_path, total_steps=2 * 8 * 16 * 40)
    run = prepare(cfg)
    batches = record_stamps(run)
    slot0, killed_at, back_at = run.fleet.slots[0], [], []

    def kill_mid_run() -> None:
        # The elastic order starts learning once one worker is ready: wait for worker 0 too.
        wait_until(
            lambda: run.lifetime.stopping or (run.learner.version >= 5 and slot0.ready),
            timeout=120,
        )
        if not run.lifetime.stopping:
            assert slot0.pid > 0
            killed_at.append(run.learner.version)
            os.kill(slot0.pid, signal.SIGKILL)
            wait_until(
                lambda: run.lifetime.stopping or (slot0.restarts and slot0.ready), timeout=200
            )
            back_at.append(run.learner.version)

    threading.Thread(target=kill_mid_run, daemon=True).start()
    result = run.run()
    assert killed_at and result.updates == cfg.num_updates == 40
    assert all(len(batch) == 2 for batch in batches) and len(batches) == 40
    stamps = [stamp for batch in batches for stamp in batch]
    assert len(set(stamps)) == len(stamps) == 80
    assert sorted(stamps) == list(result.ray.stamps)
    assert result.ray.restarts >= 1 and result.ray.lost_rollouts == 0
    # Learning went on while worker 0 restarted: more updates than the rollouts delivered
    # before the kill could make (the credits out: two updates' worth).
    back = back_at[0] if back_at else result.updates  # (or it came back after the end)
    assert back - killed_at[0] > 2, (killed_at, back_at)
    after = batches[killed_at[0] :]
    assert sum(all(w == 1 for w, _, _ in b) for b in after) > 2, batches
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    print(
        "longest learner wait per line after the kill:", [x["ray/data_wait_max_s"] for x in lines]
    )
    assert max(x["lag/max_seen"] for x in lines if "lag/max_seen" in x) <= 1
    assert not process_tree(run.cluster.connection.temp_dir)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_elastic_run_fails_once_no_worker_has_been_alive_for_the_timeout(tmp_path, monkeypatch):
    """The only worker is killed and none of its restarts can start: the run goes on
    waiting (restarts of a worker that died before delivering count as its failures, so
    the restart limit is high here) and fails, in one line, once no worker has been alive
    for `--ray.no-workers-timeout-s`."""
    from podrace.envs import EnvSource
    from podrace.runtime.ray.restarts import NoWorkers
    from podrace.runtime.run import prepare

    flag = tmp_path / "no-more-workers"
    monkeypatch.setenv(ray_drills.DIES_IF_FLAGGED, str(flag))
    cfg = elastic(
        tmp_path,
        total_steps=8 * 16 * 10**5,
        **{
            "ray.num_workers": 1,
            "ray.max_restarts": 1000,
            "ray.no_workers_timeout_s": 3.0,
            "ray.node_relay": False,
        },
    )
    run = prepare(cfg, envs=EnvSource(cfg.env, ray_drills.dies_if_flagged))
    slot0 = run.fleet.slots[0]

    def kill_for_good() -> None:
        wait_until(lambda: run.lifetime.stopping or run.learner.version >= 3, timeout=120)
        flag.touch()
        os.kill(slot0.pid, signal.SIGKILL)

    threading.Thread(target=kill_for_good, daemon=True).start()
    with pytest.raises(ComponentError) as caught:
        run.run()
    assert isinstance(caught.value.error, NoWorkers), caught.value
    assert "no Ray worker alive for 3s" in str(caught.value) and "\n" not in str(caught.value)
    assert run.learner.version >= 3
    assert not process_tree(run.cluster.connection.temp_dir)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_stopped_elastic_run_resumes_beyond_every_incarnation_before(tmp_path):
    """An elastic run of an LSTM policy loses worker 0 after its update 3; the worker is
    restarted (incarnation 1) and the run is stopped before any update records the
    restart. The resumed run starts from the learner's state: its workers start beyond
    every incarnation before, the restart included (incarnation 2: fresh seeds, new
    stamps), nothing is consumed twice across the two parts, and the resumed part takes
    exactly the updates left. Every rollout of either part carries the core state its
    first step started from (the learner unrolls each column from its own rollout's
    state)."""
    import jax

    from podrace.checkpoints.resume import Resume
    from podrace.runtime.run import prepare

    cfg = replace(
        PRESETS["cartpole-po-ppo-lstm"][1],
        runtime="ray",
        seed=3,
        **{
            "total_steps": 2 * 16 * 8 * 6,
            "rollout_length": 16,
            "env.num_envs": 8,
            "ray.data_order": "elastic",
            "ray.num_workers": 2,
            "eval.every_updates": 0,
            "eval.episodes": 2,
            "eval.num_envs": 2,
            "log.console": "none",
            "log.run_dir": str(tmp_path),
            "log.run_name": "r",
            "log.interval_s": 0.2,
        },
    )
    states: list[int] = []

    def record_core_states(run) -> None:
        next_batch = run.pipeline.next_batch

        def recording(version):
            rollouts, stats = next_batch(version)
            states.extend(len(jax.tree.leaves(r.trajectory.core_state)) for r in rollouts)
            return rollouts, stats

        run.pipeline.next_batch = recording

    run = prepare(cfg)
    record_core_states(run)
    slot0, after = run.fleet.slots[0], run.learner.on_update

    def lose_worker_0_then_stop(version: int) -> None:
        after(version)
        if version == 3:
            wait_until(lambda: run.lifetime.stopping or slot0.ready, timeout=120)
            os.kill(slot0.pid, signal.SIGKILL)
            wait_until(lambda: run.lifetime.stopping or slot0.restarts == 1, timeout=120)
            run.lifetime.stop("SIGTERM received")

    run.learner.on_update = lose_worker_0_then_stop
    first = run.run()
    assert (first.updates, first.checkpoint, first.ray.restarts) == (3, 3, 1)
    assert not process_tree(run.cluster.connection.temp_dir)
    resumed = prepare(None, resume=Resume(tmp_path / "r"))
    record_core_states(resumed)
    started = [slot.restarts for slot in resumed.fleet.slots]
    second = resumed.run()  # (run before asserting: it releases the resumed run's Ray)
    assert started == [2, 2]
    assert (second.updates, second.checkpoint) == (6, 6)
    assert len(first.ray.stamps) == 3 * 2 and len(second.ray.stamps) == 3 * 2
    assert len(set(first.ray.stamps)) == 6 and len(set(second.ray.stamps)) == 6
    assert not set(first.ray.stamps) & set(second.ray.stamps)
    assert min(r for _, r, _ in second.ray.stamps) == 2
    assert second.env_steps == 6 * 2 * 8 * 16
    assert len(states) == 12 and min(states) > 0  # an LSTM's (c, h) on every rollout
    assert not process_tree(resumed.cluster.connection.temp_dir)


def check_a_run_pinned_to_the_second_node(cluster: ray_helpers.TwoNodes, tmp_path) -> None:
    args = ray_helpers.ray_cli_run(
        tmp_path,
        "two-nodes",
        *("--ray.address", cluster.address, "--ray.worker-resources", "actor_node=1"),
        *("--ray.num-workers", "2", "--total-steps", str(2 * 8 * 16 * 6)),
        *("--ray.start-timeout-s", "240"),  # a loaded machine: slower, not failed
        *("--eval.episodes", "2", "--eval.num-envs", "2"),
    )
    done = subprocess.run(args, env=cluster.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = last_line(tmp_path / "two-nodes")
    nodes = {k.split("/")[2]: v for k, v in line.items() if k.startswith("ray/node/")}
    assert nodes == {cluster.actor_node: 2 * 6}, (nodes, cluster)
    tree = process_tree(cluster.temp_dir)
    assert tree, "podrace stopped a cluster it only joined"
    titles = [open(f"/proc/{p}/cmdline", "rb").read() for p in tree if os.path.exists(f"/proc/{p}")]
    assert not [t for t in titles if t.startswith(b"ray::RolloutWorker")], titles


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_elastic_run_survives_a_lost_node_and_grows_onto_a_new_one(tmp_path):
    """Two nodes, elastic order, `--ray.num-workers auto`: one worker on the head, two on
    the second node. SIGKILL the second node's raylet mid-run: the learner goes on with the
    head's worker before Ray even reports the loss (it never waits a second for a batch),
    and the lost workers wait for resources. Start a third node: the lost workers restart
    on it and `auto` adds a fourth there. The run learns on, no stamp is consumed twice,
    each update takes its 3 rollouts; 10 updates after the growth the drill stops it.

    The run is a child process (`tests/runtime/ray_drills.py`): Ray reads the cluster's
    token when it is imported, so the driver must start with it in its environment.

    Before the drill, on the same two nodes (one cluster start for both), `podrace train`
    joins with `--ray.worker-resources actor_node=1`: both its workers run on the second
    node, and the joined cluster keeps running without any worker of the finished run."""
    out = tmp_path / "drill.json"
    with ray_helpers.two_node_cluster() as cluster:
        check_a_run_pinned_to_the_second_node(cluster, tmp_path)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.runtime.ray_drills",
                "node-loss",
                cluster.address,
                cluster.temp_dir,
                cluster.actor_node,
                str(tmp_path / "runs"),
                str(out),
            ],
            env=cluster.env,
            capture_output=True,
            text=True,
            timeout=840,
        )
        assert done.returncode == 0, done.stderr[-4000:]
    drill = json.loads(out.read_text())
    summary = {k: v for k, v in drill.items() if k not in ("batches", "waits", "returns")}
    assert "drill_error" not in drill, summary
    # The drill's stop may come between a batch's arrival and its update.
    batches = drill["batches"][: drill["updates"]]
    assert drill["updates"] == len(batches) >= drill["updates_grown"] + ray_drills.AFTER_GROWTH, (
        summary
    )
    # Learning went on through the loss and the growth (random play scores ~20, ~100-150
    # at the kill). Not the last lines' returns: how many updates the loss and the growth
    # take depends on the machine's load, and a long PPO run on CartPole dips from 500 to
    # ~200 now and then.
    after_kill = [r for version, r in drill["returns"] if version > drill["updates_killed"]]
    after_growth = [r for version, r in drill["returns"] if version > drill["updates_grown"]]
    assert max(after_kill) >= 400 and max(after_growth) >= 150, drill["returns"]
    stamps = [tuple(s) for b in batches for s in b]
    assert len(set(stamps)) == len(stamps) and all(len(b) == 3 for b in batches)
    assert drill["workers_on_actor_node"] == 2 and drill["workers_at_start"] == 3
    # The learner did not wait for Ray to report the lost workers (seconds after the kill).
    # Their credits count against the limit until they have been silent for the pipeline's
    # suspicion time (4 times a worker's usual interval, read at the kill); then the head's
    # worker gets them and makes the batch. So no wait for a batch between the kill and the
    # report lasts longer than that suspicion time plus three usual intervals, with 1 s to
    # spare. Both scale with the machine's load, which Ray's report does not; a learner that
    # waited for the report would wait it almost out. Later waits (the third node's start
    # and its workers' JAX imports share the test's two cores with the learner) are not
    # checked.
    assert drill["updates_reported"] - drill["updates_killed"] >= 1, drill
    killed, reported = drill["killed_at"], drill["reported_at"]
    waits = [(end - max(start, killed), start < reported) for _, start, end in drill["waits"]]
    until_report = [wait for wait, before in waits if wait > 0 and before]
    bound = drill["suspect_after_s"] + 3 * drill["typical_interval_s"] + 1.0
    assert max(until_report) < bound, (bound, reported - killed, until_report)
    third = set(drill["rollouts_per_node"]) - {cluster.actor_node, cluster.head_node}
    assert len(third) == 1 and drill["rollouts_per_node"][min(third)] > 0, drill
    # The joined node holds the two restarted workers and the one `auto` added.
    placed = drill["worker_nodes_after_join"]
    assert sorted(placed) == ["0", "1", "2", "3"], drill
    on_third = sorted(w for w, node in placed.items() if node in third)
    assert len(on_third) == 3 and "3" in on_third, drill
    # The third node's workers read its relay (one that started before it may not).
    assert drill["relay_subscribers"] and drill["relays_at_end"] >= 1, drill


@pytest.mark.timeout(60)
def test_elastic_flags_errors_are_one_line():
    from podrace.validation import validate

    base = replace(PRESETS["cartpole-ppo"][1], runtime="ray")
    for changes, expected in [
        ({"ray.num_workers": "auto"}, "needs --ray.data-order elastic"),
        (
            {"ray.num_workers": "auto", "ray.data_order": "elastic"},
            "needs --ray.rollouts-per-update",
        ),
        ({"ray.rollouts_per_update": 2}, "needs --ray.data-order elastic"),
        ({"ray.max_workers": 4}, "caps --ray.num-workers auto"),
        (
            {"ray.data_order": "elastic", "ray.rollouts_per_update": 0},
            "ray.rollouts_per_update must be in",
        ),
        (
            {
                "ray.num_workers": "auto",
                "ray.data_order": "elastic",
                "ray.max_workers": 0,
                "ray.rollouts_per_update": 2,
            },
            "ray.max_workers must be in",
        ),
        ({"ray.num_workers": 10**9}, "ray.num_workers must be at most"),
        ({"ray.data_order": "elastic", "deterministic": True}, "--deterministic needs"),
        ({"ray.data_order": "elastic", "normalize.reward": True}, "return tracker"),
        ({"ray.data_order": "elastic", "ray.no_workers_timeout_s": 0}, "no_workers_timeout"),
        ({"ray.data_order": "sometimes"}, "data_order must be one of"),
        ({"ray.num_workers": "many"}, "num_workers must be"),
    ]:
        with pytest.raises(ConfigError, match=expected) as caught:
            validate(replace(base, **changes))
        assert "\n" not in str(caught.value)


@pytest.mark.timeout(120)
def test_cli_refuses_nonsense_elastic_flags_in_one_line(tmp_path):
    for args, expected in [
        (["--ray.num-workers", "auto"], "needs --ray.data-order elastic"),
        (["--ray.data-order", "random"], "--ray.data-order"),
        (["--ray.num-workers", "-3"], "ray.num_workers must be positive"),
    ]:
        done = run_podrace(
            "train",
            "cartpole-ppo",
            "--runtime",
            "ray",
            *args,
            "--log.run-dir",
            str(tmp_path),
            env=ray_helpers.base_env("/tmp"),
            timeout=100,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_documented_stop_command_stops_exactly_the_ray_it_names(tmp_path):
    """`python -m podrace.runtime.ray.cluster stop TEMP_DIR` (the Ray guide's way to stop a
    node it started) stops that Ray's processes by their ids and leaves another Ray of the
    machine running, as `ray stop` would not."""
    import secrets

    dirs = [ray_helpers.short_tmpdir(), ray_helpers.short_tmpdir()]
    env = ray_helpers.base_env(dirs[0])
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    stop = [sys.executable, "-m", "podrace.runtime.ray.cluster", "stop"]
    try:
        for temp_dir in dirs:
            subprocess.run(
                [ray_helpers.RAY, "start", "--head", "--node-ip-address", "127.0.0.1"]
                + ["--port", str(ray_helpers.free_port()), "--num-cpus", "1"]
                + ["--include-dashboard", "false", "--temp-dir", temp_dir]
                + ["--disable-usage-stats"],
                env=env,
                check=True,
                capture_output=True,
                timeout=120,
            )
        started = process_tree(dirs[0])
        assert started and process_tree(dirs[1])
        done = subprocess.run(stop + [dirs[0]], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.startswith("stopped "), done
        assert not process_tree(dirs[0]) and not ray_helpers.alive(started)
        assert process_tree(dirs[1])  # the other Ray runs on
        missing = subprocess.run(
            stop + [str(tmp_path / "nowhere")], env=env, capture_output=True, text=True
        )
        assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing
    finally:
        for temp_dir in dirs:
            ray_helpers._stop(temp_dir)
            subprocess.run(["rm", "-rf", temp_dir], check=False)
