"""The sim device is a real implementation of CUDA's ordering rules: these tests run real work
on real worker threads and check the order in which side effects happen.

Every blocking call goes through ``bounded`` or a ``threading.Event.wait`` with a timeout, so a
bug fails a test instead of hanging the run.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from warcore.device import DEVICE_NAMES, Device, DeviceError, Stream, get_device

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

TIMEOUT_S = 5.0


def bounded(fn: Callable[[], object], timeout: float = TIMEOUT_S) -> None:
    """Run a host call that may block, failing the test if it does not return in time."""
    error: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            error.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn!r} did not return within {timeout} s"
    if error:
        raise error[0]


@pytest.fixture
def dev() -> Iterator[Device]:
    device = get_device("sim")
    try:
        yield device
    finally:
        device.close()


class Log:
    """A thread-safe ordered record of side effects."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[str] = []

    def add(self, item: str) -> None:
        with self._lock:
            self.items.append(item)

    def fn(self, item: str) -> Callable[[], None]:
        return lambda: self.add(item)


def steps(*fns: Callable[[], object]) -> Callable[[], None]:
    """One work item that runs ``fns`` in order."""

    def run() -> None:
        for fn in fns:
            fn()

    return run


def sleep(seconds: float) -> Callable[[], None]:
    return lambda: time.sleep(seconds)


def wait_for(gate: threading.Event) -> Callable[[], object]:
    return lambda: gate.wait(TIMEOUT_S)


def launch_on(dev: Device, stream: Stream, fn: Callable[[], object], label: str = "") -> None:
    with dev.use_stream(stream):
        dev.launch(fn, label)


def test_wait_on_never_recorded_event_does_not_block(dev: Device) -> None:
    ev = dev.new_event()
    b = dev.new_stream("b")
    b.wait_event(ev)
    ran = threading.Event()
    launch_on(dev, b, ran.set)
    assert ran.wait(TIMEOUT_S)
    assert ev.query()
    bounded(ev.synchronize)


def test_rerecorded_event_binds_latest_generation_on_one_stream(dev: Device) -> None:
    log = Log()
    a, b = dev.new_stream("a"), dev.new_stream("b")
    ev = dev.new_event()
    launch_on(dev, a, log.fn("a1"))
    ev.record(a)  # generation 1: reached at once
    launch_on(dev, a, steps(sleep(0.3), log.fn("a2")))
    ev.record(a)  # generation 2: after the slow segment
    b.wait_event(ev)
    launch_on(dev, b, log.fn("b"))
    bounded(dev.synchronize)
    # Bound to generation 1, b would have run during a's 0.3 s sleep, before a2.
    assert log.items == ["a1", "a2", "b"]


def test_rerecorded_event_binds_latest_generation_across_streams(dev: Device) -> None:
    """Generation 2 completes before generation 1; a wait bound to 2 must not wait for 1."""
    log = Log()
    a, c, b = dev.new_stream("a"), dev.new_stream("c"), dev.new_stream("b")
    ev = dev.new_event()
    gate = threading.Event()
    launch_on(dev, a, steps(wait_for(gate), log.fn("a")))
    ev.record(a)  # generation 1: held back by the gate
    launch_on(dev, c, log.fn("c"))
    ev.record(c)  # generation 2
    b.wait_event(ev)
    b_ran = threading.Event()
    launch_on(dev, b, steps(log.fn("b"), b_ran.set))
    assert b_ran.wait(TIMEOUT_S), "the wait is stuck on generation 1"
    gate.set()
    bounded(dev.synchronize)
    assert log.items == ["c", "b", "a"]


def test_later_rerecord_does_not_change_an_earlier_wait(dev: Device) -> None:
    log = Log()
    a, b = dev.new_stream("a"), dev.new_stream("b")
    ev = dev.new_event()
    gate = threading.Event()
    launch_on(dev, a, log.fn("a1"))
    ev.record(a)
    b.wait_event(ev)  # bound to generation 1
    launch_on(dev, a, steps(wait_for(gate), log.fn("a2")))
    ev.record(a)  # generation 2, held back by the gate
    b_ran = threading.Event()
    launch_on(dev, b, steps(log.fn("b"), b_ran.set))
    assert b_ran.wait(TIMEOUT_S), "the earlier wait moved to the later generation"
    assert not ev.query()  # the latest generation is still pending
    gate.set()
    bounded(ev.synchronize)
    assert ev.query()
    assert log.items == ["a1", "b", "a2"]


def test_wait_event_orders_a_read_after_a_slow_write(dev: Device) -> None:
    a, b = dev.new_stream("a"), dev.new_stream("b")
    x = torch.zeros(1024)
    seen: list[float] = []

    def slow_write() -> None:
        time.sleep(0.2)
        x.fill_(7.0)

    launch_on(dev, a, slow_write)
    ev = a.record_event()
    b.wait_event(ev)
    launch_on(dev, b, lambda: seen.append(float(x.sum())))
    bounded(b.synchronize)
    assert seen == [7.0 * 1024]


