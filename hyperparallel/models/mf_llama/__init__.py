"""The MindFormers Llama MLLM family: the project's ViT feeding MindFormers' ``LlamaForCausalLM``.

:mod:`.adapter` (pure Python) and :mod:`.cells` (the MindSpore side). Importing this package imports no
MindSpore.
"""
from ..family import Family

FAMILY = Family("mf_llama", "hyperparallel.models.mf_llama.adapter:MFLlamaMLLM", archs=("LlamaForCausalLM",))
