"""Mpipe: pipeline schedules as a small algebra, derived to per-device programs.

Pure Python (+numpy, pyyaml): planning a 512-device job needs no accelerator stack.
"""
from .check import assert_valid, check
from .derive import derive
from ..errors import PlanError, SpecError
from .ir import Action, Chunk, Plan
from .profile import LinkProfile, ModelProfile, RegionProfile, parse_profile
from .schedule import Pipe, Place, Schedule, Transpose, parse_schedule

__all__ = ["Action", "Chunk", "Plan", "derive", "check", "assert_valid", "SpecError",
           "PlanError", "ModelProfile", "RegionProfile", "LinkProfile", "parse_profile",
           "Schedule", "Pipe", "Place", "Transpose", "parse_schedule"]
