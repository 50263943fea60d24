"""The typed event queue (``replay/eventq.py``) pops what SimPy's heap pops, in its order."""

from __future__ import annotations

import heapq
import importlib

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st
from simpy.core import EmptySchedule

from kbtrace.replay import eventq
from kbtrace.replay.fabric.core import environment, status

MODS = ["kbtrace.replay.eventq", "kbtrace.replay.fabric._eventq_c"]


def _mod(name: str):
    if name.endswith("_c") and status()[1] != "compiled":
        pytest.skip("the compiled core is not built")
    return importlib.import_module(name)


# a script of pushes (time, priority) and pops (None); times from a small set, so ties abound
_STEP = st.one_of(st.none(), st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.0 + 2 ** -40, 3.0]),
                                       st.sampled_from([-1, 0, 1])))


@pytest.mark.parametrize("name", MODS)
@settings(max_examples=200, deadline=None)
@given(script=st.lists(_STEP, max_size=3000))
def test_the_queue_pops_in_simpys_heap_order(name, script):
    q = _mod(name).EventQueue()
    ref: list = []

    class Env:
        _now = -1.0

    env, eid, got, want = Env(), 0, [], []
    for step in script:
        if step is None:
            if ref:
                t, _p, _i, ev = heapq.heappop(ref)
                want.append((t, ev))
                ev = q.pop(env)
                got.append((env._now, ev))
            continue
        t, prio = step
        q.push(t, prio, eid)
        heapq.heappush(ref, (t, prio, eid, eid))
        eid += 1
    assert len(q) == len(ref)
    assert [(t, p, i) for t, p, i, _ in q.entries()] == sorted((t, p, i) for t, p, i, _ in ref)
    while ref:
        t, _p, _i, ev = heapq.heappop(ref)
        want.append((t, ev))
        ev = q.pop(env)
        got.append((env._now, ev))
    assert got == want
    with pytest.raises(EmptySchedule):
        q.pop(env)


@pytest.mark.parametrize("name", MODS)
def test_the_queue_grows_past_its_first_buffer_and_refuses_odd_priorities(name):
    q = _mod(name).EventQueue()
    for i in range(5000):
        q.push(float((i * 7919) % 5000), 1, i)
    assert q.peek() == 0.0 and len(q) == 5000

    class Env:
        _now = 0.0

    out = [q.pop(Env) for _ in range(5000)]
    assert out == sorted(range(5000), key=lambda i: (i * 7919) % 5000)
    assert q.peek() == float("inf")
    with pytest.raises(ValueError, match="event priority 9 outside -8..7"):
        q.push(1.0, 9, "x")


def _script(env: simpy.Environment, log: list) -> None:
    """Processes, timeouts, events succeeded from callbacks, a condition and a failure caught:
    what the replay asks of SimPy."""
    def worker(i):
        for k in range(4):
            yield env.timeout((i * 3 + k) % 4 * 0.5)
            log.append((env.now, "w", i, k))
        return i

    def waiter(procs):
        got = yield env.all_of(procs)
        log.append((env.now, "all", sorted(got.values())))
        ev = env.event()
        env.timeout(0.25).callbacks.append(lambda _e: ev.succeed("late"))
        log.append((env.now, "ev", (yield ev)))
        bad = env.event()
        bad.fail(ValueError("boom"))
        try:
            yield bad
        except ValueError as exc:
            log.append((env.now, "caught", str(exc)))

    procs = [env.process(worker(i)) for i in range(6)]
    env.process(waiter(procs))


@pytest.mark.parametrize("make", ["plain", *MODS])
def test_env_runs_simpy_processes_as_simpy_does(make):
    want: list = []
    ref = simpy.Environment()
    _script(ref, want)
    ref.run()
    env = eventq.plain_env() if make == "plain" else _mod(make).Env()
    got: list = []
    _script(env, got)
    assert env.peek() == 0.0
    env.run()
    assert got == want and env.now == ref.now == 3.25
    assert env.peek() == float("inf")
    with pytest.raises(EmptySchedule):
        env.step()


@pytest.mark.parametrize("name", MODS)
def test_env_runs_until_a_time_and_resumes(name):
    env = _mod(name).Env()
    log: list = []
    _script(env, log)
    env.run(until=1.0)
    assert env.now == 1.0 and all(t < 1.0 for t, *_ in log)
    env.run()
    want: list = []
    ref = simpy.Environment()
    _script(ref, want)
    ref.run()
    assert log == want


@pytest.mark.parametrize("name", MODS)
def test_an_unhandled_failure_crashes_the_env_as_simpy_does(name):
    env = _mod(name).Env()
    env.event().fail(KeyError("lost"))
    with pytest.raises(KeyError, match="lost"):
        env.run()


def test_fast_mode_gets_the_compiled_queue_with_the_compiled_core():
    env = environment()
    if status()[1] == "compiled":
        assert type(env).__module__ == "kbtrace.replay.fabric._eventq_c"
        assert type(env._queue).__name__ == "EventQueue"
    else:
        assert type(env._queue) is eventq.HeapQueue
