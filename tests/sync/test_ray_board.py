"""The ray transport's board alone, as a plain asyncio object (no Ray): waits, closing,
acknowledgements and forgetting subscribers that went silent."""

import asyncio

import pytest

from podrace.sync.ray_board import Board

pytestmark = pytest.mark.timeout(30)


def run(coro):
    return asyncio.run(coro)


def test_a_wait_returns_the_newest_reference_once_the_version_is_there():
    async def scenario():
        board = Board()
        await board.open("c")
        waiter = asyncio.create_task(board.wait("c", 2, timeout=5.0))
        await board.set("c", 1, ["one"])
        await asyncio.sleep(0.01)
        assert not waiter.done()  # version 1 < 2: still waiting
        await board.set("c", 2, ["two"])
        return await waiter

    assert run(scenario()) == ("ok", 2, ["two"])


def test_a_wait_that_times_out_reports_the_latest_version():
    async def scenario():
        board = Board()
        await board.open("c")
        await board.set("c", 3, ["three"])
        return await board.wait("c", 4, timeout=0.05)

    assert run(scenario()) == ("timeout", 3, None)


def test_closing_wakes_waiters_with_the_error_and_unknown_channels_read_as_closed():
    async def scenario():
        board = Board()
        await board.open("c")
        waiter = asyncio.create_task(board.wait("c", 1, timeout=5.0))
        await asyncio.sleep(0.01)
        await board.close("c", "learner failed")
        woken = await waiter
        never_opened = await board.wait("other", 0, timeout=5.0)
        await board.set("c", 5, ["late"])  # a publish after close changes nothing
        after = await board.wait("c", 0, timeout=5.0)
        return woken, never_opened, after

    woken, never_opened, after = run(scenario())
    assert woken == ("closed", None, "learner failed")
    assert never_opened == ("closed", None, None)
    assert after == ("closed", None, "learner failed")


def test_acks_keep_the_highest_version_and_forget_silent_or_forgotten_subscribers():
    async def scenario():
        board = Board()
        await board.open("c")
        await board.ack("c", "id-a", "a", 3, grace=60.0)
        await board.ack("c", "id-a", "a", 2, grace=60.0)  # an older ack never lowers it
        await board.ack("c", "id-b", "b", 1, grace=60.0)
        await board.ack("c", "id-silent", "silent", 4, grace=0.01)
        await asyncio.sleep(0.05)
        first = await board.acks("c")
        await board.forget("c", "id-b")
        return first, await board.acks("c"), await board.acks("unknown")

    first, second, unknown = run(scenario())
    assert first == {"a": 3, "b": 1}
    assert second == {"a": 3}
    assert unknown == {}


def test_subscribers_sharing_a_name_are_reported_apart_and_forgotten_alone():
    """Copies of one pickled subscriber keep its name, yet their acks are not merged into one
    entry (the highest), and the first copy to close removes only its own."""

    async def scenario():
        board = Board()
        await board.open("c")
        await board.ack("c", "copy-1", "actor", 5, grace=60.0)
        await board.ack("c", "copy-2", "actor", 2, grace=60.0)
        both = await board.acks("c")
        await board.forget("c", "copy-1")
        after_forget = await board.acks("c")
        await board.ack("c", "copy-3", "actor", 7, grace=60.0)  # the name is free again
        return both, after_forget, await board.acks("c")

    both, after_forget, reused = run(scenario())
    assert both == {"actor": 5, "actor#2": 2}
    assert after_forget == {"actor#2": 2}
    assert reused == {"actor#2": 2, "actor": 7}


def test_each_wait_is_a_heartbeat_for_as_long_as_it_waits_plus_the_grace():
    async def scenario():
        board = Board()
        await board.open("c")
        await board.ack("c", "id-r", "reader", 1, grace=0.01)
        waiter = asyncio.create_task(
            board.wait("c", 5, timeout=0.3, subscriber="id-r", name="reader", grace=0.01)
        )
        await asyncio.sleep(0.1)  # past the ack's grace, but the reader is still waiting
        during = await board.acks("c")
        await waiter
        await asyncio.sleep(0.05)  # the wait timed out and the grace ran out: silent now
        return during, await board.acks("c")

    during, after = run(scenario())
    assert during == {"reader": 1}
    assert after == {}
