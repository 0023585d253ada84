"""The MindFormers Llama MLLM family: the project's ViT feeding MindFormers' ``LlamaForCausalLM``.

:mod:`.adapter` (pure Python) and :mod:`.cells` (the MindSpore side). Importing this package imports no
MindSpore.
"""
