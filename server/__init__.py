"""``llmslo.server``: the reference OpenAI-compatible streaming server (extra ``serve``).

A simulated continuous-batching engine (timings fitted to measured A100/H100 runs), the OpenAI routes as a
plain ASGI app, telemetry and the serving controls wired as a user would, and the process that runs it
under uvicorn with a drain on SIGTERM. ``llmslo serve`` is the command; ``docs/server.md`` the manual.

- :class:`ServerConfig`: every flag of ``llmslo serve``, validated.
- :class:`ServerApp`: the ASGI app (in-process tests drive it with ``httpx.ASGITransport``).
- :class:`SimulatedEngine`, :class:`EngineConfig`, :class:`Engine`: the engine and its interface.
- :class:`EngineProfile`, :data:`PROFILES`, :func:`fit_profiles`: the fitted step timings.
- :func:`run_server`: serve a configuration under uvicorn until SIGTERM has drained it (needs uvicorn).
"""

from llmslo.server._app import ServerApp
from llmslo.server._config import ServerConfig, flag
from llmslo.server._engine import Engine, EngineConfig, KvCache, Sequence, SimulatedEngine
from llmslo.server._profile import DEFAULT_PROFILE, PROFILES, EngineProfile, fit_profiles
from llmslo.server._run import RunResult, run_server

__all__ = [
    "DEFAULT_PROFILE",
    "Engine",
    "EngineConfig",
    "EngineProfile",
    "KvCache",
    "PROFILES",
    "RunResult",
    "Sequence",
    "ServerApp",
    "ServerConfig",
    "SimulatedEngine",
    "fit_profiles",
    "flag",
    "run_server",
]
