"""The rank side of ``profile`` and ``bench``: what msrun runs on every rank (the worker, the measurement
loops), the only part of :mod:`hyperparallel.bench` that imports MindSpore and the runtime. The launcher
side (the modules of :mod:`hyperparallel.bench` itself: parse, launch, compare with the cost model,
report) never imports it; the two meet in the job file and the ranks' JSON."""
