"""A Prometheus process for the live runs and the tests: started on 127.0.0.1, queried over its HTTP API.

Debian's ``prometheus`` package (2.42 here) is enough. The storage path is a folder the caller owns (the
demo's work folder, a test's temporary folder); exemplar storage is on, so the ``request_id`` exemplars
scraped over OpenMetrics can be read back (``/api/v1/query_exemplars``). Stopped by its process id.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from llmslo.ops._process import free_port, stop_process

__all__ = ["Prometheus", "PrometheusError", "RulesNotLoaded", "free_port", "rule_file_counts", "running_prometheus",
           "stop_process"]

STARTUP_TIMEOUT_S = 20.0
"""How long Prometheus may take to answer ``/-/ready``, seconds."""
RULES_TIMEOUT_S = 10.0
"""How long Prometheus may take, once ready, to report every rule of its rule files loaded, seconds."""


class PrometheusError(RuntimeError):
    """Prometheus is missing, did not start, or answered an API call with an error."""


class RulesNotLoaded(PrometheusError):
    """Prometheus runs, but did not load the rules its rule files hold (the message gives both counts)."""


@dataclass
class Prometheus:
    """A running Prometheus: its base URL, process and log file, and the rules it reported loaded."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path
    rules_loaded: tuple[int, int] = (0, 0)
    """(groups, rules) Prometheus reported loaded from its rule files when it started."""

    def get(self, path: str, params: Mapping[str, str] | None = None, timeout_s: float = 10.0) -> Any:
        """The ``data`` of an API answer (``/api/v1/...``); :class:`PrometheusError` on an error status."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=timeout_s) as response:
                body = json.loads(response.read())
        except OSError as exc:
            raise PrometheusError(f"Prometheus {path}: {exc}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"Prometheus {path} answered {body}")
        return body["data"]

    def query(self, expr: str, at_unix_s: float | None = None) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` now, or at ``at_unix_s`` (a list of ``{"metric", "value"}``)."""
        params = {"query": expr}
        if at_unix_s is not None:
            params["time"] = f"{at_unix_s:.3f}"
        return list(self.get("/api/v1/query", params)["result"])

    def query_range(self, expr: str, start_unix_s: float, end_unix_s: float,
                    step_s: float = 1.0) -> list[dict[str, Any]]:
        """The range vector of ``expr`` from ``start_unix_s`` to ``end_unix_s`` every ``step_s`` seconds, as a
        dashboard panel asks for it (a list of ``{"metric", "values"}``)."""
        params = {"query": expr, "start": f"{start_unix_s:.3f}", "end": f"{end_unix_s:.3f}", "step": f"{step_s:g}"}
        return list(self.get("/api/v1/query_range", params)["result"])

    def rule_counts(self) -> tuple[int, int]:
        """(groups, rules) Prometheus has loaded now, as ``/api/v1/rules`` lists them."""
        groups = self.get("/api/v1/rules")["groups"]
        return len(groups), sum(len(g.get("rules") or []) for g in groups)

    def wait_rules_loaded(self, expected_groups: int, expected_rules: int,
                          timeout_s: float | None = None) -> tuple[int, int]:
        """Wait until Prometheus reports exactly ``expected_groups`` rule groups holding ``expected_rules`` rules
        loaded (``/api/v1/rules``); returns them. :class:`RulesNotLoaded` with the counts it reported when they
        differ after ``timeout_s`` (a rule file it matched nothing for is no error to Prometheus: it loads
        nothing and says nothing). ``timeout_s`` defaults to :data:`RULES_TIMEOUT_S`."""
        deadline = time.monotonic() + (RULES_TIMEOUT_S if timeout_s is None else timeout_s)
        expected = (expected_groups, expected_rules)
        while True:
            try:
                loaded: tuple[int, int] | None = self.rule_counts()
            except PrometheusError:
                loaded = None
            if loaded == expected:
                return expected
            if time.monotonic() >= deadline:
                said = "no answer from /api/v1/rules" if loaded is None else \
                    f"{_count(loaded[0], 'rule group')} with {_count(loaded[1], 'rule')}"
                raise RulesNotLoaded(f"Prometheus loaded {said}, but its rule files hold "
                                     f"{_count(expected_groups, 'group')} with {_count(expected_rules, 'rule')} "
                                     f"(its log: {self.log})")
            time.sleep(0.2)

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now."""
        return list(self.get("/api/v1/alerts")["alerts"])

    def exemplars(self, expr: str, start_unix_s: float, end_unix_s: float) -> list[dict[str, Any]]:
        """The exemplars stored for the series of ``expr`` between the two times."""
        return list(self.get("/api/v1/query_exemplars", {
            "query": expr, "start": f"{start_unix_s:.3f}", "end": f"{end_unix_s:.3f}"}))

    def last_scrape_unix_s(self) -> float | None:
        """When the oldest of the last scrapes of the active targets happened (Unix seconds); None before one."""
        active = self.get("/api/v1/targets")["activeTargets"]
        times = []
        for target in active:
            text = str(target.get("lastScrape") or "")
            if text.startswith("0001-"):
                return None
            times.append(_rfc3339(text))
        return min(times) if times else None

    def wait_first_scrape(self, what: str, timeout_s: float = 15.0) -> None:
        """Wait (at most ``timeout_s``) until every active target was scraped once; :class:`PrometheusError`
        naming ``what`` (the target, for the message) when not."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.last_scrape_unix_s() is not None:
                return
            time.sleep(0.25)
        raise PrometheusError(f"Prometheus did not scrape {what} within {timeout_s:g} s")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def rule_file_counts(paths: Sequence[Path]) -> tuple[int, int]:
    """(groups, rules) the Prometheus rule files ``paths`` hold, read as Prometheus reads them (YAML: a
    ``groups`` list, each with its ``rules``). :class:`PrometheusError` for a file that is missing or not
    such a document; needs PyYAML (the ``rules`` or ``analysis`` extra)."""
    try:
        import yaml
    except ImportError:
        raise PrometheusError("counting the rules of a rule file needs PyYAML: pip install 'llmslo[rules]'") from None
    groups = rules = 0
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise PrometheusError(f"{path}: not a rule file Prometheus can read ({exc})") from None
        listed = (doc.get("groups") if isinstance(doc, dict) else doc) or []  # an empty file holds no group
        if not isinstance(listed, list) or not all(
                isinstance(g, dict) and isinstance(g.get("rules") or [], list) for g in listed):
            raise PrometheusError(f"{path}: not a Prometheus rule file (a 'groups' list, each with a 'rules' list)")
        groups += len(listed)
        rules += sum(len(g.get("rules") or []) for g in listed)
    return groups, rules


