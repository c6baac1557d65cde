"""Shared pytest options: ``--update-golden`` rewrites golden files instead of comparing with them."""

from __future__ import annotations

import os
import tempfile

import pytest

# examples/server_asgi.py writes its summaries to ./summaries unless LLMSLO_SUMMARIES names a folder: a test that
# loads or runs it without naming one writes into a temporary folder, never into the checkout.
os.environ.setdefault("LLMSLO_SUMMARIES",
                      os.path.join(tempfile.gettempdir(), f"llmslo-example-summaries-{os.getpid()}"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="Rewrite golden files from the current output (review the diff before committing).")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the run was started with ``--update-golden``."""
    return bool(request.config.getoption("--update-golden"))
