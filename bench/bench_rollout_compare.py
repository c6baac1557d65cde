"""False alarms and power of the version comparison (``llmslo.analysis.rollout.compare_versions``).

Each run writes a fresh store file (``Store.open`` + ``ingest_frame``) with one synthetic rollout of
``llmslo.tests._rollout_rows.rollout_frame``: a baseline period of ``--baseline`` requests, then a 600 s
window of ``--window`` requests, split at random between versions v1 and v2 (tenant classes interactive 70 %,
batch 30 %; lognormal TTFT, median 0.4 s, σ = 0.5; 1 % errors, 0.5 % timeouts, 1 % rejections, 1 % client
cancels; 5 % of v1's window requests ended by the drain). The comparison runs at the default settings
(α = 0.01 familywise, Holm over 18 tests, at least 100 per side, minimum effects 0.2 pp and 5 %).

* false alarms: ``--null`` runs of identical versions (random splits); a false alarm is a ``regression``
  verdict. Target (issue 14): at most 2 in 50.
* power: ``--power`` runs in which every v2 request's TTFT is 20 % longer; found = a ``regression`` of v2 in
  ``ttft_s``. Target: at least 9 of 10. Also shown against the window size (requests per version in the
  window), since power depends on it.

Run: ``.venv/bin/python bench/bench_rollout_compare.py`` (``--null 500`` for a tighter false-alarm rate).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _util import table, temp_dir

from llmslo.analysis.rollout import VersionComparison, compare_versions
from llmslo.analysis.store import Store
from llmslo.tests._rollout_rows import RolloutScenario, rollout_frame

COMMAND = "python bench/bench_rollout_compare.py"


def run_once(folder: Path, seed: int, scenario: RolloutScenario) -> VersionComparison:
    """One rollout in a fresh store file, compared over its window at the default settings."""
    path = folder / f"run-{seed}.duckdb"
    with Store.open(path) as store:
        store.ingest_frame(rollout_frame(seed, scenario), source=f"synthetic rollout (seed {seed})")
        lo, hi = scenario.window
        result = compare_versions(store.con, from_unix_s=lo, to_unix_s=hi)
    path.unlink()
    return result


def false_alarms(folder: Path, runs: int, baseline: int, window: int, seed: int) -> tuple[int, int, list[str]]:
    """(regression verdicts, insufficient_data verdicts, the false regressions' reasons) over null runs."""
    scenario = RolloutScenario(n_baseline=baseline, n_window=window, drained_share=0.05)
    regressions, insufficient, reasons = 0, 0, []
    for k in range(runs):
        result = run_once(folder, seed + k, scenario)
        regressions += result.verdict == "regression"
        insufficient += result.verdict == "insufficient_data"
        reasons += [f"seed {seed + k}: {r.text()}" for r in result.regressions]
    return regressions, insufficient, reasons


def power(folder: Path, runs: int, baseline: int, window: int, seed: int) -> tuple[int, int]:
    """(runs finding v2's TTFT regression, runs blaming anything else) with v2's TTFT 20 % longer."""
    scenario = RolloutScenario(n_baseline=baseline, n_window=window, drained_share=0.05, ttft_factor={"v2": 1.2})
    found = wrong = 0
    for k in range(runs):
        result = run_once(folder, seed + k, scenario)
        found += any(r.version == "v2" and r.metric == "ttft_s" for r in result.regressions)
        wrong += any(r.version != "v2" for r in result.regressions)
    return found, wrong


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--null", type=int, default=50, help="null comparisons (default 50)")
    ap.add_argument("--power", type=int, default=10, help="runs with a +20%% TTFT shift (default 10)")
    ap.add_argument("--baseline", type=int, default=600, help="baseline requests per run (default 600)")
    ap.add_argument("--window", type=int, default=1200, help="window requests per run (default 1200)")
    ap.add_argument("--seed", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="skip the power curve over window sizes")
    args = ap.parse_args()
    t0 = time.perf_counter()
    with temp_dir("llmslo-bench-rollout-") as folder:
        fa, insufficient, reasons = false_alarms(folder, args.null, args.baseline, args.window, args.seed)
        found, wrong = power(folder, args.power, args.baseline, args.window, args.seed + 100_000)
        rows: list[list[object]] = [
            [f"false alarms (null, {args.null} runs)", fa, f"<= {2 * args.null / 50:g}",
             "ok" if fa <= 2 * args.null / 50 else "NOT MET"],
            ["insufficient_data among the null runs", insufficient, "0", "ok" if not insufficient else "NOT MET"],
            [f"power (+20% TTFT on v2, {args.power} runs)", found, f">= {0.9 * args.power:g}",
             "ok" if found >= 0.9 * args.power else "NOT MET"],
            ["power runs blaming another version", wrong, "0", "ok" if not wrong else "NOT MET"],
        ]
        print(f"command: {COMMAND} --null {args.null} --power {args.power} --baseline {args.baseline} "
              f"--window {args.window} --seed {args.seed}")
        print(table(["figure", "count", "target", ""], rows))
        for line in reasons:
            print(f"  false alarm: {line}")
        if not args.quick:
            curve = []
            for window in (300, 600, 1200, 2400):
                hits, _ = power(folder, args.power, args.baseline, window, args.seed + 200_000 + window)
                curve.append([window, window // 2, f"{hits}/{args.power}"])
            print("\npower against the window size (+20% TTFT on v2)")
            print(table(["window requests", "per version", "found"], curve))
    print(f"\n{time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
