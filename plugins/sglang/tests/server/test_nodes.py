"""Beyond one machine's tensor parallelism: two sglang nodes (two process trees, each with its
own environment) with ``WARCORE_SGLANG_CHECK_RANKS=1``, in tensor parallel, pipeline parallel
and DP attention (``_nodes.py``). Nodes with the same plugins agree and serve; a node lacking
the plugin the other has is refused at start-up and every process of both nodes ends by
itself. DP attention does not serve on this CPU; the test asserts sglang's own error. Asserted on
each node's start-up lines and trace."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from _nodes import NodesRun, run_nodes
from _servers import WAVES, Servers
from warcore_sglang.serving import harness as serving

SAME = ("sglang,fork_late", "sglang,fork_late")
LACKING = ("sglang", "sglang,fork_late")
"""Node 0 lacks ``fork_late``, which node 1 has: they decide the fork's prefill differently."""

AGREED = re.compile(
    r"warcore: all 2 ranks resolved the same read-done decisions \((\d+) cells, (\w{12})\)"
)
REFUSED = (
    "warcore: ranks disagree on read-done decisions: rank(s) 1 differ from rank 0 "
    "(a different plugin set, plugin version or environment decides differently)"
)
SCHEDULER_ENDED = "Scheduler or DataParallelController "
"""How sglang's launcher on a node of rank >= 1 logs a scheduler that ended (then it returns)."""
CELL = "backend 'sglang_fork_native', mode EXTEND, algorithm 'none': rank 0 boundary=PRE_REPLAY"


class Nodes:
    """Each (mode, plugins) pair of nodes started once, when a test first asks for it, one
    pair at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.model = serving.write_tiny_model(root / "model")
        self.runs: dict[tuple[str, tuple[str, str]], NodesRun] = {}

    def __call__(self, mode: str, plugins: tuple[str, str]) -> NodesRun:
        key = (mode, plugins)
        if key not in self.runs:
            name = f"{mode}-{'same' if plugins == SAME else 'lacking'}"
            self.runs[key] = run_nodes(mode, plugins, self.model, self.root / name, WAVES)
            run = self.runs[key]
            up = [None if n.healthy_s is None else round(n.healthy_s, 1) for n in run.nodes]
            ended = None if run.ended_s is None else round(run.ended_s, 1)
            print(f"\n{name}: {run.seconds:.1f} s; /health after {up} s; all ended after {ended} s")
        return self.runs[key]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    yield Nodes(tmp_path_factory.mktemp("nodes"))


def _agreed(run: NodesRun) -> list[tuple[str, str]]:
    """Each node's agreement line (cells, fingerprint)."""
    found = [AGREED.findall(node.text()) for node in run.nodes]
    assert all(len(f) == 1 for f in found), [n.text()[-3000:] for n in run.nodes]
    return [f[0] for f in found]


def _active_plugins(scheduler: dict[str, object]) -> set[str]:
    plugins = scheduler["plugins"]
    assert isinstance(plugins, list)
    return {p["name"] for p in plugins if p["status"] == "active"}


def _steps(run: NodesRun, rank: int) -> list[tuple[object, ...]]:
    """A node's barriers, without what names the process: step, batch and decision."""
    keys = ("step", "mode", "rids", "record_point", "branch", "declared", "provenance")
    return [tuple(str(b.get(k)) for k in keys) for b in run.kind(rank, "barrier")]


def test_two_nodes_with_the_same_plugins_agree_and_serve_tensor_parallel(nodes: Nodes) -> None:
    run = nodes("tp", SAME)
    assert all(n.healthy_s is not None for n in run.nodes)
    assert set(run.tokens) == {r.rid for wave in WAVES for r in wave}
    # one scheduler per node, tp 0 and tp 1, each active with the plugins its node allowed
    for rank in (0, 1):
        (scheduler,) = run.schedulers(rank)
        assert scheduler["active"] is True and scheduler["rank"]["tp"] == rank, scheduler
        assert _active_plugins(scheduler) == {"warcore", "sglang", "fork_late"}
        assert scheduler["line"] in run.nodes[rank].text()
    # node 1 runs no tokenizer or detokenizer: rank 0's node does
    roles = [{r["role"] for r in run.kind(rank, "process")} for rank in (0, 1)]
    assert roles == [{"launcher", "scheduler", "detokenizer"}, {"launcher", "scheduler"}]
    (cells, first), (cells_1, second) = _agreed(run)
    assert cells == cells_1 and first == second and int(cells) > 0
    # and at run time both nodes' barriers took the same branch for the same batch
    steps = _steps(run, 0)
    assert steps and steps == _steps(run, 1)
    extend = [b for b in run.kind(1, "barrier") if b["mode"] == "EXTEND"]
    assert extend and all(b["branch"] == "wait_stream" for b in extend)
    assert all("fork_late: POST_REPLAY" in b["provenance"] for b in extend)


