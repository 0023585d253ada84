"""The Qwen-VL family: mindone.transformers' Qwen2.5-VL and Qwen3-VL, in one folder.

:mod:`.adapter` (the recipe's ``model:`` section, regions, shapes), :mod:`.cells` (the MindSpore side:
whole model, chunks, tensors), :mod:`.side` (side inputs in numpy), :mod:`.cpu` (mindone's CPU patches),
and the ``qwen_vl`` data layout: :mod:`.format` (its entry in the data layer's layout registry, registered
here), :mod:`.chat` (chat template), :mod:`.image` (grids and pixels), :mod:`.layout` (the index side),
:mod:`.batch` (the micro-batch), :mod:`.source` (the data source), :mod:`.processor` (the exported processor
files). Importing this package imports no MindSpore.
"""
from ..family import Family
from ...data.formats import register
from .format import LAYOUT

FAMILY = Family("qwen_vl", "hyperparallel.models.qwen_vl.adapter:QwenVL",
                archs=("Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration"))
register(LAYOUT)
