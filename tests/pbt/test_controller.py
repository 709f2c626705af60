"""The pure decisions of PBT: ranking, whom a member copies, and perturbation within bounds."""

import math

import numpy as np
import pytest

from podrace.pbt.config import MUTABLE, Mutable
from podrace.pbt.controller import (
    decision_rng,
    exploit_source,
    explore,
    intervals_done,
    ranked,
    starting_hyperparameters,
)


def test_members_rank_best_first_ties_by_id_without_nan():
    assert ranked({0: 1.0, 1: 3.0, 2: math.nan, 3: 3.0}) == [1, 3, 0]


def test_only_the_bottom_fraction_copies_a_top_member():
    scores = {0: 10.0, 1: 40.0, 2: 30.0, 3: 20.0, 4: 0.0, 5: 50.0, 6: 60.0, 7: 70.0}
    # 8 members, a quarter: the bottom 2 (4 and 0) copy one of the top 2 (7 and 6).
    sources = {
        m: {exploit_source(m, scores, 0.25, decision_rng(1, m, k)) for k in range(40)}
        for m in scores
    }
    assert sources[4] == {7, 6} and sources[0] == {7, 6}
    assert all(sources[m] == {None} for m in (1, 2, 3, 5, 6, 7))


def test_a_member_without_a_score_or_alone_copies_nobody():
    rng = decision_rng(1, 0, 1)
    assert exploit_source(0, {0: math.nan, 1: 5.0}, 0.5, rng) is None
    assert exploit_source(0, {1: 5.0}, 0.5, rng) is None
    assert exploit_source(0, {0: 1.0}, 0.5, rng) is None
    assert exploit_source(0, {0: 1.0, 1: 5.0, 2: math.nan}, 0.25, rng) == 1  # at least one


def test_members_that_tie_keep_their_own_state():
    scores = {0: 9.0, 1: 9.0, 2: 9.0, 3: 9.0}
    assert all(exploit_source(3, scores, 0.25, decision_rng(1, 3, k)) is None for k in range(20))


def test_perturbation_multiplies_by_a_factor_or_resamples_within_bounds():
    space = MUTABLE["ppo"]
    values = {
        "learning_rate": 1e-3,
        "ent_coef": 0.01,
        "clip_coef": 0.2,
        "gamma": 0.99,
        "gae_lambda": 0.95,
    }
    seen = {name: set() for name in space}
    for k in range(200):
        new = explore(values, space, (0.8, 1.2), 0.0, decision_rng(7, 1, k))
        for name, bounds in space.items():
            assert bounds.low <= new[name] <= bounds.high
            seen[name].add(round(new[name], 9))
    assert seen["learning_rate"] == {round(8e-4, 9), round(1.2e-3, 9)}
    assert seen["gamma"] == {round(1 - 0.01 * 0.8, 9), round(1 - 0.01 * 1.2, 9)}  # 1 - gamma
    resampled = [explore(values, space, (0.8, 1.2), 1.0, decision_rng(7, 2, k)) for k in range(200)]
    rates = np.array([r["learning_rate"] for r in resampled])
    assert rates.min() >= 1e-6 and rates.max() <= 1e-2 and len(set(rates)) == 200


def test_perturbation_is_clipped_to_the_bounds():
    space = {"x": Mutable(0.1, 1.0, "linear")}
    assert explore({"x": 1.0}, space, (2.0,), 0.0, decision_rng(0, 0, 1))["x"] == 1.0
    assert explore({"x": 0.1}, space, (0.5,), 0.0, decision_rng(0, 0, 1))["x"] == 0.1


def test_decisions_depend_only_on_where_they_are_taken():
    space = MUTABLE["impala"]
    values = {"learning_rate": 6e-4, "ent_coef": 0.01, "gamma": 0.99, "vtrace_lambda": 1.0}
    first = explore(values, space, (0.8, 1.2), 0.25, decision_rng(3, 2, 5))
    assert explore(values, space, (0.8, 1.2), 0.25, decision_rng(3, 2, 5)) == first
    assert explore(values, space, (0.8, 1.2), 0.25, decision_rng(3, 2, 6)) != first


def test_member_zero_starts_with_the_config_the_others_explored():
    space = MUTABLE["ppo"]
    values = {
        "learning_rate": 2.5e-5,
        "ent_coef": 0.01,
        "clip_coef": 0.2,
        "gamma": 0.99,
        "gae_lambda": 0.95,
    }
    assert starting_hyperparameters(values, space, (0.8, 1.2), 0.25, 1, 0) == pytest.approx(values)
    others = [starting_hyperparameters(values, space, (0.8, 1.2), 0.25, 1, m) for m in (1, 2, 3)]
    assert all(o != pytest.approx(values) for o in others)


@pytest.mark.parametrize(
    "before, after, crossed", [(0, 999, 0), (999, 1000, 1), (1000, 1999, 0), (1999, 3100, 2)]
)
def test_intervals_are_counted_on_a_members_own_steps(before, after, crossed):
    assert intervals_done(after, 1000) - intervals_done(before, 1000) == crossed
