"""The base of every ``data:`` config: what the run config, the launcher and the runtime ask of a data
section, whichever source it configures (``data.type``, registered in :data:`hyperparallel.data.TYPES`).

A config class is a frozen dataclass of the section's keys deriving from :class:`DataSection`; it is
built by ``from_recipe(section, raw)`` (``section``: ``data:`` without ``type``; ``raw``: the whole recipe,
for keys of other sections, e.g. the micro-batches per step) and checks its own values there. The rest
has defaults here, so no caller probes a config for what it can do.
"""
from __future__ import annotations

from typing import ClassVar


class DataSection:
    """Base of data configs (see the module docstring)."""

    #: ``data.type`` of the config (the registry key)
    type: ClassVar[str] = ""
    #: ``data.balance`` (:mod:`.balance`); a config without the key never balances
    balance = "none"
    #: ``data.packing`` (:mod:`.packing`); a config without the key never packs
    packing = False
    #: a data set on disk that ``hyperparallel data check`` scans, and the launcher checks before launch
    checks_files: ClassVar[bool] = False

    @classmethod
    def from_recipe(cls, section: dict, raw: dict) -> "DataSection":
        raise NotImplementedError

    def shapes(self) -> dict:
        """Model sizes implied by the data (merged into the model's config)."""
        raise NotImplementedError

    def check_model(self, model) -> None:
        """Refuse (SpecError) a model adapter whose micro-batch layout (``data_format()``) this data cannot
        lay out; checked before launch."""

    def source(self, seed: int, data_format):
        """A fresh :class:`~.source.DataSource` of this config (``data_format``: the model adapter's
        ``data_format``, called only by sources that lay out conversations)."""
        raise NotImplementedError