def _glob_literal(path: Path) -> str:
    """``path`` as a Go glob matching exactly it: Prometheus takes each rule file as a pattern, so a folder
    named ``run[1]`` would match nothing (and load nothing, silently) unless ``*?[\\`` are escaped."""
    return re.sub(r"([*?\[\\])", r"\\\1", str(path))


_RFC3339 = re.compile(r"(?P<head>[^.Z+]+(?:T[0-9:]+)?)(?:\.(?P<frac>[0-9]+))?(?P<zone>Z|[+-][0-9:]+)?$")


def _rfc3339(text: str) -> float:
    """Unix seconds of one of Prometheus's RFC 3339 times (nanosecond fractions, ``Z`` or an offset)."""
    match = _RFC3339.match(text.strip())
    if match is None:
        raise PrometheusError(f"Prometheus answered a time that is not RFC 3339: {text!r}")
    zone = match["zone"] or "Z"
    stamp = datetime.fromisoformat(match["head"] + ("+00:00" if zone == "Z" else zone))
    return stamp.timestamp() + (float(f"0.{match['frac']}") if match["frac"] else 0.0)


@contextmanager
def running_prometheus(folder: Path, targets: Sequence[str], *, job: str, rule_files: Sequence[Path] = (),
                       scrape_interval: str = "1s", evaluation_interval: str = "1s") -> Iterator[Prometheus]:
    """Run Prometheus scraping ``targets`` (``host:port``) as ``job`` with ``rule_files``; stopped on exit.

    Its configuration, storage and log live in ``folder``. With ``rule_files`` it yields only once Prometheus
    reports every group and rule of them loaded (:meth:`Prometheus.wait_rules_loaded`; the counts in
    ``rules_loaded``). :class:`PrometheusError` when the binary is missing (install Debian's ``prometheus``),
    a rule file is missing or unreadable, or Prometheus did not become ready; :class:`RulesNotLoaded` when it
    loaded other counts than the files hold.
    """
    binary = shutil.which("prometheus")
    if binary is None:
        raise PrometheusError("prometheus is not installed (Debian: apt-get install prometheus)")
    missing = [str(p) for p in rule_files if not p.is_file()]
    if missing:  # Prometheus takes each as a glob: a missing file would load no rule, silently
        raise PrometheusError(f"no such rule file: {', '.join(missing)}")
    expected = rule_file_counts(rule_files)
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval,
                   "scrape_timeout": scrape_interval},
        # absolute (Prometheus reads a relative one from its config's folder) and glob-escaped (each is a pattern)
        "rule_files": [_glob_literal(p.resolve()) for p in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}],
    }
    folder.mkdir(parents=True, exist_ok=True)
    config_path = folder / "prometheus.yml"
    config_path.write_text(json.dumps(config, indent=2))  # JSON is YAML: no YAML writer needed
    port = free_port()
    log = folder / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [binary, f"--config.file={config_path}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--enable-feature=exemplar-storage"],
            stdout=out, stderr=subprocess.STDOUT)
    prometheus = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=1.0) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise PrometheusError(f"Prometheus did not start; its log ends: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        if rule_files:
            prometheus.rules_loaded = prometheus.wait_rules_loaded(*expected)
        yield prometheus
    finally:
        stop_process(process)
