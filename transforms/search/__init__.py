"""Search strategies over recipes, behind one ask/tell interface, registered by name.

    from transforms.search import create
    strategy = create("evolutionary", space, budget=200, seed=1)
"""

from typing import Any

from embed.registry import Registry
from transforms.search.space import SearchSpace
from transforms.search.strategy import Strategy

strategies: Registry[type[Strategy]] = Registry("search strategy")
strategies.register_lazy("exhaustive", "transforms.search.exhaustive:Exhaustive")
strategies.register_lazy("random", "transforms.search.random_search:RandomSearch")
strategies.register_lazy("evolutionary", "transforms.search.evolutionary:Evolutionary")
strategies.register_lazy("given_candidates", "transforms.search.given_candidates:GivenCandidates")


def create(strategy: str | Strategy, space: SearchSpace, **options: Any) -> Strategy:
    """A strategy instance: ``strategy`` itself, or the registered class of that name built with ``options``."""
    if isinstance(strategy, Strategy):
        return strategy
    return strategies.get(strategy)(space, **options)
