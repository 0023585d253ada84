"""The commands of the ``hyperparallel`` CLI (parsers: :mod:`hyperparallel.cli`)."""
