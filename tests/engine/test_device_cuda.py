"""The cuda device on a real GPU (skipped without one, see conftest.py).

``torch.cuda._sleep`` spins a kernel for a number of GPU clock cycles, which opens a window in
which an unordered read would see stale data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from warcore.device import Device, get_device

pytestmark = pytest.mark.cuda

# About 50 ms at the ~2 GHz clock of current data-centre GPUs.
SLOW_CYCLES = 100_000_000


def spin() -> None:
    torch.cuda._sleep(SLOW_CYCLES)  # type: ignore[no-untyped-call]


@pytest.fixture
def dev() -> Iterator[Device]:
    device = get_device("cuda")
    try:
        yield device
    finally:
        device.synchronize()
        device.close()


@pytest.mark.cuda
def test_default_device_is_cuda_on_a_gpu() -> None:
    d = get_device()
    assert d.name == "cuda"
    assert d.torch_device.type == "cuda"


@pytest.mark.cuda
def test_wait_event_orders_two_streams(dev: Device) -> None:
    a, b = dev.new_stream("a"), dev.new_stream("b")
    x = torch.zeros(1 << 20, device=dev.torch_device)
    y = torch.empty_like(x)
    dev.synchronize()

    def slow_write() -> None:
        spin()
        x.fill_(7.0)

    with dev.use_stream(a):
        dev.launch(slow_write, "slow-write")
    ev = a.record_event()
    b.wait_event(ev)
    with dev.use_stream(b):
        dev.launch(lambda: y.copy_(x), "read")
    b.synchronize()
    assert bool((y == 7.0).all())
    assert ev.query()


@pytest.mark.cuda
def test_planted_external_node_rearms_on_every_replay(dev: Device) -> None:
    fwd, sched = dev.new_stream("forward"), dev.new_stream("schedule")
    pre = torch.zeros(1, device=dev.torch_device)
    post = torch.zeros(1, device=dev.torch_device)
    replays = 3
    seen_pre = torch.zeros(replays, device=dev.torch_device)
    seen_post = torch.zeros(replays, device=dev.torch_device)
    ev = dev.new_event(external=True)

    def init() -> None:
        pre.add_(1)

    def snapshot(k: int) -> Callable[[], None]:
        def run() -> None:
            seen_pre[k].copy_(pre[0])
            seen_post[k].copy_(post[0])

        return run

    def body() -> None:
        spin()
        post.add_(1)

    with dev.use_stream(fwd):
        # Warm-up outside the capture, so no lazy initialisation happens while capturing.
        dev.launch(init)
        dev.launch(body)
        dev.synchronize()
        pre.zero_()
        post.zero_()
        dev.synchronize()

        graph = dev.new_graph()
        with dev.capture(graph):
            assert dev.is_capturing()
            dev.launch(init, "in-graph init")
            ev.record()  # the planted node
            dev.launch(body, "body")
        assert not dev.is_capturing()

        for k in range(replays):
            graph.replay()
            sched.wait_event(ev)  # binds to this replay's node
            with dev.use_stream(sched):
                dev.launch(snapshot(k), f"snapshot-{k}")
    dev.synchronize()

    # Each wait released right after its own replay's init: not before it (a stale node) and
    # not only at the end of the body (no node at all).
    assert seen_pre.tolist() == [1.0, 2.0, 3.0]
    assert seen_post.tolist() == [0.0, 1.0, 2.0]
    assert pre.item() == replays
    assert post.item() == replays


@pytest.mark.cuda
def test_capture_from_the_default_stream_uses_a_side_stream(dev: Device) -> None:
    x = torch.zeros(4, device=dev.torch_device)
    dev.launch(lambda: x.add_(1))  # warm-up
    dev.synchronize()
    graph = dev.new_graph()
    with dev.capture(graph):
        assert dev.current_stream().name != "default"
        dev.launch(lambda: x.mul_(2))
    assert dev.current_stream().name == "default"
    graph.replay()
    graph.replay()
    dev.synchronize()
    assert x.tolist() == [4.0, 4.0, 4.0, 4.0]


@pytest.mark.cuda
def test_cuda_records_carry_their_forward_and_replayed_nodes_rebind(dev: Device) -> None:
    """Issue 20 on the cuda device (written like the sim test; untested without a GPU): a
    plain record and each replay of an in-graph node carry the forward current on the host,
    and a wait returns the record it bound to."""
    fwd, copy = dev.new_stream("forward"), dev.new_stream("copy")
    ev = dev.new_event()
    a = dev.begin_forward(1, "target", "DECODE")
    ev.record(fwd)
    bound = copy.wait_event(ev)
    assert bound is not None and bound.forward == a
    node, graph = dev.new_event(external=True), dev.new_graph()
    x = torch.zeros(4, device=dev.torch_device)
    with dev.use_stream(fwd):
        with dev.capture(graph):
            dev.launch(lambda: x.add_(1), "body")
            node.record()
        n = dev.begin_forward(2, "target", "DECODE")
        graph.replay()
        n1 = dev.begin_forward(3, "target", "DECODE")
        graph.replay()
    late = copy.wait_event(node)
    assert late is not None and late.forward == n1 and late.forward != n
