"""``hyperparallel tune``: the best plan of the schedule algebra for a recipe (pure Python).

:mod:`.space` (the candidates and their recipe keys), :mod:`.bound` (lower bounds, no derivation),
:mod:`.search` (best-first with bound pruning), :mod:`.overlay` (the chosen keys as a recipe file).
"""
