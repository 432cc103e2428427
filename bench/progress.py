"""Progress lines on stderr, stamped with the time since the run began."""

from __future__ import annotations

import sys
import time

_START = time.monotonic()


def log(message: str) -> None:
    elapsed = int(time.monotonic() - _START)
    print(f"[bench {elapsed // 60:3d}:{elapsed % 60:02d}] {message}", file=sys.stderr, flush=True)
