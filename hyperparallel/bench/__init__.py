"""Measurement: ``hyperparallel profile`` (per-layer costs, link) and ``hyperparallel bench``
(schedules side by side on real ranks, against the cost model)."""
