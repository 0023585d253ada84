"""MindSpore runtime of mpipe plans: the rank runtime, the interpreter and its hooks, communication,
the CPU compatibility module, checkpoints, the single-process reference, the msrun worker.

Imported only when a job runs; the launcher side (``hyperparallel.commands``, ``hyperparallel.launch``)
never imports MindSpore (``ckpt_files`` and ``annotate`` are pure Python).
"""

from .annotate import GraphModeUnsupported, annotate, graph_pipeline  # noqa: E402  (no MindSpore import)

__all__ = ["GraphModeUnsupported", "annotate", "graph_pipeline"]
