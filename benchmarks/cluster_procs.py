"""``bench_cluster.py``'s processes: ``hybridkv serve`` replicas on 127.0.0.1 and the
``sglang-router`` gateway in front of them (``Cluster``), and what they need."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

#: The model name every replica serves.
MODEL = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except OSError:
        return 0, ""


def wait_ready(url: str, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while get(url)[0] != 200:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not ready in time")
        time.sleep(0.2)


def router_binary() -> str | None:
    """The ``sglang-router`` command beside this Python, else on ``PATH``."""
    bindir = Path(sys.executable).parent
    return shutil.which("sglang-router", path=str(bindir)) or shutil.which("sglang-router")


def missing_requirements() -> list[str]:
    """What this benchmark needs and this environment lacks."""
    missing = [m for m in ("openai", "fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if router_binary() is None:
        missing.append("sglang-router")
    return missing


class Cluster:
    """Replicas (+ the gateway when ``policy`` is given); ``stop`` ends every process it
    started. ``ready_s``: seconds from the first replica's start until every one answers
    ``/health``."""

    def __init__(
        self, ckpt: Path, replicas: int, policy: str | None, logs: Path, options: list[str]
    ) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.replica_urls: list[str] = []
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            TOKENIZERS_PARALLELISM="false",
            HF_HUB_OFFLINE="1",
            NO_PROXY="127.0.0.1",
        )
        bindir = Path(sys.executable).parent
        label = policy or "startup"
        try:
            started = time.monotonic()
            deadline = started + 600
            for k in range(replicas):
                port = free_port()
                cmd = [str(bindir / "hybridkv"), "serve", str(ckpt), "--port", str(port)]
                cmd += ["--served-model-name", MODEL, "--log-level", "warning", *options]
                self._start(cmd, env, logs / f"{label}-replica{k}.log")
                self.replica_urls.append(f"http://127.0.0.1:{port}")
            for url, proc in zip(self.replica_urls, self.procs, strict=True):
                wait_ready(url + "/health", proc, deadline)
            self.ready_s = time.monotonic() - started
            if policy is None:
                return
            port = free_port()
            cmd = [
                router_binary() or "sglang-router",
                "launch",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--policy",
                policy,
                "--log-level",
                "warn",
                "--worker-urls",
                *self.replica_urls,
            ]
            self._start(cmd, env, logs / f"{policy}-router.log")
            self.url = f"http://127.0.0.1:{port}"
            wait_ready(self.url + "/v1/models", self.procs[-1], deadline)
        except BaseException:
            self.stop()
            raise

    def rss_mib(self) -> list[float]:
        """Each replica's resident memory (``VmRSS``), MiB."""
        out = []
        for p in self.procs[: len(self.replica_urls)]:
            for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out.append(int(line.split()[1]) / 1024)
        return out

    def _start(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        with log.open("wb") as out:
            self.procs.append(
                subprocess.Popen(
                    cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            )

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)

    def cached_fraction(self) -> tuple[float, float]:
        """Prefix-cache hit and query tokens summed over the replicas."""
        return (
            self.metric_sum("hybridkv:prefix_cache_hits_total"),
            self.metric_sum("hybridkv:prefix_cache_queries_total"),
        )

    def metric_sum(self, name: str, label: str = "") -> float:
        """The samples of ``name`` (with ``label``, e.g. ``medium="STORE"``, among
        their labels), summed over the replicas."""
        total = 0.0
        for url in self.replica_urls:
            _, text = get(url + "/metrics")
            for line in text.splitlines():
                if line.startswith((name + "{", name + " ")) and label in line:
                    total += float(line.rsplit(" ", 1)[1])
        return total
