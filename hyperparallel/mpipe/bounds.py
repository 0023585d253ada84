"""Upper bounds on the sizes a recipe, a plan file or a command line may ask for.

They reach far beyond real configurations (the largest published pipeline runs use P <= 128,
V <= 8, M <= 4,096, a handful of regions and a few hundred layers) and keep every command's
time bounded: a plan at the task bound derives, checks and simulates in about 20 s on one core
(deriving, checking and simulating are linear in the plan's size). README "Bad input" lists them.
"""
from __future__ import annotations

from ..errors import SpecError

MAX_PIPELINE_STAGE = 4096      # P
MAX_INTERLEAVE = 256           # V (chunks per device)
MAX_MICRO_BATCH = 100_000      # M
MAX_DATA_PARALLEL = 65_536     # D
MAX_TENSOR_PARALLEL = 1_024    # T (model_parallel)
MAX_REGIONS = 1000             # profile regions
MAX_LAYERS = 100_000           # layers of one region
MAX_TASKS = 100_000            # forwards of one step: M x (P x V + regions - 1)
MAX_COST = 1e9                 # one cost of a profile region (ms or MB)
MAX_SIM_STEPS = 1000           # simulate --steps
MAX_SIM_RUNS = 2_000_000       # simulate: steps x actions of the plan
MAX_PLAN_ACTIONS = 2_000_000   # actions of a plan JSON file (check)
MAX_PLAN_BYTES = 256 * 1024 * 1024   # a plan JSON file


def at_most(field: str, value: int, bound: int, what: str = "") -> int:
    """``value`` if it is <= ``bound``, else the refusal naming ``field`` and the bound."""
    if value > bound:
        raise SpecError(field, f"{value} is above the bound {bound:,}{' ' + what if what else ''} (see README "
                               "'Bad input')")
    return value


def check_plan_size(P: int, V: int, M: int, regions: int, field: str = "parallel_config.micro_batch_num") -> None:
    """Refuse a step of more than :data:`MAX_TASKS` forwards before anything is built."""
    tasks = M * (P * V + max(regions, 1) - 1)
    if tasks > MAX_TASKS:
        raise SpecError(field, f"a step of {M} micro-batches x ({P} x {V} chunks + {max(regions, 1) - 1} "
                               f"upstream regions) = {tasks:,} forwards is above the bound {MAX_TASKS:,}; "
                               "lower micro_batch_num, pipeline_stage or pp_interleave_num")

