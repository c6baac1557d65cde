"""Start-up time of the ``llmslo`` command against the floor of any typer program, on the same machine.

The figure: wall time of ``python -m llmslo.cli --help`` as a fresh process. The baseline: a fresh
``python -c "import typer"`` (the interpreter plus the command-line library, which every typer program pays).
The two are run interleaved (order alternating from one pair to the next) ``--runs`` times; the table gives
each median and the ratio of the medians. Target: ``llmslo --help`` ≤ 2× the baseline.

For information, with the same baseline: ``llmslo --version``, ``llmslo report --help``, and
``import typer, typer.rich_utils``: the module typer imports to print any help in rich style (rich's
console, markdown and syntax highlighting), which ``llmslo --help`` cannot avoid while its help looks as it does.
Before the command modules imported the analysis stack lazily, ``llmslo --help`` loaded duckdb, polars,
pyarrow, scipy and numpy and took 1.5–1.7 s here (2.5–4 s reported elsewhere). Before the commands were
listed from one static table (``llmslo.cli._app.COMMANDS``) and each command module imported only when its
command runs, ``llmslo --help`` imported every command module and typer built every option of every command
(about 45 ms and 35 ms of a 2.3× figure); ``llmslo CMD --help`` still imports CMD's module and builds its options.

Run: ``.venv/bin/python bench/bench_startup.py`` (``--runs N``, at least 15).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from _util import median, spread, table

TARGET_RATIO = 2.0
MIN_RUNS = 15

BASELINE = [sys.executable, "-c", "import typer"]
FIGURE = [sys.executable, "-m", "llmslo.cli", "--help"]
INFO = {
    "llmslo --version": [sys.executable, "-m", "llmslo.cli", "--version"],
    "llmslo report --help": [sys.executable, "-m", "llmslo.cli", "report", "--help"],
    "import typer, typer.rich_utils": [sys.executable, "-c", "import typer, typer.rich_utils"],
}


def wall_s(argv: list[str]) -> float:
    """Seconds from start to exit of a fresh process (output discarded; a failure stops the benchmark)."""
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
    return time.perf_counter() - start


def paired(a: list[str], b: list[str], runs: int) -> tuple[list[float], list[float]]:
    """``runs`` timings of each, interleaved; the order within a pair alternates."""
    xs: list[float] = []
    ys: list[float] = []
    for i in range(runs):
        if i % 2 == 0:
            xs.append(wall_s(a))
            ys.append(wall_s(b))
        else:
            ys.append(wall_s(b))
            xs.append(wall_s(a))
    return xs, ys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21, help=f"paired runs per figure (at least {MIN_RUNS})")
    args = parser.parse_args()
    runs = max(args.runs, MIN_RUNS)

    for argv in (BASELINE, FIGURE, *INFO.values()):  # warm the file cache and the bytecode caches
        wall_s(argv)

    help_s, base_s = paired(FIGURE, BASELINE, runs)
    base = median(base_s)
    ratio = median(help_s) / base
    rows: list[list[object]] = [
        ["llmslo --help (ms)", median(help_s) * 1e3, base * 1e3, f"{ratio:.2f}x", f"<= {TARGET_RATIO:g}x",
         "yes" if ratio <= TARGET_RATIO else "NO", f"{spread([x * 1e3 for x in help_s])}"],
    ]
    for name, argv in INFO.items():
        xs, ys = paired(argv, BASELINE, runs)
        rows.append([f"{name} (ms)", median(xs) * 1e3, median(ys) * 1e3, f"{median(xs) / median(ys):.2f}x",
                     "(info)", "-", f"{spread([x * 1e3 for x in xs])}"])

    print(f"Start-up, fresh processes, {runs} interleaved pairs each; baseline: python -c 'import typer' "
          f"(range {spread([x * 1e3 for x in base_s])} ms); Python {sys.version.split()[0]}\n")
    print(table(["figure", "median", "baseline", "ratio", "target", "pass", "range (ms)"], rows))


if __name__ == "__main__":
    main()
