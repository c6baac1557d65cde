"""The engine run's counter reader (:func:`llmslo.ops.read_counters`): llama-server's ``/metrics`` by sample name.

The engine run compares these values with the client's ``usage`` sums, so each name must be the one the
engine writes: the same as the analysis's exposition parser reads (a counter whose name lacks ``_total``
keeps it so). No process is started: ``/metrics`` is answered from memory.
"""

from __future__ import annotations

import io
import urllib.request
from typing import Any

import pytest

from llmslo.analysis.scrape import parse_exposition
from llmslo.ops import ENGINE_COUNTERS, read_counters

EXPOSITION = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1375
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens taken from the cache.
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 64
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 912
# HELP llamacpp:n_tokens_max Largest observed n_tokens.
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 120
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 13.5729
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
# HELP llamacpp:slot_state Slots by state.
# TYPE llamacpp:slot_state gauge
llamacpp:slot_state{state="idle"} 3 1700000000000
"""


class _Reply(io.BytesIO):
    def __enter__(self) -> _Reply:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


@pytest.fixture
def metrics(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``urlopen`` answering :data:`EXPOSITION`; the URLs asked for."""
    asked: list[str] = []

    def urlopen(url: str, timeout: float, **_: Any) -> _Reply:
        asked.append(url)
        return _Reply(EXPOSITION.encode())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    return asked


def test_the_counters_are_the_unlabelled_samples_by_the_name_the_engine_writes(metrics: list[str]) -> None:
    counters = read_counters("http://127.0.0.1:9")
    assert metrics == ["http://127.0.0.1:9/metrics"]
    expected = {s.name: s.value for _, s in parse_exposition(EXPOSITION, "llama-server").samples() if not s.labels}
    assert counters == expected
    assert counters["llamacpp:n_tokens_max"] == 120 and "llamacpp:n_tokens_max_total" not in counters
    assert all(name in counters for name in ENGINE_COUNTERS)
    assert not any(name.startswith("llamacpp:slot_state") for name in counters)
