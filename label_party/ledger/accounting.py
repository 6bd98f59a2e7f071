"""Per-part basic composition over ledger entries (DESIGN.md §3.4).

Pure functions over integer units; used by the service before a release and by
audit verification when it re-derives the spend from the audit log.

A release either touches every example (``parts`` is ``None``) or the examples of
the named parts of the dataset's partition plan. ``spent(part)`` is the sum over
releases touching that part; examples outside every named part (or a dataset with
no plan) are the scope ``None``, touched only by whole-dataset releases. A release
is allowed only if every scope it touches stays within the budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Cost:
    epsilon: int
    delta: int
    parts: tuple[str, ...] | None


@dataclass
class Spend:
    """Spent units on the whole-dataset scope and, on top of it, per named part."""

    all_epsilon: int = 0
    all_delta: int = 0
    part_epsilon: dict[str, int] = field(default_factory=dict)
    part_delta: dict[str, int] = field(default_factory=dict)

    def add(self, cost: Cost) -> None:
        if cost.parts is None:
            self.all_epsilon += cost.epsilon
            self.all_delta += cost.delta
            return
        for part in cost.parts:
            self.part_epsilon[part] = self.part_epsilon.get(part, 0) + cost.epsilon
            self.part_delta[part] = self.part_delta.get(part, 0) + cost.delta

    def of_part(self, part: str) -> tuple[int, int]:
        return (
            self.all_epsilon + self.part_epsilon.get(part, 0),
            self.all_delta + self.part_delta.get(part, 0),
        )

    def worst(self, parts: Iterable[str] | None) -> tuple[int, int]:
        """Largest ε and δ spent on any scope a release over ``parts`` touches.

        ``parts`` ``None`` means every scope: the whole-dataset spend and every part.
        """
        names = list(self.part_epsilon) if parts is None else list(parts)
        eps = max([self.of_part(p)[0] for p in names], default=self.all_epsilon)
        delta = max([self.of_part(p)[1] for p in names], default=self.all_delta)
        if parts is None:
            eps, delta = max(eps, self.all_epsilon), max(delta, self.all_delta)
        return eps, delta


def compose(costs: Iterable[Cost]) -> Spend:
    spend = Spend()
    for cost in costs:
        spend.add(cost)
    return spend


def fits(
    spend: Spend, cost: Cost, *, epsilon_budget: int, delta_budget: int
) -> tuple[bool, int, int]:
    """Whether ``cost`` fits, and the ε and δ remaining on its tightest scope."""
    eps, delta = spend.worst(cost.parts)
    eps_left, delta_left = epsilon_budget - eps, delta_budget - delta
    return cost.epsilon <= eps_left and cost.delta <= delta_left, eps_left, delta_left


def normalize_parts(parts: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if parts is None else tuple(sorted(set(parts)))
