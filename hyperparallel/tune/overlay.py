"""The chosen candidate as a recipe overlay: ``base_config`` (the tuned recipe) + the chosen keys.

``plan``, ``simulate`` and ``train`` read it as they read any recipe; its schedule, V, M, batch keys,
(scaled) profile and, for a MindFormers config, ``offset`` are :meth:`~.space.Space.keys` of the
candidate, the same keys its prediction was derived from.
"""
from __future__ import annotations

import json
import os
from typing import List

import yaml

from .search import Scored
from .space import Space


def offset_line(space: Space, s: Scored) -> str:
    """The chosen LLM split as the MindFormers key a user pastes into their own YAML."""
    key = space.recipe.layout["key"] if space.mf else "model.model_config.offset"
    return f"{key}: {json.dumps(space.offset(s.cand))}"


def overlay_text(space: Space, s: Scored, out_path: str, header: List[str]) -> str:
    """The overlay file's text (``base_config`` relative to ``out_path``'s folder; the command writes it)."""
    recipe_path = os.path.abspath(space.recipe.path)
    base = os.path.relpath(recipe_path, os.path.dirname(os.path.abspath(out_path)))
    body = {"base_config": base}
    body.update(space.keys(s.cand))
    lines = [f"# {h}" if h else "#" for h in header]
    return "\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=110)
