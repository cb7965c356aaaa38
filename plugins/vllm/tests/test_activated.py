"""warcore-vllm active makes sound what the audit found unsound: the audit re-run with the
activation installed (its real patches, on vLLM's real classes) against the audit without it;
the ring's depth each configuration gets; what warcore adds never takes vLLM down, and goes
back exactly."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from warcore_vllm import activation, audit
from warcore_vllm.activation import _bounds
from warcore_vllm.audit import _mrv2, _v2checks
from warcore_vllm.audit._verdict import SOUND, VIOLATION
from warcore_vllm.gate import current, installed_version

V2_RUNNER = "vllm.v1.worker.gpu.model_runner"
WARMUP = "vllm.v1.worker.gpu.warmup"


UNPATCHED = frozenset({"deferred-free", "swa-settled"})
"""Checks of the scheduler, which the activation does not watch, let alone patch: the same
code runs with it or without (``python -m warcore_vllm.audit --activated`` runs them)."""


@pytest.fixture(scope="module")
def activated() -> tuple[int, str, list[audit.Verdict]]:
    """Every check of the installed release but the scheduler's with the activation
    installed, reported as ``python -m warcore_vllm.audit --activated`` reports it."""
    verdicts = audit.audit(activated=True, skip=UNPATCHED)
    status, text = audit.report(verdicts, activated=True)
    assert not activation.is_installed()  # the audit took it off again
    return status, text, verdicts


def test_what_the_audit_found_unsound_is_sound_with_warcore_active(
    command: tuple[int, str, list[audit.Verdict]],
    activated: tuple[int, str, list[audit.Verdict]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each violation vLLM leaves is either made sound by the activation or named, in its
    verdict's line, as one warcore cannot fix; nothing else changes verdict."""
    status, text, verdicts = activated
    with capsys.disabled():
        print("\n$ python -m warcore_vllm.audit --activated\n" + text, end="")
    release = current()
    assert set(release.fixes) | set(release.unfixable) == set(release.expected)
    assert not set(release.fixes) & set(release.unfixable)
    without = {(v.check, v.key): v for v in command[2]}
    with_warcore = {(v.check, v.key): v for v in verdicts}
    for key in release.fixes:
        assert without[key].verdict == VIOLATION, without[key].line()
        assert with_warcore[key].verdict == SOUND, with_warcore[key].line()
        said = f"{with_warcore[key].line()}; made sound by warcore: {release.fixes[key]}"
        assert said in text.splitlines(), said
    for key in release.unfixable:  # said in its line
        assert with_warcore[key].verdict == VIOLATION
        said = f"; left as vLLM ships it (warcore cannot fix it: {release.unfixable[key]})"
        assert with_warcore[key].line() + said in text.splitlines()
    unchanged = set(with_warcore) - set(release.expected)
    assert {k: with_warcore[k].verdict for k in unchanged} == {
        k: without[k].verdict for k in unchanged
    }
    assert set(without) - set(with_warcore) == {k for k in without if k[0] in UNPATCHED}
    assert status == 0 and text.splitlines()[0].startswith(
        f"warcore-vllm audit of vLLM {installed_version()} "
    )
    assert "warcore active: ring depth: at least uses per step x steps in flight" in text


def test_each_fix_is_what_the_activated_verdict_shows(
    activated: tuple[int, str, list[audit.Verdict]],
) -> None:
    """The drafter's configuration runs with a ring of 3, two microbatches with 4; the
    back-to-back warmup, called twice, synchronizes 16 times: before each of its 10 steps,
    after each call's cleanup step (it schedules no tokens: 2), vLLM's own one at the end of
    each call (2) and warcore's after each call (2); without warcore, vLLM's 2 only."""
    by = {(v.check, v.key): v for v in activated[2]}
    drafter = by["ring-step", "speculative decoding (drafter)"].detail
    assert "depth 3, batch queue 2" in drafter and "needs 3" in drafter
    microbatches = by["ring-step", "DeepSeek V4.1 state: 2 microbatches"].detail
    assert (
        "depth 4, batch queue 2" in microbatches and "at most 2 per pool per step" in microbatches
    )
    warmup = by["warmup", "_warmup_kernels"].detail
    assert "10 synthetic steps" in warmup and "16 device synchronizes inside" in warmup


PP_V2 = pytest.mark.skipif(
    installed_version() == "0.33.0",
    reason="vLLM 0.33.0 resolves use_v2_model_runner to False on this CPU: its "
    "max_concurrent_batches under pipeline parallelism is the V1 runner's",
)


def _config(**shape: Any) -> Any:
    return _mrv2._config(_mrv2.Shape("a configuration", **shape))


