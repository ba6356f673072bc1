"""The controller's isolation children, shared by the pytest-xdist workers on its own machine.

Under `pytest -n N --conformance-impl ...`, each local worker would otherwise start a fork server
of its own (one more torch import per worker, on the critical path of its first case). Instead the
controller, which has imported torch to plan the run anyway and whose fork server warms up beside
it, keeps one `CasePool` (`v41_conformance.pool`: crash, hang and timeout handling as everywhere)
and serves it on a unix socket in a private temporary folder: a worker sends a case id per line and
reads the case's result back as one line of JSON. Workers on other machines (ssh gateways) keep
their own children.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import socketserver
import tempfile
import threading

from .case_result import CaseResult


class SharedPool:
    def __init__(self, run: dict, size: int):
        from .pool import CasePool

        self.pool = CasePool(run, size, [])
        self.folder = tempfile.mkdtemp(prefix="conformance-pool-")
        self.address = os.path.join(self.folder, "socket")
        pool = self.pool

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                try:
                    for line in self.rfile:
                        result = pool.result(line.decode().strip())
                        self.wfile.write(json.dumps(result.to_json()).encode() + b"\n")
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):  # a stopped run's worker left before its result
                    pass

        self.server = socketserver.ThreadingUnixStreamServer(self.address, Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, name="conformance-shared-pool", daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.pool.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class SharedPoolClient:
    """A worker's connection to the controller's pool: one case at a time."""

    def __init__(self, address: str):
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.connect(address)
        self.reader = self.socket.makefile("rb")

    def result(self, case_id: str) -> CaseResult:
        self.socket.sendall(case_id.encode() + b"\n")
        line = self.reader.readline()
        if not line:
            raise RuntimeError("the controller's isolation pool closed the connection (the run is ending)")
        return CaseResult.from_json(json.loads(line))

    def close(self) -> None:
        self.reader.close()
        self.socket.close()
