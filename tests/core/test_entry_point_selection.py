"""Which entry points load (``select_entry_points``): the allowlist, the block list, the
reserved name and duplicate names, decided on plain data, with no distribution installed.

The loader's tests with installed (fake) distributions are in test_plugin_loading.py and
test_plugin_restrictions.py; these pin the policy itself, case by case.
"""

from __future__ import annotations

import pytest

from warcore.core._select import Candidate, Selection, select_entry_points

# no installed plugin reaches these (checked): the matrix cells leave them to the main job
pytestmark = pytest.mark.isolated


def _outcome(selection: Selection, candidates: list[Candidate]) -> list[tuple[str, str, str]]:
    """(distribution:entry point, action, reason) in the order the loader acts."""
    return [
        (f"{candidates[v.index].distribution}:{candidates[v.index].name}", v.action, v.reason or "")
        for v in selection.verdicts
    ]


def test_without_lists_everything_loads_in_sorted_order() -> None:
    candidates = [Candidate("zeta", "dist-z"), Candidate("alpha", "dist-a"), Candidate("mid", None)]
    selection = select_entry_points(candidates, None)
    assert [candidates[v.index].name for v in selection.verdicts] == ["alpha", "mid", "zeta"]
    assert {v.action for v in selection.verdicts} == {"load"}
    assert selection.unknown == () and selection.problems == ()


def test_an_empty_allowlist_loads_nothing() -> None:
    candidates = [Candidate("one", "d1"), Candidate("two", "d2")]
    outcome = _outcome(select_entry_points(candidates, frozenset()), candidates)
    assert outcome == [
        ("d1:one", "disabled", "not listed in WARCORE_PLUGINS"),
        ("d2:two", "disabled", "not listed in WARCORE_PLUGINS"),
    ]


def test_an_allowlist_entry_names_an_entry_point_or_a_distribution_normalised() -> None:
    candidates = [
        Candidate("fast_decl", "warcore-fast"),
        Candidate("slow", "warcore-slow"),
        Candidate("other", "warcore-other"),
    ]
    # warcore_slow matches the distribution warcore-slow (PEP 503); FAST-DECL the entry point.
    selection = select_entry_points(candidates, {"warcore_slow", "FAST-DECL"})
    actions = {candidates[v.index].name: v.action for v in selection.verdicts}
    assert actions == {"fast_decl": "load", "slow": "load", "other": "disabled"}


def test_an_ambiguous_bare_name_admits_none_and_is_a_problem() -> None:
    candidates = [Candidate("shared", "dist-a"), Candidate("shared", "dist-b")]
    selection = select_entry_points(candidates, {"shared"})
    assert [v.action for v in selection.verdicts] == ["disabled", "disabled"]
    assert {v.reason for v in selection.verdicts} == {"WARCORE_PLUGINS entry 'shared' is ambiguous"}
    (problem,) = selection.problems
    assert "'dist-a', 'dist-b'" in problem and "DISTRIBUTION:ENTRY_POINT" in problem


def test_dist_colon_entry_point_picks_one_of_two_and_the_other_cannot_take_its_place() -> None:
    candidates = [Candidate("shared", "dist-a"), Candidate("shared", "dist-b")]
    outcome = _outcome(select_entry_points(candidates, {"dist-b:shared"}), candidates)
    assert outcome == [
        ("dist-a:shared", "disabled", "not listed in WARCORE_PLUGINS"),
        ("dist-b:shared", "load", ""),
    ]


def test_unknown_allowlist_entries_are_reported_sorted() -> None:
    selection = select_entry_points([Candidate("real", "d")], {"zz_missing", "aa_missing", "real"})
    assert selection.unknown == ("aa_missing", "zz_missing")


def test_the_block_list_blocks_before_import_even_when_ambiguous() -> None:
    candidates = [
        Candidate("shared", "dist-a"),
        Candidate("shared", "dist-b"),
        Candidate("keep", "dist-c"),
    ]
    outcome = _outcome(select_entry_points(candidates, None, {"shared"}), candidates)
    assert outcome == [
        ("dist-a:shared", "disabled", "blocked by WARCORE_DISABLE_PLUGINS"),
        ("dist-b:shared", "disabled", "blocked by WARCORE_DISABLE_PLUGINS"),
        ("dist-c:keep", "load", ""),
    ]


def test_the_core_name_is_reserved() -> None:
    candidates = [Candidate("warcore", "warcore-squat"), Candidate("fine", "d")]
    outcome = _outcome(select_entry_points(candidates, None), candidates)
    assert outcome[0] == (
        "warcore-squat:warcore",
        "failed",
        "entry-point name 'warcore' is the core's own plugin name; not loaded",
    )
    assert outcome[1] == ("d:fine", "load", "")


def test_a_duplicate_entry_point_name_loads_from_neither_distribution() -> None:
    candidates = [Candidate("twin", "dist-b"), Candidate("twin", "dist-a"), Candidate("solo", "d")]
    outcome = _outcome(select_entry_points(candidates, None), candidates)
    assert [o[:2] for o in outcome] == [
        ("d:solo", "load"),
        ("dist-a:twin", "failed"),
        ("dist-b:twin", "failed"),
    ]
    assert all("distributions 'dist-a' and 'dist-b'" in o[2] for o in outcome[1:])


def test_refusals_come_before_the_admitted_ones() -> None:
    # The loader lists what the lists refuse first, then loads the rest, each group sorted.
    candidates = [Candidate("b_loads", "d1"), Candidate("a_blocked", "d2"), Candidate("c", "d3")]
    selection = select_entry_points(candidates, None, {"a_blocked", "c"})
    names = [(candidates[v.index].name, v.action) for v in selection.verdicts]
    assert names == [("a_blocked", "disabled"), ("c", "disabled"), ("b_loads", "load")]


def test_every_candidate_gets_exactly_one_verdict() -> None:
    candidates = [Candidate(n, d) for n in ("x", "y", "warcore") for d in ("p", "q", None)]
    for allow in (None, frozenset(), {"x"}, {"p"}, {"q:y"}):
        for blocked in ((), {"y"}, {"q"}):
            selection = select_entry_points(candidates, allow, blocked)
            assert sorted(v.index for v in selection.verdicts) == list(range(len(candidates)))
