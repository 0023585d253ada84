"""The recipe front end: YAML files (MindFormers' ``base_config``, ``--set``), MindFormers' own rules
(layer layout, scheduler keys, towers), the checked :class:`Recipe`, and recipe -> checked plan.

Pure Python, beside the algebra (:mod:`hyperparallel.mpipe`): it reads the algebra's types and
produces its inputs. Every refusal is a :class:`~hyperparallel.errors.SpecError` naming the key.
"""
from .files import apply_override, load_raw
from .memory import memory_excess, memory_warning, refuse_over_memory_limit, steady_steps
from .recipe import Recipe, checked_plan, derive_recipe, load_recipe, recipe_from_dict

__all__ = ["Recipe", "load_recipe", "recipe_from_dict", "load_raw", "apply_override", "derive_recipe",
           "checked_plan", "memory_excess", "memory_warning", "refuse_over_memory_limit",
           "steady_steps"]