@pytest.mark.parametrize(
    ("shape", "depth", "why"),
    [
        ({}, 2, ()),
        ({"speculative_tokens": 2}, 3, (_bounds.DRAFTER,)),
        ({"microbatches": 2}, 4, ("2 microbatches: the model state stages 2 times a step",)),
        ({"speculative_tokens": 2, "microbatches": 2}, 6, ("2 microbatches", _bounds.DRAFTER)),
        pytest.param({"pipeline_parallel": 2}, 3, (), marks=PP_V2),
        pytest.param(
            {"pipeline_parallel": 2, "speculative_tokens": 2}, 4, (_bounds.DRAFTER,), marks=PP_V2
        ),
    ],
    ids=["default", "drafter", "2 microbatches", "both", "PP 2", "PP 2 + drafter"],
)
def test_the_ring_is_as_deep_as_the_configuration_needs(
    shape: dict[str, Any], depth: int, why: tuple[str, ...]
) -> None:
    """vLLM's VllmConfig of each configuration: uses per step x steps in flight (vLLM's own
    max(2, max_concurrent_batches) where that is as much: PP 2 with async keeps 3 in flight)."""
    vllm = 3 if shape.get("pipeline_parallel") else 2
    decided = _bounds.ring_depth(_config(**shape), vllm)
    assert (decided.vllm, decided.depth) == (vllm, depth)
    assert len(decided.reasons) == len(why)
    assert all(r.startswith(w) for r, w in zip(decided.reasons, why, strict=True))


@pytest.fixture
def installed() -> Iterator[None]:
    activation.install()
    try:
        yield
    finally:
        activation.uninstall()


def _depth(**shape: Any) -> int:
    ring = _v2checks.run(_mrv2.Shape("a runner", **shape), lambda v2: None)
    return ring.depth


def test_the_runner_gets_the_depth_and_vllms_own_calls_are_its_own(installed: None) -> None:
    """Built with the activation, a drafter's runner sizes its pools at 3; the default one at
    vLLM's 2; and vLLM's set_default_max_concurrency outside a runner's __init__ is vLLM's."""
    import vllm.v1.worker.gpu.buffer_utils as buffers

    module = sys.modules[V2_RUNNER]
    assert _depth(speculative_tokens=2) == 3 and _depth() == 2
    saved = buffers._DEFAULT_MAX_CONCURRENCY
    try:
        module.set_default_max_concurrency(5)
        assert buffers._DEFAULT_MAX_CONCURRENCY == 5
        module.set_default_max_concurrency(1)
        assert buffers._DEFAULT_MAX_CONCURRENCY == 2  # vLLM's max(2, n)
    finally:
        buffers._DEFAULT_MAX_CONCURRENCY = saved


def test_a_failure_of_what_warcore_adds_keeps_vllm_going_and_takes_warcore_off(
    installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The depth rule raising inside vLLM's GPUModelRunner.__init__: the runner is built with
    vLLM's own depth, and the activation takes itself off, saying why."""

    def broken(config: Any, vllm: int) -> Any:
        raise RuntimeError("no depth")

    monkeypatch.setattr(_bounds, "ring_depth", broken)
    assert _depth(speculative_tokens=2) == 2
    reason = activation.taken_off()
    assert not activation.is_installed() and reason is not None
    assert "warcore's ring depth: RuntimeError: no depth" in reason
    assert reason.endswith("vLLM's own guards apply")


def _patched_attributes() -> list[tuple[Any, str]]:
    runner = sys.modules[V2_RUNNER]
    warmup = sys.modules[WARMUP]
    owners = [(runner.GPUModelRunner, "__init__"), (runner.GPUModelRunner, "execute_model")]
    owners += [(runner, "set_default_max_concurrency")]
    owners += [(warmup, name) for name in current().unsynced_warmups]
    for name, binders in current().warmup_bindings.items():
        owners += [(sys.modules[b], name) for b in binders if b in sys.modules]
    return owners


def test_every_patch_calls_vllms_own_code_and_goes_back_exactly() -> None:
    from warcore.integration.patching import unwrap

    attributes = _patched_attributes()
    before = [vars(owner)[name] for owner, name in attributes]
    activation.install()
    try:
        after = [vars(owner)[name] for owner, name in attributes]
        assert all(a is not b and unwrap(a) is b for a, b in zip(after, before, strict=True))
    finally:
        activation.uninstall()
    assert all(vars(o)[n] is b for (o, n), b in zip(attributes, before, strict=True))


@pytest.mark.skipif(
    not current().warmup_bindings, reason=f"vLLM {installed_version()}: no warmup bound by name"
)
def test_a_module_that_imported_a_warmup_by_name_calls_the_synchronized_one() -> None:
    """0.33.0's attention warmup imports run_mixed_prefill_decode_warmup by name, here before
    the activation is installed: its binding is the synchronized function too, and vLLM's
    own again once the activation is off."""
    from vllm.model_executor.warmup import attention_warmup

    name = "run_mixed_prefill_decode_warmup"
    original = vars(attention_warmup)[name]
    activation.install()
    try:
        assert vars(attention_warmup)[name] is vars(sys.modules[WARMUP])[name] is not original
        assert vars(attention_warmup)[name].__warcore_original__ is original
    finally:
        activation.uninstall()
    assert vars(attention_warmup)[name] is vars(sys.modules[WARMUP])[name] is original
