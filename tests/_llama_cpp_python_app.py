"""llama-cpp-python's OpenAI server with llmslo's middleware installed as ``docs/middleware.md`` shows: a uvicorn
factory for the engine tests (``tests/test_middleware_llama_cpp_python.py``).

:func:`make_app` builds the server's own FastAPI app with ``create_app`` (llama-cpp-python
:data:`LLAMA_CPP_PYTHON_VERSION`, the wheel ``.ci/build-llama-cpp-python`` builds and ``.ci/setup`` installs into
``.venv``), serving the SmolLM2 model ``.ci/build-llama-server`` caches (found by ``llmslo.ops._llamacpp``), and
adds ``LlmsloMiddleware`` with the served name as its ``model``; the other ``LLMSLO_*`` variables configure it
(the GGUF file is ``llmslo.ops``'s, ``LLMSLO_GGUF`` or the cache). Run it with
``Uvicorn("llmslo.tests._llama_cpp_python_app:make_app", factory=True)`` (``tests/_middleware_app.py``).
:func:`engine_defaults_app` is the same app with the server's default settings, :func:`bare_app` the same app
without the middleware.
"""

from __future__ import annotations

from typing import Any

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The llama-cpp-python release ``.ci/build-llama-cpp-python`` builds (its ``VERSION``)."""
ALIAS = "smollm2"
"""The model name the server lists at ``/v1/models`` and answers to."""
CONTEXT_TOKENS = 2048
"""The model's context window, tokens (small: the tests send short prompts and ask for 16 tokens)."""
THREADS = 1
"""llama.cpp's threads for generation and for prompt processing: one, on the test machine's 2 shared cores, leaves
the other to uvicorn, the client and the other work there (llama.cpp's threads wait for each other at every step,
so one that loses its core stalls the others)."""


def make_app() -> Any:
    """The app, the model loaded: ``create_app`` with one model, then ``app.add_middleware(LlmsloMiddleware,
    model=ALIAS)``, as ``docs/middleware.md`` shows it.

    ``interrupt_requests=False``: by default llama-cpp-python ends a stream (``data: [DONE]`` without a finish
    reason) as soon as another request waits for the model, which the middleware rightly records
    ``error`` / ``truncated`` (:func:`engine_defaults_app`); off, a waiting request waits for the stream to end.
    ``RuntimeError`` when the model is not on this machine (``.ci/build-llama-server`` caches it)."""
    from llama_cpp.server.settings import ServerSettings

    from llmslo.telemetry import LlmsloMiddleware

    app = _create_app(ServerSettings(interrupt_requests=False))
    app.add_middleware(LlmsloMiddleware, model=ALIAS)
    return app


def engine_defaults_app() -> Any:
    """:func:`make_app` with the server's own defaults (``interrupt_requests=True``)."""
    from llama_cpp.server.settings import ServerSettings

    from llmslo.telemetry import LlmsloMiddleware

    app = _create_app(ServerSettings())
    app.add_middleware(LlmsloMiddleware, model=ALIAS)
    return app


def bare_app() -> Any:
    """:func:`make_app` without the middleware: what the server answers by itself."""
    from llama_cpp.server.settings import ServerSettings

    return _create_app(ServerSettings(interrupt_requests=False))


def _create_app(server_settings: Any) -> Any:
    """``create_app`` serving the cached SmolLM2 as :data:`ALIAS` with :data:`CONTEXT_TOKENS` of context on
    :data:`THREADS` threads; ``RuntimeError`` when the model is not on this machine."""
    from llama_cpp.server.app import create_app
    from llama_cpp.server.settings import ModelSettings

    from llmslo.ops._llamacpp import MODEL_FILE, find_model

    model = find_model()
    if model is None or not model.is_file():
        raise RuntimeError(f"the model {model or MODEL_FILE} is not on this machine: "
                           "run .ci/build-llama-server, or set LLMSLO_GGUF to a GGUF file")
    return create_app(server_settings=server_settings,
                      model_settings=[ModelSettings(model=str(model), model_alias=ALIAS, n_ctx=CONTEXT_TOKENS,
                                                    n_threads=THREADS, n_threads_batch=THREADS, verbose=False)])
