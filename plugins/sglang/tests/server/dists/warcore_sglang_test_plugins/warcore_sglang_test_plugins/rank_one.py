"""A plugin that stops rank 1 during start-up, the first time it is asked anything once the
ranks are set up (before that rank answers the rank check): ``WCTEST_RANK_ONE=exit`` ends its
process, ``hang`` makes it never answer."""

from __future__ import annotations

import os
import time

import warcore
from warcore import BoundaryContext, ForwardMode, SharedReadBoundary

from ._rank import rank


@warcore.hookimpl
def warcore_shared_read_boundary(
    backend: str, forward_mode: ForwardMode, context: BoundaryContext
) -> SharedReadBoundary | None:
    if rank() == 1:
        if os.environ.get("WCTEST_RANK_ONE") == "exit":
            os._exit(17)
        while True:
            time.sleep(60)
    return None
