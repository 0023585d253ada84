"""The project's tiny MLLM family (ViT-style encoder + decoder-only LLM): :mod:`.adapter`; its cells are
the shared ones (:mod:`hyperparallel.models.cells`, :mod:`hyperparallel.models.vit`). Importing this
package imports no MindSpore.
"""
