"""The Qwen-VL family: mindone.transformers' Qwen2.5-VL and Qwen3-VL, in one folder.

:mod:`.adapter` (the recipe's ``model:`` section, regions, shapes), :mod:`.cells` (the MindSpore side:
whole model, chunks, tensors), :mod:`.side` (side inputs in numpy), :mod:`.cpu` (mindone's CPU patches),
and the data layout ``qwen_vl``: :mod:`.chat` (chat template), :mod:`.image` (grids and pixels),
:mod:`.layout` (the index side), :mod:`.source` (the micro-batches), :mod:`.processor` (the exported
processor files). Importing this package imports no MindSpore.
"""
