"""Drive the native token log through growth, speculative commits, invalid input, failing clocks, reads and
garbage collection, for a memory checker (not collected by pytest; CPython's own start-up and shutdown
give valgrind reports of their own, so look for frames in ``_tokenlog_c``):

    PYTHONMALLOC=malloc valgrind -q --num-callers=30 .venv/bin/python tests/tools/valgrind_tokenlog.py 2>&1 \
        | grep -c _tokenlog_c        # 0: no error report has a frame in the native module
"""

from __future__ import annotations

import contextlib
import gc
import random
from collections.abc import Callable

from llmslo.telemetry._tokenlog import NativeTokenLog


def main() -> None:
    if NativeTokenLog is None:
        raise SystemExit("the native token log is not built (pip install -e .)")
    bounds = (5_000_000, 10_000_000, 20_000_000, 50_000_000, 1_000_000_000)
    rnd = random.Random(1)
    for trial in range(200):
        clock: Callable[[], int] | None = (
            iter(range(0, 10**12, rnd.randint(1, 10_000_000))).__next__ if trial % 2 else None)
        log = NativeTokenLog(clock)
        for _ in range(rnd.randint(0, 300)):
            r = rnd.random()
            if r < 0.7:
                log.commit()
            elif r < 0.8:
                log.commit(rnd.randint(-2, 5), rnd.choice([0, 1, -1, 2.5]))  # type: ignore[arg-type]
            elif r < 0.9:
                log.send(rnd.choice([1, 2, -1, 0.5, True]))  # type: ignore[arg-type]
            else:
                with contextlib.suppress(TypeError):
                    log.commit(1, 2, 3)  # type: ignore[call-arg]
        n = len(log)
        for m in range(0, n + 1, max(1, n // 7)):
            log.generated(m)
            log.itl(m, bounds)
            log.gaps_s(m)
            if m:
                log.time_ns(m - 1)
        log.count_until(10**11)
        for bad in (-1, n + 1):
            with contextlib.suppress(IndexError):
                log.gaps_s(bad)

    def broken() -> int:
        raise RuntimeError("clock")

    b = NativeTokenLog(broken)
    b.commit()
    b.commit(3)
    assert b.invalid == 2

    class Holder:  # a log in a reference cycle with its clock
        def __init__(self) -> None:
            self.log = NativeTokenLog(self.clock)

        def clock(self) -> int:
            return 1

    for _ in range(100):
        Holder()
    gc.collect()
    print("ok")


if __name__ == "__main__":
    main()
