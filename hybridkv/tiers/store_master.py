"""``MooncakeMaster``: a ``mooncake_master`` process on free loopback ports.

For tests, benchmarks and a one-machine cluster (``docs/cluster.md``): it
starts the master with its HTTP metadata server, all on 127.0.0.1, waits
until both answer, and gives the ``kv_store`` URL of it. ``kill`` ends it at
once (SIGKILL: a crash), ``start`` brings it back on the same ports (an empty
store: the master keeps no state), ``stop`` ends it for good. The master's
log goes to a file (it logs every request).

    with MooncakeMaster() as master:
        llm = LLM(model, kv_store=master.url)
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

#: How long ``start`` waits for the master's ports.
START_SECONDS = 30.0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def master_binary() -> str:
    """The ``mooncake_master`` of this Python's environment, else on ``PATH``."""
    beside = Path(sys.executable).parent / "mooncake_master"
    found = str(beside) if beside.exists() else shutil.which("mooncake_master")
    if found is None:
        raise FileNotFoundError(
            "mooncake_master not found: pip install 'hybridkv[store]' "
            "(and Debian's libibverbs1: apt-get install libibverbs1)"
        )
    return found


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


class MooncakeMaster:
    """One ``mooncake_master`` on loopback (module docstring).

    ``lease_ms``: how long an object read or written stays unevictable (the
    master's ``--default_kv_lease_ttl``; short in tests so that a full store
    frees room quickly).
    """

    def __init__(self, lease_ms: int = 1000, log_dir: str | Path | None = None) -> None:
        self.port = free_port()
        self.metadata_port = free_port()
        self.metrics_port = free_port()
        self.lease_ms = lease_ms
        self._log_dir = Path(log_dir or tempfile.mkdtemp(prefix="mooncake-master-"))
        self.log_path = self._log_dir / f"master-{self.port}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """The ``kv_store`` URL of this master."""
        return (
            f"mooncake://127.0.0.1:{self.port}"
            f"?metadata=http://127.0.0.1:{self.metadata_port}/metadata"
        )

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> MooncakeMaster:
        """Start it (on the same ports as before) and wait until it answers."""
        if self.running:
            return self
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by kill()/stop()
        self._proc = subprocess.Popen(
            [
                master_binary(),
                f"--rpc_port={self.port}",
                "--rpc_address=127.0.0.1",
                "--enable_http_metadata_server=true",
                "--http_metadata_server_host=127.0.0.1",
                f"--http_metadata_server_port={self.metadata_port}",
                "--metrics_host=127.0.0.1",
                f"--metrics_port={self.metrics_port}",
                f"--default_kv_lease_ttl={self.lease_ms}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_SECONDS
        while not (_answers(self.port) and _answers(self.metadata_port)):
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"mooncake_master exited with code {self._proc.returncode} "
                    f"(its log: {self.log_path})"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"mooncake_master did not answer in {START_SECONDS} s")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        """End it at once (SIGKILL), as a crash would."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        """End it (SIGTERM, then SIGKILL after 5 s)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
        self.kill()

    def __enter__(self) -> MooncakeMaster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
