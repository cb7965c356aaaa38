"""The vocabulary: boundary ordering, ``latest``, mode parsing, name validation."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warcore import (
    AlgorithmSpec,
    BackendSpec,
    BoundaryContext,
    ForwardMode,
    SharedReadBoundary,
    latest,
)
from warcore.core import RecordPoint

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated

B = SharedReadBoundary
EARLIEST_FIRST = [B.PRE_REPLAY, B.IN_REPLAY, B.POST_REPLAY, B.UNKNOWN]


def test_boundaries_are_ordered_earliest_first() -> None:
    assert sorted(reversed(EARLIEST_FIRST)) == EARLIEST_FIRST
    for earlier, later in itertools.pairwise(EARLIEST_FIRST):
        assert earlier < later and later > earlier
        assert earlier <= later and later >= earlier
        assert not later < earlier


def test_boundary_does_not_compare_with_other_types() -> None:
    with pytest.raises(TypeError):
        _ = B.PRE_REPLAY < 1  # type: ignore[operator]


def test_latest_takes_the_latest() -> None:
    assert latest(B.PRE_REPLAY, B.POST_REPLAY, B.IN_REPLAY) is B.POST_REPLAY
    assert latest(B.IN_REPLAY) is B.IN_REPLAY


def test_latest_unknown_dominates() -> None:
    assert latest(B.PRE_REPLAY, B.UNKNOWN) is B.UNKNOWN
    assert latest(B.UNKNOWN, B.POST_REPLAY) is B.UNKNOWN


def test_latest_of_nothing_is_unknown() -> None:
    assert latest() is B.UNKNOWN
    assert latest([]) is B.UNKNOWN


def test_latest_accepts_iterables_and_mixtures() -> None:
    assert latest([B.PRE_REPLAY, B.IN_REPLAY]) is B.IN_REPLAY
    assert latest(b for b in (B.PRE_REPLAY, B.POST_REPLAY)) is B.POST_REPLAY
    assert latest(B.PRE_REPLAY, [B.IN_REPLAY], (B.PRE_REPLAY,)) is B.IN_REPLAY


def test_latest_rejects_non_boundaries_naming_the_value() -> None:
    with pytest.raises(TypeError, match="'POST_REPLAY'"):
        latest([B.PRE_REPLAY, "POST_REPLAY"])  # type: ignore[list-item]


@given(st.lists(st.sampled_from(EARLIEST_FIRST)))
def test_latest_is_max_and_order_free(values: list[SharedReadBoundary]) -> None:
    result = latest(values)
    assert result is latest(list(reversed(values)))
    assert all(v <= result for v in values)
    assert result in values or (not values and result is B.UNKNOWN)


def test_record_points_map_to_the_boundary_they_are_sound_for() -> None:
    assert RecordPoint.NONE.boundary is B.UNKNOWN and not RecordPoint.NONE.publishes
    assert RecordPoint.PRE_REPLAY.boundary is B.PRE_REPLAY
    assert RecordPoint.IN_GRAPH_NODE.boundary is B.IN_REPLAY
    assert RecordPoint.AFTER_IN_GRAPH_INIT.boundary is B.IN_REPLAY
    assert RecordPoint.POST_REPLAY.boundary is B.POST_REPLAY


@pytest.mark.parametrize("mode", list(ForwardMode))
def test_forward_mode_parse_accepts_name_value_and_member(mode: ForwardMode) -> None:
    assert ForwardMode.parse(mode) is mode
    assert ForwardMode.parse(mode.name) is mode
    assert ForwardMode.parse(mode.value) is mode


def test_forward_mode_parse_error_names_value_and_lists_valid_names() -> None:
    with pytest.raises(ValueError) as info:
        ForwardMode.parse("VERIFY")
    message = str(info.value)
    assert "'VERIFY'" in message
    for mode in ForwardMode:
        assert mode.name in message


def test_shared_read_boundary_parse_error_lists_valid_names() -> None:
    assert SharedReadBoundary.parse("in_replay") is B.IN_REPLAY
    with pytest.raises(ValueError, match=r"'LATE'.*PRE_REPLAY, IN_REPLAY, POST_REPLAY, UNKNOWN"):
        SharedReadBoundary.parse("LATE")


def test_forward_mode_predicates() -> None:
    assert ForwardMode.DECODE.is_decode() and not ForwardMode.EXTEND.is_decode()
    assert ForwardMode.TARGET_VERIFY.is_target_verify()
    assert ForwardMode.DRAFT_EXTEND_V2.is_draft_extend_v2()
    assert not ForwardMode.DRAFT_EXTEND.is_draft_extend_v2()
    assert ForwardMode.EXTEND.is_extend() and not ForwardMode.DECODE.is_extend()


@pytest.mark.parametrize("bad", ["Trtllm", "has-dash", "1st", "", "x" * 65, "with space"])
def test_backend_spec_rejects_bad_names_naming_the_value(bad: str) -> None:
    with pytest.raises(ValueError, match=f"invalid backend name {bad!r}"):
        BackendSpec(bad, lambda: None)  # type: ignore[arg-type, return-value]


def test_algorithm_spec_validates_name_and_family() -> None:
    with pytest.raises(ValueError, match="invalid algorithm name 'Eagle'"):
        AlgorithmSpec("Eagle", "eagle")
    with pytest.raises(ValueError, match="invalid algorithm family name 'Dflash'"):
        AlgorithmSpec("dspark", "Dflash")


def test_backend_spec_needs_a_callable_factory() -> None:
    with pytest.raises(TypeError, match="'wctest_mine': factory must be callable"):
        BackendSpec("wctest_mine", "not callable")  # type: ignore[arg-type]


def test_boundary_context_validates_and_normalises_flags() -> None:
    with pytest.raises(ValueError, match="invalid algorithm name 'EAGLE'"):
        BoundaryContext("EAGLE")
    with pytest.raises(TypeError, match="flag 'x'"):
        BoundaryContext("none", {"x": 1.5})  # type: ignore[dict-item]
    a = BoundaryContext("none", {"b": 1, "a": True})
    b = BoundaryContext("none", {"a": True, "b": 1})
    assert a == b and hash(a) == hash(b)
    assert a.flag("a") is True and a.flag("missing") is False
    assert a != BoundaryContext("eagle", {"a": True, "b": 1})
