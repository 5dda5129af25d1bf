"""Calling a costly hook at most so often, however often it is asked for."""

import math
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def at_most_every(
    seconds: float, hook: Callable[[T], None], clock: Callable[[], float] = time.monotonic
) -> Callable[[T], None]:
    """``hook``, run at most once every ``seconds`` (the first call always runs it)."""
    last = -math.inf

    def refresh(configuration: T) -> None:
        nonlocal last
        if clock() - last >= seconds:
            last = clock()
            hook(configuration)

    return refresh
