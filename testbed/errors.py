"""The one error type users see: a single line naming the field and the fix."""


class SpecError(ValueError):
    """Bad input. The message is one line: `field: what is wrong (fix)`."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field, self.problem, self.fix = one_line(field), one_line(problem), one_line(fix)
        super().__init__(f"{self.field}: {self.problem}" + (f" ({self.fix})" if self.fix else ""))

    def __reduce__(self):
        """Picklable with its three parts, so an error raised in a process pool reaches the parent intact."""
        return (type(self), (self.field, self.problem, self.fix))


def one_line(text: object) -> str:
    """Text as one printable line: newlines and control characters (from user input) are escaped."""
    s = str(text)
    return s if s.isprintable() else "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in s)


class NotYetError(RuntimeError):
    """A capability that exists in the design but is not built yet."""
