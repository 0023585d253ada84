"""MindSpore runtime of mpipe plans: model, data, tape autograd, interpreter, worker.

Imported only when a job runs; the launcher side (``hyperparallel.train_cli``,
``hyperparallel.launch``) never imports MindSpore.
"""

from .annotate import GraphModeUnsupported, annotate, graph_pipeline  # noqa: E402  (no MindSpore import)