def test_wait_stream_orders_after_everything_enqueued_before(dev: Device) -> None:
    a, b = dev.new_stream("a"), dev.new_stream("b")
    log = Log()
    for i in range(5):
        launch_on(dev, a, steps(sleep(0.03), log.fn(f"a{i}")))
    b.wait_stream(a)
    launch_on(dev, b, log.fn("b"))
    launch_on(dev, a, steps(sleep(0.2), log.fn("a-late")))  # not waited for
    bounded(dev.synchronize)
    assert log.items == ["a0", "a1", "a2", "a3", "a4", "b", "a-late"]


def test_external_node_rearms_on_every_replay(dev: Device) -> None:
    fwd, sched = dev.new_stream("forward"), dev.new_stream("schedule")
    log = Log()
    ev = dev.new_event(external=True)
    replay_no = itertools.count()
    post_no = itertools.count()
    sched_ran = [threading.Event() for _ in range(3)]
    graph = dev.new_graph()

    def post() -> None:
        k = next(post_no)
        # Holds the rest of replay k until the scheduler's work bound to node k has run: if the
        # wait were bound to a later node this times out and the order check below fails.
        sched_ran[k].wait(TIMEOUT_S)
        log.add(f"post{k}")

    with dev.use_stream(fwd):
        with dev.capture(graph):
            assert dev.is_capturing()
            dev.launch(lambda: log.add(f"pre{next(replay_no)}"), "in-graph init")
            ev.record()  # the planted node
            dev.launch(post, "body")
        assert not dev.is_capturing()
        assert log.items == []  # capture records work, it does not run it

        for k in range(3):
            graph.replay()
            sched.wait_event(ev)  # binds to this replay's node
            launch_on(dev, sched, steps(log.fn(f"s{k}"), sched_ran[k].set))
    bounded(dev.synchronize)
    assert log.items == ["pre0", "s0", "post0", "pre1", "s1", "post1", "pre2", "s2", "post2"]


def test_raising_work_makes_the_stream_sticky_failed(dev: Device) -> None:
    a, b = dev.new_stream("a"), dev.new_stream("b")
    log = Log()
    before = a.record_event()
    launch_on(dev, a, lambda: 1 / 0, "bad-kernel")
    launch_on(dev, a, log.fn("after"), "skipped")
    launch_on(dev, a, lambda: [][0], "second-bad")  # skipped too, so not the reported error
    after = a.record_event()
    b.wait_event(after)
    released = threading.Event()
    launch_on(dev, b, released.set)
    assert released.wait(TIMEOUT_S), "a waiter on the failed stream's event hangs"

    for sync in (a.synchronize, a.synchronize, dev.synchronize, after.synchronize):
        with pytest.raises(DeviceError, match=r"'a'.*'bad-kernel'") as info:
            bounded(sync)
        assert isinstance(info.value.__cause__, ZeroDivisionError)
    bounded(before.synchronize)  # recorded before the failure: clean
    bounded(b.synchronize)  # the other stream is not poisoned
    assert log.items == []


def test_two_streams_overlap_in_time(dev: Device) -> None:
    a, b = dev.new_stream("a"), dev.new_stream("b")
    per_stream_s = 0.3
    for s in (a, b):
        for _ in range(3):
            launch_on(dev, s, sleep(per_stream_s / 3))
    t0 = time.perf_counter()
    bounded(dev.synchronize)
    wall = time.perf_counter() - t0
    assert wall < 0.8 * (2 * per_stream_s), f"streams ran serially: {wall:.3f} s"


def test_current_stream_is_per_host_thread(dev: Device) -> None:
    a = dev.new_stream("a")
    seen: list[str] = []
    with dev.use_stream(a):
        assert dev.current_stream() is a
        t = threading.Thread(target=lambda: seen.append(dev.current_stream().name))
        t.start()
        t.join(TIMEOUT_S)
    assert seen == ["default"]
    assert dev.current_stream() is dev.current_stream()
    assert dev.current_stream().name == "default"


def test_span_sink_reports_each_work_item(dev: Device) -> None:
    spans: list[tuple[str, str, float, float]] = []
    dev.set_span_sink(lambda s, label, t0, t1: spans.append((s, label, t0, t1)))
    a = dev.new_stream("a")
    launch_on(dev, a, sleep(0.01), "k1")
    launch_on(dev, a, lambda: None, "k2")
    bounded(dev.synchronize)
    assert [(s, label) for s, label, _, _ in spans] == [("a", "k1"), ("a", "k2")]
    assert spans[0][3] - spans[0][2] >= 0.009
    assert spans[0][3] <= spans[1][2]


