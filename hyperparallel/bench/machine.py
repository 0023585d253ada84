"""Where a profile is measured: this machine's CPU model, core count, device and MindSpore version.

A cost profile belongs to the machine it was measured on (actions run at that machine's speed);
``hyperparallel profile`` records :func:`this_machine` under ``mpipe.profile.measured_on`` and
``hyperparallel bench`` warns when it predicts with a profile from another machine. Read without
importing MindSpore (the version comes from the installed package's metadata).
"""
from __future__ import annotations

import os
from typing import Optional


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def mindspore_version() -> Optional[str]:
    from importlib import metadata
    try:
        return metadata.version("mindspore")
    except metadata.PackageNotFoundError:
        return None


def this_machine(device: str) -> dict:
    """The ``measured_on`` mapping of a profile measured here on ``device`` ranks."""
    return {"cpu": cpu_model(), "cores": os.cpu_count() or 1, "device": device,
            "mindspore": mindspore_version() or "not installed"}


def profile_warning(profile, device: str, source: str) -> Optional[str]:
    """A one-line warning when ``profile`` (a ModelProfile) was not measured on this machine, else None."""
    from ..mpipe.profile import machine_differences
    if profile.measured_on is None:
        return (f"warning: the profile in {source} does not say where it was measured (no mpipe.profile.measured_on); "
                f"its costs may be another machine's: measure here with --measure-profile")
    diff = machine_differences(profile.measured_on, this_machine(device))
    if diff:
        return (f"warning: the profile in {source} was measured on another machine ({'; '.join(diff)}); "
                f"predictions compare another machine's costs: measure here with --measure-profile")
    return None
