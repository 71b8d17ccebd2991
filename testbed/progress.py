"""Progress of a long run: rich's bar on a terminal; elsewhere (CI, nohup, a pipe) one line per finished
step with the elapsed time, flushed at once, so a log shows the run moving."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console


class Progress:
    """`with Progress(console, total, "what") as p: ... p.step("point 3 done")`."""

    def __init__(self, console: Console, total: int, what: str, terminal: bool | None = None) -> None:
        self.console, self.total, self.what = console, total, what
        self.terminal = console.is_terminal if terminal is None else terminal
        self.done = 0
        self.t0 = time.perf_counter()
        self._bar = None
        self._task = None

    def __enter__(self) -> Progress:
        if self.terminal:
            from rich.progress import Progress as Bar

            self._bar = Bar(console=self.console, transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.what, total=self.total)
        else:
            self.line(f"{self.what}: {self.total} step(s)")
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(et, ev, tb)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def line(self, text: str) -> None:
        """One plain line with the elapsed time (a phase that is not a counted step)."""
        if self._bar is not None:
            return
        self.console.print(f"[{self.elapsed:7.1f} s] {text}", highlight=False, markup=False, soft_wrap=True)
        self.console.file.flush()

    def step(self, text: str = "", advance: int = 1) -> None:
        self.done += advance
        if self._bar is not None:
            self._bar.update(self._task, advance=advance, description=f"{self.what}: {text}" if text else self.what)
        else:
            self.line(f"{self.done}/{self.total} {text}".rstrip())