def test_two_nodes_with_the_same_plugins_agree_and_serve_pipeline_parallel(nodes: Nodes) -> None:
    run = nodes("pp", SAME)
    assert all(n.healthy_s is not None for n in run.nodes)
    assert set(run.tokens) == {r.rid for wave in WAVES for r in wave}
    for rank in (0, 1):
        (scheduler,) = run.schedulers(rank)
        assert scheduler["active"] is True, scheduler
        assert (scheduler["rank"]["tp"], scheduler["rank"]["pp"]) == (0, rank)
        assert _active_plugins(scheduler) == {"warcore", "sglang", "fork_late"}
    (cells, first), (cells_1, second) = _agreed(run)
    assert cells == cells_1 and first == second
    # sglang turns the overlap scheduler off under pipeline parallelism, and its pipeline
    # loop has no WAR barrier: no barrier ran on either node
    assert "Pipeline parallelism is incompatible with overlap schedule." in run.nodes[0].text()
    assert not run.kind(0, "barrier") and not run.kind(1, "barrier")


def test_two_nodes_serve_the_tokens_of_one_rank(nodes: Nodes, servers: Servers) -> None:
    # the same waves, backend and plugins on one rank (the fork_late server of _servers.py)
    one_rank = servers["fork_late"].plain()
    assert nodes("tp", SAME).tokens == one_rank
    assert nodes("pp", SAME).tokens == one_rank


@pytest.mark.parametrize("mode", ["tp", "pp", "dp_attention"])
def test_a_node_lacking_a_plugin_is_refused_and_both_nodes_end(nodes: Nodes, mode: str) -> None:
    run = nodes(mode, LACKING)
    assert all(n.healthy_s is None for n in run.nodes), "a refused node answered /health"
    assert run.left_running == [] and run.ended_s is not None, run.left_running
    assert all(n.returncode is not None for n in run.nodes)
    assert run.nodes[0].returncode != 0, run.nodes[0].text()[-3000:]
    # node 1's launcher may end either way: killed by its own SIGQUIT handler when its
    # scheduler signals a failure, or (its schedulers already ready, then gone) returning 0
    # from sglang's `block_until_scheduler_exits`, which logs each scheduler's end first
    node_1 = run.nodes[1]
    assert node_1.returncode != 0 or SCHEDULER_ENDED in node_1.text(), node_1.text()[-3000:]
    # each node's scheduler activated with its own plugins, then the check refused
    for rank, allowed in enumerate(LACKING):
        (scheduler,) = run.schedulers(rank)
        assert _active_plugins(scheduler) == {"warcore", *allowed.split(",")}
    # rank 0's node holds the store the ranks compare through: it always reads both answers
    node_0 = run.nodes[0].text()
    assert REFUSED in node_0 and "RankDisagreementError" in node_0
    assert CELL in node_0 and "rank 1 boundary=POST_REPLAY" in node_0
    assert "[plugin:sglang; plugin:sglang]" in node_0  # the fork's own declaration, on rank 0
    # and the plugin sets, naming the one node 0 lacks
    assert re.search(r"plugins on rank 0: .*fork_late=\S+ \S+ \(disabled\)", node_0)
    assert re.search(r"plugins on rank 1: .*fork_late=\S+ \S+ \(active\)", node_0)
    # node 1 names the disagreement too: no rank leaves the check before every rank has read
    # (rank 0 hosts the store; docs/sglang-nodes.md)
    assert REFUSED in node_1.text() and CELL in node_1.text(), node_1.text()[-3000:]


def test_dp_attention_nodes_agree_then_sglangs_cpu_path_fails_the_first_batch(
    nodes: Nodes,
) -> None:
    run = nodes("dp_attention", SAME)
    for rank in (0, 1):
        (scheduler,) = run.schedulers(rank)
        assert scheduler["active"] is True and scheduler["rank"]["dp"] == rank, scheduler
    # warcore's part passed: both ranks agreed at start-up ...
    (cells, first), (cells_1, second) = _agreed(run)
    assert first == second
    # ... then sglang's DP-attention padding asked the backend for a CPU-graph method only
    # its intel_amx backend has (AMX only), and the server ended before /health answered
    error = "AttributeError: 'ForkNativeAttnBackend' object has no attribute "
    error += "'get_cpu_graph_seq_len_fill_value'"
    assert all(error in n.text() for n in run.nodes)
    # node 1's dummy health server may have answered: its scheduler was ready before the batch
    assert run.nodes[0].healthy_s is None and not run.tokens
    assert run.left_running == [], run.left_running
