"""The wire benchmark's arrival groups (``bench/_wire.py``, ``bench/bench_gateway.py:place_table``): requests that
reach the proxy less than a millisecond apart form a group, and each stream's added TTFT is shown by its place in
its group, which is what sets the tail when streams that ended together send their next requests together."""

from __future__ import annotations

import pytest

from llmslo.bench._wire import PLACES, by_place, group_sizes, place_label
from llmslo.bench.bench_gateway import Run, Scenario, place_table


def _run(arrivals: list[float], holds: list[float]) -> Run:
    return Run(target="x", tokens=20, requests=len(holds), chunks=0, wall_s=1.0, cpu_s=0.0, ttft_p50_s=0.0,
               ttft_p99_s=0.0, itl_p99_s=0.0, tokens_per_s=0.0, failed=0, total_hold_s=holds, arrival_s=arrivals)


def test_a_gap_of_a_millisecond_starts_a_new_group() -> None:
    arrivals = [0.0100, 0.0, 0.0004, 0.0008, 0.0107, 0.5]  # (any order)
    assert group_sizes(arrivals) == [3, 2, 1]
    assert group_sizes([0.0, 0.001]) == [1, 1]  # exactly the gap: apart
    assert group_sizes([]) == []


def test_each_value_goes_to_the_range_of_its_place() -> None:
    arrivals = [i * 0.0002 for i in range(45)] + [1.0, 1.0001]
    holds = [float(i) for i in range(45)] + [100.0, 101.0]
    got = by_place(arrivals, holds)
    assert got[(1, 1)] == [0.0, 100.0]
    assert got[(2, 5)] == [1.0, 2.0, 3.0, 4.0, 101.0]
    assert got[(6, 10)] == [5.0, 6.0, 7.0, 8.0, 9.0]
    assert got[(41, 1 << 30)] == [40.0, 41.0, 42.0, 43.0, 44.0]
    assert sum(len(v) for v in got.values()) == len(holds)
    assert set(got) <= set(PLACES)


def test_lengths_that_differ_are_refused() -> None:
    with pytest.raises(ValueError, match="3 arrivals but 2 values"):
        by_place([0.0, 0.1, 0.2], [1.0, 2.0])


def test_the_headings_name_the_places() -> None:
    assert [place_label(a, b) for a, b in PLACES] == ["1st", "2-5", "6-10", "11-20", "21-40", "41+"]


def test_the_table_shows_each_proxys_medians_by_place_over_its_steady_streams() -> None:
    """The opening burst (the first ``streams`` of a run) is left out; every repeat's steady streams count."""
    streams = 2
    opening = ([0.0, 0.0001], [0.050, 0.050])  # (left out: a hold of 50 ms would show)

    def repeat(hold_s: float) -> dict[str, tuple[Run, Run]]:
        arrivals = opening[0] + [1.0, 1.0002, 1.0004, 2.0]
        holds = opening[1] + [hold_s, 2 * hold_s, 3 * hold_s, hold_s]
        return {"llmslo": (_run([], []), _run(arrivals, holds))}

    sc = Scenario(pace="paced", streams=streams, runs=[repeat(0.001), repeat(0.002)])
    text = place_table(sc, ["llmslo", "envoy"])
    assert text is not None
    line = next(row for row in text.splitlines() if row.startswith("llmslo"))
    cells = line.split()
    assert cells[1] == "4"  # groups: two per repeat
    assert " ".join(cells[2:7]) == "2 / 3 / 3"  # sizes 3, 1, 3, 1
    assert cells[7:9] == ["1.50", "(4)"]  # 1st of each group: 1, 1, 2, 2 ms
    assert cells[9:11] == ["3.50", "(4)"]  # 2nd and 3rd: 2, 3, 4, 6 ms
    assert not any(row.startswith("envoy") for row in text.splitlines())  # not measured: no row
    assert place_table(Scenario(pace="paced", streams=2), ["llmslo"]) is None
