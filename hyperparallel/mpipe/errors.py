"""One error type for bad user input (recipe, schedule spec, CLI, plan files)."""


class SpecError(ValueError):
    """A refused input. The message is one line naming the field and the allowed values."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class PlanError(ValueError):
    """A derived or loaded plan that breaks a rule (checker finding)."""
