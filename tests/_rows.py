"""Valid request-summary rows for tests, and ways to break them."""

from __future__ import annotations

from typing import Any


def ok_row(i: int = 0, **overrides: Any) -> dict[str, Any]:
    """A valid successful request: 11 tokens, TTFT 0.5 s, decode 1.0 s."""
    row: dict[str, Any] = {
        "request_id": f"req-{i}",
        "model": "m1",
        "version": "v1",
        "tenant_class": "interactive",
        "arrival_unix_s": 1_700_000_000.0 + i,
        "finish_reason": "stop",
        "queue_s": 0.1,
        "ttft_s": 0.5,
        "last_token_s": 1.5,
        "e2e_s": 1.6,
        "prompt_tokens": 100,
        "generated_tokens": 11,
        "sent_tokens": 11,
    }
    row.update(overrides)
    return row


def rejected_row(i: int = 0, **overrides: Any) -> dict[str, Any]:
    row = ok_row(i, finish_reason="rejected", reject_reason="queue_full", queue_s=None, ttft_s=None,
                 last_token_s=None, e2e_s=0.001, generated_tokens=0, sent_tokens=0)
    row.update(overrides)
    return row


def cancelled_row(i: int = 0, waited_s: float = 9.0, **overrides: Any) -> dict[str, Any]:
    """A client that gave up after ``waited_s`` seconds without a first token (censored TTFT)."""
    row = ok_row(i, finish_reason="client_cancel", ttft_s=None, last_token_s=None, e2e_s=waited_s,
                 queue_s=None, generated_tokens=0, sent_tokens=0)
    row.update(overrides)
    return row


# One way to break each rule: (rule, column, overrides on ok_row)
BREAKERS: list[tuple[str, str, dict[str, Any]]] = [
    ("type", "ttft_s", {"ttft_s": "fast"}),
    ("type", "generated_tokens", {"generated_tokens": 2.5}),
    ("type", "request_id", {"request_id": 17}),
    ("type", "itl_s", {"itl_s": [0.1, "x"]}),
    ("null", "model", {"model": None}),
    ("empty", "request_id", {"request_id": ""}),
    ("not_allowed", "finish_reason", {"finish_reason": "done"}),
    ("not_allowed", "reject_reason", {"finish_reason": "rejected", "reject_reason": "busy",
                                      "queue_s": None, "ttft_s": None, "last_token_s": None,
                                      "generated_tokens": 0, "sent_tokens": 0}),
    ("negative", "queue_s", {"queue_s": -0.1}),
    ("negative", "prompt_tokens", {"prompt_tokens": -1}),
    ("ttft_after_e2e", "ttft_s", {"ttft_s": 2.0, "last_token_s": 2.0}),
    ("last_token_after_e2e", "last_token_s", {"last_token_s": 1.7}),
    ("ttft_after_last_token", "ttft_s", {"ttft_s": 1.55}),
    ("queue_after_ttft", "queue_s", {"queue_s": 0.6}),
    ("sent_exceeds_generated", "sent_tokens", {"sent_tokens": 12}),
    ("ttft_without_token", "ttft_s", {"generated_tokens": 0, "sent_tokens": 0}),
    ("token_without_ttft", "ttft_s", {"ttft_s": None, "last_token_s": None}),
    ("ttft_last_token_mismatch", "last_token_s", {"last_token_s": None}),
    ("rejected_without_reason", "reject_reason", {"finish_reason": "rejected", "queue_s": None,
                                                  "ttft_s": None, "last_token_s": None,
                                                  "generated_tokens": 0, "sent_tokens": 0}),
    ("reason_without_rejection", "reject_reason", {"reject_reason": "queue_full"}),
    ("negative_itl", "itl_s", {"itl_s": [0.1, -0.1]}),
]
