"""``mpipe.memory_limit_gb`` applied to a recipe's plan: the flag of plan/simulate, the refusal of train."""
from __future__ import annotations

from typing import List, Optional, Sequence

from ..mpipe.cost import CostReport, simulate
from ..errors import SpecError
from ..mpipe.ir import ALLGATHER, Plan
from ..mpipe.memory import FIELD, Excess, over_limit, summary
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


def refuse_sharded_optimizer(plan: Plan, train) -> None:
    """SpecError naming ``schedule.optimizer`` when the plan shards a region's optimizer state
    (``transpose(optimizer=sharded)``) and the run's optimizer (``train``: its TrainConfig) is not one the
    flat shard reproduces exactly: the ``train:`` section's Adam or SGD without weight decay treat every
    element alike; MindFormers' grouped optimizers (no decay for biases and 1-D parameters) and weight
    decay do not."""
    regions = sorted({a.region for p in plan.programs.values() for a in p if a.kind == ALLGATHER})
    if not regions:
        return
    opt = getattr(train, "opt", None)
    grouped = bool(getattr(opt, "grouped", False))
    decay = float(opt.get("weight_decay", 0.0) or 0.0) if opt is not None else 0.0
    if grouped or decay:
        what = f"MindFormers' {opt.type} (weight-decay groups)" if grouped else f"weight_decay {decay:g}"
        raise SpecError("schedule.optimizer", f"sharded ({', '.join(regions)}) needs the train: section's adam or "
                        f"sgd without weight decay (a flat shard treats every element alike), not {what}; "
                        "use optimizer=replicated")
