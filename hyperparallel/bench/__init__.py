"""Measurement: ``hyperparallel profile`` (per-layer costs, link) and ``hyperparallel bench``
(schedules side by side on real ranks, against the cost model). The modules here are the launcher side
(parse, launch, compare with the cost model, report; no MindSpore); :mod:`.ranks` is what msrun runs."""