def test_capture_misuse_raises(dev: Device) -> None:
    graph = dev.new_graph()
    with pytest.raises(DeviceError, match="never captured"):
        graph.replay()
    other = dev.new_stream("other")
    with dev.capture(graph):
        with pytest.raises(DeviceError, match="external=True"):
            dev.new_event().record()
        with pytest.raises(DeviceError, match="capturing"):
            dev.current_stream().wait_event(dev.new_event())
        with pytest.raises(DeviceError, match="capturing"):
            dev.synchronize()
        with pytest.raises(DeviceError, match="already"), dev.capture(dev.new_graph()):
            pass
        dev.launch(lambda: None)
        other_ran = threading.Event()
        launch_on(dev, other, other_ran.set)  # other streams keep running during a capture
        assert other_ran.wait(TIMEOUT_S)
    with pytest.raises(DeviceError, match="already captured"), dev.capture(graph):
        pass

    empty = dev.new_graph()
    with dev.capture(empty):
        pass
    with pytest.raises(DeviceError, match="empty"):
        empty.replay()


def test_failed_capture_body_leaves_graph_unreplayable(dev: Device) -> None:
    graph = dev.new_graph()
    with pytest.raises(KeyError), dev.capture(graph):
        dev.launch(lambda: None)
        raise KeyError("body")
    assert not dev.is_capturing()
    with pytest.raises(DeviceError, match="never captured"):
        graph.replay()


def test_device_names_and_errors() -> None:
    assert DEVICE_NAMES == ("sim", "cuda")
    with pytest.raises(ValueError, match=r"^unknown device 'x'; valid: sim, cuda$"):
        get_device("x")
    d1, d2 = get_device("sim"), get_device("sim")
    try:
        assert d1 is not d2
        assert d1.name == "sim"
        assert d1.torch_device == torch.device("cpu")
        with pytest.raises(DeviceError, match="another device"), d1.use_stream(d2.new_stream("x")):
            pass
    finally:
        d1.close()
        d2.close()
    if not torch.cuda.is_available():
        assert get_device().name == "sim"
        with pytest.raises(DeviceError, match="no CUDA GPU"):
            get_device("cuda")


def test_close_is_idempotent_and_final() -> None:
    with get_device("sim") as d:
        ran = threading.Event()
        d.launch(ran.set)
        assert ran.wait(TIMEOUT_S)
    d.close()
    with pytest.raises(DeviceError, match="closed"):
        d.launch(lambda: None)


# -- a property over random programs -------------------------------------------------------

_N_STREAMS = 3
_N_EVENTS = 2
_stream = st.integers(0, _N_STREAMS - 1)
_event = st.integers(0, _N_EVENTS - 1)
_op = st.one_of(
    st.tuples(st.just("work"), _stream, st.sampled_from([0.0, 0.001, 0.003])),
    st.tuples(st.just("record"), _stream, _event),
    st.tuples(st.just("wait"), _stream, _event),
)


@settings(max_examples=30, deadline=None)
@given(st.lists(_op, max_size=25))
def test_random_programs_respect_fifo_and_event_order(program: list[tuple[str, int, Any]]) -> None:
    """Every wait orders all work its bound record follows before all work after the wait."""
    clock = itertools.count()  # next() on a count is atomic under the GIL
    spans: dict[int, tuple[int, int]] = {}

    def work(wid: int, seconds: float) -> Callable[[], None]:
        def run() -> None:
            start = next(clock)
            time.sleep(seconds)
            spans[wid] = (start, next(clock))

        return run

    per_stream: list[list[int]] = [[] for _ in range(_N_STREAMS)]
    # Host-side model: an event's latest record is "everything on stream s up to index n".
    latest: list[tuple[int, int] | None] = [None] * _N_EVENTS
    # (work ids that must finish, stream, index of the first work that must start after them)
    edges: list[tuple[list[int], int, int]] = []
    with get_device("sim") as d:
        streams = [d.new_stream(f"s{i}") for i in range(_N_STREAMS)]
        events = [d.new_event() for _ in range(_N_EVENTS)]
        for wid, (kind, s, arg) in enumerate(program):
            if kind == "work":
                launch_on(d, streams[s], work(wid, arg))
                per_stream[s].append(wid)
            elif kind == "record":
                events[arg].record(streams[s])
                latest[arg] = (s, len(per_stream[s]))
            else:
                streams[s].wait_event(events[arg])
                bound = latest[arg]
                if bound is not None:
                    src, n = bound
                    edges.append((per_stream[src][:n], s, len(per_stream[s])))
        bounded(d.synchronize)

    for ids in per_stream:
        for earlier, later in itertools.pairwise(ids):
            assert spans[earlier][1] < spans[later][0]
    for before, s, first_after in edges:
        for later in per_stream[s][first_after:]:
            for earlier in before:
                assert spans[earlier][1] < spans[later][0], (earlier, later, program)
