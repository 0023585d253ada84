"""A per-device memory limit against the cost model's predicted peak (``mpipe.memory_limit_gb``).

The predicted peak of a device is its peak stashed activations plus its static memory (parameters,
their grads and optimizer state: :func:`hyperparallel.mpipe.cost.simulate`). 1 GB = 1024 MB, as
in the link model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

from .cost import CostReport

FIELD = "mpipe.memory_limit_gb"
PARTS = {"activations": "activations", "params": "parameters", "grads": "grads", "optimizer": "optimizer state"}


@dataclass(frozen=True)
class Excess:
    """One device whose predicted peak exceeds the limit; sizes in GB."""

    device: int
    peak_gb: float
    limit_gb: float
    parts_gb: Dict[str, float]   # keys of PARTS

    def text(self) -> str:
        parts = " + ".join(f"{PARTS[k]} {gb:.4g}" for k, gb in self.parts_gb.items())
        return (f"device {self.device}'s predicted peak {self.peak_gb:.4g} GB exceeds {self.limit_gb:g} GB "
                f"({parts} GB)")

    def to_json(self) -> dict:
        return {"device": self.device, "peak_gb": round(self.peak_gb, 6), "limit_gb": self.limit_gb,
                "parts_gb": {k: round(v, 6) for k, v in self.parts_gb.items()}}


def parts_gb(d) -> Dict[str, float]:
    """A device cost's peak parts in GB (keys of PARTS)."""
    mb = (d.peak_activation_mb, d.params_mb, d.grads_mb, d.optimizer_mb)
    return {k: v / 1024.0 for k, v in zip(PARTS, mb)}


def peak_line(report: CostReport, limit_gb: float) -> str:
    """One line: the device with the highest predicted peak, its parts, and whether it fits ``limit_gb``."""
    d = max(report.devices, key=lambda x: (x.peak_memory_mb, -x.device))
    peak = d.peak_memory_mb / 1024.0
    parts = " + ".join(f"{PARTS[k]} {gb:.4g}" for k, gb in parts_gb(d).items())
    verdict = f"fits {limit_gb:g} GB" if peak <= limit_gb else f"exceeds {limit_gb:g} GB"
    return f"memory: device {d.device}'s predicted peak {peak:.4g} GB ({parts} GB) {verdict} ({FIELD})"


def over_limit(report: CostReport, limit_gb: float) -> List[Excess]:
    """The devices whose predicted peak exceeds ``limit_gb``, highest peak first."""
    out = []
    for d in report.devices:
        peak = d.peak_memory_mb / 1024.0
        if peak > limit_gb:
            out.append(Excess(d.device, peak, limit_gb, parts_gb(d)))
    return sorted(out, key=lambda e: (-e.peak_gb, e.device))


def summary(excess: List[Excess], devices: int) -> str:
    """One line: the worst device, its peak and parts, and how many devices exceed the limit."""
    more = f"; {len(excess)} of {devices} devices exceed it" if len(excess) > 1 else ""
    return f"{excess[0].text()}{more}"
