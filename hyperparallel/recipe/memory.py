"""``mpipe.memory_limit_gb`` applied to a recipe's plan: the flag of plan/simulate, the refusal of train."""
from __future__ import annotations

from typing import List, Optional, Sequence

from ..mpipe.cost import CostReport, simulate
from ..errors import SpecError
from ..mpipe.ir import Plan
from ..mpipe.memory import FIELD, Excess, over_limit, peak_line, summary
from .recipe import Recipe


def steady_steps(plans: Sequence[Plan]) -> int:
    """Steps the cost model runs: 3 when a plan spills into the next step (its steady state), else 1."""
    return 3 if any(x.get("spill") == "next_step" for p in plans for x in p.schedule) else 1


def memory_excess(recipe: Recipe, plan: Plan, report: Optional[CostReport] = None) -> List[Excess]:
    """The devices whose predicted peak exceeds ``mpipe.memory_limit_gb`` (none without a limit)."""
    if recipe.memory_limit_gb is None:
        return []
    report = report or simulate(plan, recipe.profile, steps=steady_steps([plan]))
    return over_limit(report, recipe.memory_limit_gb)


def refuse_over_memory_limit(recipe: Recipe, plan: Plan) -> None:
    """SpecError naming ``mpipe.memory_limit_gb``, the worst device, its peak and parts, if any exceeds it."""
    excess = memory_excess(recipe, plan)
    if excess:
        raise SpecError(FIELD, summary(excess, plan.num_devices) + "; refused before launch")


def memory_warning(recipe: Recipe, plan: Plan, report: Optional[CostReport] = None) -> Optional[str]:
    """The one-line warning plan/simulate print when a device exceeds the limit (None: none does)."""
    excess = memory_excess(recipe, plan, report)
    if not excess:
        return None
    return f"warning: {FIELD}: {plan.meta.get('schedule_name', '')}: {summary(excess, plan.num_devices)}"


def memory_line(recipe: Recipe, plan: Plan, report: Optional[CostReport] = None) -> Optional[str]:
    """The line ``plan`` prints with ``mpipe.memory_limit_gb`` set: the highest predicted peak, its parts
    and whether it fits (None without a limit)."""
    if recipe.memory_limit_gb is None:
        return None
    report = report or simulate(plan, recipe.profile, steps=steady_steps([plan]))
    return peak_line(report, recipe.memory_limit_gb)
