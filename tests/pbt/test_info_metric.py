"""A population ranked on a value the env reports in its `info` (Sample Factory's "true
objective"): the value is logged as `info/<key>` and the exploits rank on it."""

import pytest

from podrace.config import EnvConfig
from podrace.control import Lifetime
from podrace.envs import EnvSource
from podrace.runtime.population import prepare_population
from podrace.runtime.run import prepare
from tests.helpers.configs import SMALL_SPU
from tests.helpers.info_envs import OFFSET, true_objective_envs
from tests.helpers.populations import (
    POPULATION_RUN_MARKS,
    RAY_MEMBER_SPU,
    lineage,
    small_population,
    small_ray_population,
)
from tests.helpers.runs import metric_lines

pytestmark = POPULATION_RUN_MARKS


@pytest.mark.parametrize("runtime", ["threads", "ray"])
def test_members_rank_on_a_value_their_envs_report_in_info(tmp_path, runtime):
    ranked = {"pbt.metric": "info/true_objective", "eval.every_updates": 0}
    if runtime == "ray":  # the values travel with the rollouts from the Ray workers
        pytest.importorskip("ray")
        cfg = small_ray_population(tmp_path, total_steps=12 * RAY_MEMBER_SPU, **ranked)
    else:
        cfg = small_population(tmp_path, total_steps=12 * SMALL_SPU, **ranked)
    envs = EnvSource(EnvConfig(), true_objective_envs)
    population = prepare_population(cfg, Lifetime(), envs, None, None, prepare)
    result = population.run()
    root = result.run_dir
    for member in (0, 1):
        lines = metric_lines(root / f"member-{member}")
        logged = [x["info/true_objective"] for x in lines if "info/true_objective" in x]
        assert logged and all(value > OFFSET for value in logged)
    exploits = lineage(root)
    assert exploits, "no member exploited the other"
    # Ranked on the info value (OFFSET + episode length), never on a return.
    assert all(score > OFFSET for line in exploits for score in line["scores"].values())
