"""Checks of the counts a caller passes (batch sizes, prefetch depths, epochs): an integer, within its
range, said in one line naming the argument. A float or a bool is refused, not truncated: batch_size=2.5
made batches of 2, and True made batches of 1."""
from __future__ import annotations

import operator
from typing import Any, Optional

__all__ = ["whole"]


def whole(name: str, value: Any, least: int, *, none_means: Optional[str] = None) -> Optional[int]:
    """``value`` as an ``int`` of at least ``least``; None stays None where ``none_means`` says what it means.

    Raises
    ------
    TypeError
        Not an integer (``operator.index`` refuses it, or a bool), or None where None means nothing.
    ValueError
        Below ``least``.
    """
    if value is None and none_means is not None:
        return None
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        also = f" (or None: {none_means})" if none_means is not None else ""
        raise TypeError(f"{name} must be an integer{also}, not {value!r}") from None
    if n < least:
        also = f" (or None: {none_means})" if none_means is not None else ""
        raise ValueError(f"{name} must be at least {least}{also}, got {value}")
    return int(n)
