"""Helpers of the Ray runtime tests: a two-node local cluster, faulty envs, process checks.

Everything here starts processes it can name (a private temp dir on their command line, a
marker in their environment) and stops exactly those: never `ray stop`, which would stop
every Ray on the machine.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from podrace.config import EnvConfig
from podrace.envs import make_env
from podrace.runtime.ray.processes import alive, process_tree, reap
from tests.helpers.cli import podrace_command

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


class EnvExploded(RuntimeError):
    pass


class RaisingEnv:
    """A real env whose every step raises (an env that crashes its worker)."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, actions):
        raise EnvExploded("boom")


def raising_env(num_envs: int, seed: int):
    """An env factory (imported by workers) whose envs raise at every step."""
    return RaisingEnv(make_env(EnvConfig(), num_envs, seed))


DIES_ONCE = "PODRACE_TEST_DIES_ONCE"
"""A file path in the environment: the first Ray worker to build its env creates it and dies."""


def dies_once_while_starting(num_envs: int, seed: int):
    """An env factory: the first worker that builds its env is killed doing so (as a node's
    OOM killer or a crash in native code would), every later one starts."""
    import ray

    if ray.get_runtime_context().get_actor_id() is not None:  # in a worker, not the driver
        try:
            with open(os.environ[DIES_ONCE], "x"):
                pass
        except FileExistsError:
            pass
        else:
            os._exit(1)
    return make_env(EnvConfig(), num_envs, seed)


def leftovers(marker: str) -> list[str]:
    """This machine's processes that mention `marker` in their command line or environment."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (marker.encode() in cmdline or marker.encode() in environ):
            found.append(
                f"{entry}: {cmdline.replace(bytes(1), b' ').decode(errors='replace')[:120]}"
            )
    return found


def short_tmpdir() -> str:
    """A fresh short temp dir (Ray's socket paths under it must stay under 107 bytes)."""
    return tempfile.mkdtemp(prefix="prt-", dir="/tmp")


def base_env(tmpdir: str) -> dict[str, str]:
    """Environment of a podrace/ray subprocess: this checkout first, TMPDIR as a marker."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["TMPDIR"] = tmpdir
    env.pop("RAY_ADDRESS", None)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class TwoNodes:
    address: str
    env: dict[str, str]
    """Environment every process of this cluster uses (shared RAY_AUTH_TOKEN)."""
    temp_dir: str
    head_node: str
    actor_node: str
    """Node id of the node started with the custom resource `actor_node`."""


def _stop(temp_dir: str) -> None:
    # All at once: the raylets and GCS then wait on each other for over 6 s before they
    # exit, so the grace is short; SIGKILL is fine for a throwaway cluster.
    processes = process_tree(temp_dir)
    for pid in alive(processes):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    reap(processes, grace_s=2)


@contextlib.contextmanager
def two_node_cluster() -> Iterator[TwoNodes]:
    """`ray start --head` on 127.0.0.1 and a second node with resource actor_node=2, both
    with token auth and one shared token; stopped (by pid) afterwards."""
    temp_dir = short_tmpdir()
    env = base_env(temp_dir)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    address = f"127.0.0.1:{free_port()}"
    try:
        subprocess.run(
            [
                RAY,
                "start",
                "--head",
                "--node-ip-address",
                "127.0.0.1",
                "--port",
                address.split(":")[1],
                "--num-cpus",
                "1",
                "--include-dashboard",
                "false",
                "--temp-dir",
                temp_dir,
                "--disable-usage-stats",
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        start_node(address, temp_dir, '{"actor_node": 2}', cpus=2, env=env)
        query = (
            f"import json, ray; ray.init(address={address!r}, log_to_driver=False); "
            "print(json.dumps([(n['NodeID'], n['Resources']) "
            "for n in ray.nodes() if n['Alive']])); ray.shutdown()"
        )
        out = subprocess.run(
            [sys.executable, "-c", query],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        nodes = json.loads(out.stdout.strip().splitlines()[-1])
        actor = [node for node, res in nodes if res.get("actor_node")]
        head = [node for node, res in nodes if not res.get("actor_node")]
        assert len(actor) == 1 and len(head) == 1, nodes
        yield TwoNodes(address, env, temp_dir, head[0], actor[0])
    finally:
        _stop(temp_dir)
        subprocess.run(["rm", "-rf", temp_dir], check=False)


def raylet_pid(temp_dir: str, marker: bytes) -> int:
    """Pid of the raylet started with the custom resource named `marker`."""
    for pid in process_tree(temp_dir):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"raylet") and any(marker in arg for arg in argv):
            return pid
    raise AssertionError(f"no raylet with {marker!r} under {temp_dir}")


def start_node(
    address: str, temp_dir: str, resources: str, cpus: int, env: dict[str, str] | None = None
) -> None:
    """`ray start` of one more node of the cluster at `address` (its processes under
    `temp_dir`, stopped with the cluster's), offering `resources` (JSON) and `cpus`; `env`:
    the cluster's environment (its token), by default this process's."""
    subprocess.run(
        [
            RAY,
            "start",
            "--address",
            address,
            "--num-cpus",
            str(cpus),
            "--resources",
            resources,
            "--temp-dir",
            temp_dir,
            "--disable-usage-stats",
        ],
        env=dict(os.environ) if env is None else env,
        check=True,
        capture_output=True,
        timeout=120,
    )


def assert_consumed_once(stamps, workers: int, updates: int) -> None:
    """Every (worker, rollout sequence) stamp of `updates` rollouts per worker was consumed
    exactly once."""
    pairs = collections.Counter((w, s) for w, _, s in stamps)
    assert all(n == 1 for n in pairs.values()), [p for p, n in pairs.items() if n > 1]
    assert set(pairs) == {(w, s) for w in range(workers) for s in range(updates)}


def ray_cli_run(tmp_path, name: str, *flags: str) -> list[str]:
    """`podrace train` of the Ray runtime's small CartPole run, named `name`, with `flags`."""
    return podrace_command(
        "train",
        "cartpole-ppo",
        "--runtime",
        "ray",
        "--rollout-length",
        "16",
        "--env.num-envs",
        "8",
        "--log.console",
        "none",
        "--log.run-dir",
        str(tmp_path),
        "--log.run-name",
        name,
        *flags,
    )
