"""tyro's error boxes become one podrace line; --help still prints in full."""

import pytest
import tyro._fmtlib

from podrace.cli import main

CASES = [
    (
        ["train", "cartpole-ppo", "--ppo.clip-coef", "abc"],
        "Error parsing --ppo.clip-coef: could not convert string to float: 'abc' "
        "(see podrace train --help)",
    ),
    (
        ["train", "cartpole-ppo", "--ppo.clip-cof", "0.3"],
        "Unrecognized options: --ppo.clip-cof, 0.3; Perhaps you meant: --ppo.clip-coef FLOAT "
        "(see podrace train --help)",
    ),
    (
        ["train", "cartpole-ppo", "--env.num-envs"],
        "Missing value for argument '--env.num-envs'. Expected 1 values. "
        "(see podrace train cartpole-ppo --help)",
    ),
    (
        ["train"],
        "Expected one of {cartpole-ppo, pendulum-ppo, cartpole-impala, atari-ppo, atari-impala, "
        "mujoco-ppo, cartpole-po-ppo-lstm, cartpole-po-ppo, atari-impala-lstm, minatar-ppo, "
        "minatar-impala, halfcheetah-ppo}.",
    ),
    (["eval"], "Missing from podrace eval: RUN_DIR (see podrace eval --help)"),
    (["plot", "--nonsense"], "Unrecognized options: --nonsense"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("terminal", [False, True], ids=["plain", "terminal"])
@pytest.mark.parametrize("args,message", CASES)
def test_parse_errors_are_one_line_and_exit_2(capsys, monkeypatch, args, message, terminal):
    monkeypatch.setenv("COLUMNS", "60")  # a narrow terminal wraps tyro's box: still one line
    # At a UTF-8 terminal tyro draws box characters and colours; captured, dashes and spaces.
    monkeypatch.setattr(tyro._fmtlib, "_FORCE_UTF8_BOXES", terminal)
    monkeypatch.setattr(tyro._fmtlib, "_FORCE_ANSI", terminal)
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("podrace: error: ") and message in err, err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [["train", "cartpole-ppo"], ["eval"], ["plot"]])
def test_help_is_printed_in_full(capsys, command):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    out, err = capsys.readouterr()
    assert exc.value.code == 0 and not err
    assert len(out.splitlines()) > 5 and "usage: podrace" in out
