"""EpisodeStats on a hand-written sequence, including a lost life inside one game."""

import numpy as np

from podrace.envs.episode_stats import EpisodeStats

F, T = False, True


def test_lives_and_games():
    stats = EpisodeStats(2)
    # step: raw rewards, terminated, truncated, episode_done.
    # env 0: 2 steps, loses a life (autoreset step), 1 more step, game over, autoreset.
    # env 1: 3 steps then truncated, autoreset, 1 step.
    script = [
        ([5, 1], [F, F], [F, F], [F, F]),
        ([0, 1], [T, F], [F, F], [F, F]),  # env 0 loses a life
        ([0, 1], [F, F], [F, T], [F, T]),  # env 0 autoreset step; env 1 truncated
        ([7, 0], [T, F], [F, F], [T, F]),  # env 0 game over; env 1 autoreset step
        ([0, 2], [F, F], [F, F], [F, F]),  # env 0 autoreset step
        ([1, 2], [F, F], [F, F], [F, F]),
    ]
    out = [
        stats.update(np.array(r, np.float32), np.array(te), np.array(tr), np.array(done))
        for r, te, tr, done in script
    ]
    returns, lengths = np.array([o[0] for o in out]), np.array([o[1] for o in out])
    assert returns[2, 1] == 3 and lengths[2, 1] == 3
    assert returns[3, 0] == 12 and lengths[3, 0] == 3  # the autoreset step is not counted
    assert returns.dtype == np.float64
    np.testing.assert_array_equal(returns[[0, 1, 4, 5]], 0)  # zero where no episode ended

    stats.reset()
    ret, length = stats.update(
        np.array([1.0, 1.0]), np.array([T, T]), np.array([F, F]), np.array([T, T])
    )
    np.testing.assert_array_equal(ret, [1, 1])
    np.testing.assert_array_equal(length, [1, 1])
