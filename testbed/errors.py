"""The one error type users see: a single line naming the field and the fix."""


class SpecError(ValueError):
    """Bad input. The message is one line: `field: what is wrong (fix)`."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        msg = f"{field}: {problem}" + (f" ({fix})" if fix else "")
        super().__init__(msg)


class NotYetError(RuntimeError):
    """A capability that exists in the design but is not built yet."""
