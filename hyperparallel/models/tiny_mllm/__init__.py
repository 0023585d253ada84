"""The project's tiny MLLM family (ViT-style encoder + decoder-only LLM): :mod:`.adapter`; its cells are
the shared ones (:mod:`hyperparallel.models.cells`, :mod:`hyperparallel.models.vit`). Importing this
package imports no MindSpore.
"""
from ..family import Family

FAMILY = Family("tiny_mllm", "hyperparallel.models.tiny_mllm.adapter:TinyMLLM", types=("tiny_mllm",))
