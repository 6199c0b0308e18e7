"""A dependency-free progress bar on stderr: done/total, rate and ETA, redrawn at most ~10 times a second.

It draws only on a terminal. In a pipe, a log file or CI it stays silent, so output meant for
machines (``--json``) is never interleaved with carriage returns; or, for long work such as
generating a dataset (``piped="lines"``), it prints a plain line now and then instead.
"""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

from dlstore import settings

__all__ = ["Progress"]

_BAR_WIDTH = 24
_MIN_REDRAW_S = 0.1  # at most ~10 redraws a second: drawing must not cost what it measures
_LINE_EVERY_S = 10.0  # piped="lines": a plain line at most this often (and a last one at the end)
_PIPED = ("silent", "lines")


def _si(value: float, unit: str) -> str:
    """``1234567, "B"`` -> ``"1.23 MB"``, ``1234, ""`` -> ``"1.23k"``: decimal prefixes, as storage quotes."""
    for prefix in ("", "k", "M", "G", "T"):
        if abs(value) < 1000 or prefix == "T":
            break
        value /= 1000
    if prefix == "" and float(value).is_integer():
        digits = 0
    else:
        digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    number = f"{value:.{digits}f}"
    return f"{number} {prefix}{unit}" if unit else number + prefix


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    minutes, s = divmod(seconds, 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}:{m:02d}:{s:02d}" if hours else f"{m:02d}:{s:02d}"


class Progress:
    """A progress bar for a known amount of work.

    Parameters
    ----------
    total : int or float
        The amount of work, in ``unit``; 0 or less shows a count without a bar or ETA.
    desc : str, optional
        A label printed before the bar.
    unit : str, optional
        What is counted: ``"B"`` shows bytes with decimal prefixes (kB, MB, GB), anything else is
        shown after the count (``"rec"`` -> ``1.2k rec``).
    enabled : bool, optional
        ``False`` never draws; ``None`` (the default) draws when the environment variable
        ``DLSTORE_NO_PROGRESS`` is unset: a bar when ``file`` is a terminal, else as ``piped`` says.
    piped : {"silent", "lines"}, optional
        When ``file`` is not a terminal: nothing (the default), or a plain line (no carriage
        return, no bar) every 10 s and one at the end, for a log to show that long work goes on.
    file : file object, optional
        Where to draw, ``sys.stderr`` by default.

    Examples
    --------
    >>> with Progress(total=1000, desc="gen", unit="rec") as bar:   # doctest: +SKIP
    ...     for _ in range(1000):
    ...         bar.update()
    """

    def __init__(self, total: float, desc: str = "", unit: str = "", *, enabled: Optional[bool] = None,
                 piped: str = "silent", file: Optional[TextIO] = None):
        if piped not in _PIPED:
            raise ValueError(f"piped must be one of {_PIPED}, not {piped!r}")
        self.total = total
        self.desc = desc
        self.unit = unit
        self.done = 0
        self._file = file if file is not None else sys.stderr
        isatty = getattr(self._file, "isatty", None)
        on_terminal = bool(isatty and isatty())
        #: Plain lines now and then rather than a bar redrawn in place.
        self.lines = enabled is None and not on_terminal and piped == "lines"
        if enabled is None:
            enabled = (on_terminal or self.lines) and not settings.get("no_progress")
        self.enabled = enabled
        self._start = time.monotonic()
        self._last_draw = float("-inf")
        self._last_width = 0
        self._closed = False

    def update(self, n: float = 1) -> None:
        """Records ``n`` more units done; redraws if the last redraw is more than 0.1 s old."""
        self.done += n
        if not self.enabled:
            return
        now = time.monotonic()
        if self.lines:
            # The first line once there is a rate to show, then every _LINE_EVERY_S.
            if now - max(self._last_draw, self._start) >= _LINE_EVERY_S:
                self._draw(now)
        elif now - self._last_draw >= _MIN_REDRAW_S:
            self._draw(now)

    def close(self) -> None:
        """Draws the final state and ends the line. Calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        if self.enabled:
            self._draw(time.monotonic())
            if not self.lines:
                self._file.write("\n")
            self._file.flush()

    def render(self, now: Optional[float] = None) -> str:
        """The line the bar would draw now (without the leading carriage return)."""
        now = time.monotonic() if now is None else now
        elapsed = max(now - self._start, 1e-9)
        rate = self.done / elapsed
        count = self._amount(self.done, with_unit=self.unit == "B")
        parts = [self.desc] if self.desc else []
        if self.total and self.total > 0:
            frac = min(max(self.done / self.total, 0.0), 1.0)
            filled = int(frac * _BAR_WIDTH)
            bar = "" if self.lines else f" |{'#' * filled}{'.' * (_BAR_WIDTH - filled)}|"
            parts.append(f"{frac * 100:3.0f}%{bar}")
            parts.append(f"{count}/{self._amount(self.total, with_unit=True)}")
        else:
            parts.append(self._amount(self.done, with_unit=True))
        parts.append(f"{self._amount(rate, with_unit=True)}/s")
        if self.total and self.total > 0:
            if self.done >= self.total:
                parts.append(f"in {_duration(elapsed)}")
            elif rate > 0:
                parts.append(f"ETA {_duration((self.total - self.done) / rate)}")
        return " ".join(parts)

    def _amount(self, value: float, with_unit: bool) -> str:
        """Bytes with a prefix (``1.50 GB``); whole counts exact (``1500/26112 rec``); rates with a prefix."""
        if self.unit == "B":
            return _si(value, "B")
        text = str(int(value)) if float(value).is_integer() and abs(value) < 1e7 else _si(value, "")
        return f"{text} {self.unit}" if with_unit and self.unit else text

    def _draw(self, now: float) -> None:
        line = self.render(now)
        self._last_draw = now
        if self.lines:
            self._file.write(line + "\n")
            self._file.flush()
            return
        # Pad over what the previous, possibly longer, line left on screen.
        pad = max(self._last_width - len(line), 0)
        self._file.write("\r" + line + " " * pad)
        self._file.flush()
        self._last_width = len(line)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
