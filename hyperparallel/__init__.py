"""hyperparallel: MindSpore-native parallel training; Mpipe schedules and transpose."""
__version__ = "0.1.0"
