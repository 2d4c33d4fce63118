"""A ``hybridkv serve`` app on a free loopback port, in a thread (tests and the soak)."""

from __future__ import annotations

import argparse
import socket
import threading
import time
from pathlib import Path
from typing import Any


class LiveServer:
    """A uvicorn server in a thread, on a free loopback port."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def start_server(ckpt: Path, **options: Any) -> tuple[LiveServer, Any]:
    """A server over ``ckpt``; ``options`` go to ``hybridkv serve``'s parser (``True``: a
    flag without a value)."""
    from hybridkv.serving.command import add_serve_parser, build_server

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    argv = [
        "serve",
        str(ckpt),
        "--block-size",
        "4",
        "--max-model-len",
        "64",
        "--served-model-name",
        "tiny",
    ]
    for key, value in options.items():
        flag = f"--{key.replace('_', '-')}"
        argv += [flag] if value is True else [flag, str(value)]
    app, engine = build_server(parser.parse_args(argv))
    return LiveServer(app), engine
