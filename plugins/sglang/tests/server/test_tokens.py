"""Tokens are identical with and without warcore, whatever the plugins decide, over two waves
where the second reuses the ``req_to_token`` rows the first freed."""

from __future__ import annotations

from _servers import CONFIGS, WAVES, Servers


def test_the_second_wave_reuses_the_rows_the_first_freed(servers: Servers) -> None:
    for name in ("fork_alone", "warcore_http"):
        run = servers[name]
        prefills = run.prefills()
        first, second = prefills[0], prefills[1]
        assert set(first["rids"]) == {r.rid for r in WAVES[0]}
        assert set(second["rids"]) == {r.rid for r in WAVES[1]}
        assert set(second["rows"]) == set(first["rows"]), (first["rows"], second["rows"])


def test_tokens_are_identical_with_and_without_warcore(servers: Servers) -> None:
    # the fork backend's configurations differ only in warcore (not activated, a plugin that
    # corrects it, one that raises, force-coarse) or in their tensor-parallel ranks (two:
    # the same tokens here); torch_native computes the same forward
    reference = servers["fork_alone"].plain()
    assert len(reference) == 12 and all(len(ids) == 12 for ids in reference.values())
    # the model's tokens depend on what attention reads (different prompts, different tokens)
    assert len({tuple(ids) for ids in reference.values()}) == len(reference)
    for name, config in CONFIGS.items():
        if not config.refused:  # a refused start-up serves nothing
            assert servers[name].plain() == reference, name
