"""The pass-cost benchmark's trees are valid and its rounds run (no speed assertions)."""

from cascade.bench.step.tree_cost import bushy_parents, round_ms
from cascade.protocol.trees import depths, tree_problem
from models import tiny_llama


def test_bushy_trees_are_valid_and_rounds_of_every_size_run():
    for count in (1, 4, 9, 64):
        parents = bushy_parents(count)
        assert len(parents) == count and tree_problem(parents) is None
    assert depths(bushy_parents(21))[-1] == 3  # 4 + 16 + 1: the third level starts at 20
    target = tiny_llama(0)
    assert all(round_ms(target, n, bushy_parents(n) if n else None, 1) > 0 for n in (0, 5, 64))
