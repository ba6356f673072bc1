"""The language-neutral adapter: a command that reads and writes safetensors files.

See docs/subprocess-protocol.md for the full protocol. In short, for each call the harness writes
the inputs (plus every scalar param as a 0-dim tensor `param.<name>`, and all params as JSON in
the metadata key `params`) to a safetensors file, and the program writes its outputs to another.
- single mode: `COMMAND run COMPONENT INPUTS OUTPUTS` once per call; exit 0 means success.
- batch mode (`batch: true`): `COMMAND serve` stays alive; the harness writes
  `run COMPONENT INPUTS OUTPUTS` lines to its stdin and reads one line back per request:
  `ok`, `error <message>` or `unsupported <reason>` (that case alone is `unsupported`).
In single mode a stdout line `unsupported <reason>` (exit 0, no output file) declines the case.
Capabilities: the output of `COMMAND components` (one component name or pattern per line), asked
once, narrowed by `supports:` patterns in conformance.yaml as for every implementation kind (a
program that has no `components` answer is taken at its `supports:` patterns).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Any

import torch
from safetensors.torch import load_file, save_file

from ..errors import UsageError
from .base import Unsupported

# Every answer line a batch program may give (docs/subprocess-protocol.md).
ANSWERS = "'ok', 'error <message>' or 'unsupported <reason>'"


class ImplementationError(RuntimeError):
    """The external program reported an error or broke the protocol."""


DECLINED_KEY = "declined"  # output-file metadata: JSON {output: reason} of the outputs the program declines


def read_outputs(path: Path) -> dict[str, Any]:
    """The tensors of an output file, and a `Declined` for each output its metadata declines."""
    from safetensors import safe_open

    from .base import Declined

    outputs: dict[str, Any] = load_file(str(path))
    with safe_open(str(path), framework="pt") as handle:
        raw = (handle.metadata() or {}).get(DECLINED_KEY)
    if raw:
        try:
            declined = json.loads(raw)
            assert isinstance(declined, dict)
        except (ValueError, AssertionError):
            raise ImplementationError(
                f"output metadata '{DECLINED_KEY}' must be a JSON object {{\"output\": \"reason\"}}, not {raw[:200]!r}"
            ) from None
        for name, reason in declined.items():
            outputs[str(name)] = Declined(str(reason))
    return outputs


def _command(conf: dict[str, Any], name: str, root: Path) -> list[str]:
    command = conf.get("command")
    if isinstance(command, str):
        command = shlex.split(command)
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise UsageError(f"conformance.yaml: impls.{name}.command must be a string or a list of strings")
    first = Path(command[0])
    if not first.is_absolute() and (root / first).exists():
        command = [str(root / first), *command[1:]]
    return command


def param_tensors(params: dict[str, Any], prefix: str = "param.") -> dict[str, torch.Tensor]:
    """Every param as tensors, by its type (the catalogue declares each param's type):

    int -> I64 [], float -> F64 [], bool -> BOOL [], str -> U8 [n] (UTF-8 bytes), a list of ints ->
    I64 [n], a list of pairs -> I64 [n, 2], a mapping -> one tensor per field, named
    `param.<name>.<field>` (recursively; None fields are left out).
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            out[name] = torch.tensor(value, dtype=torch.bool)
        elif isinstance(value, int):
            out[name] = torch.tensor(value, dtype=torch.int64)
        elif isinstance(value, float):
            out[name] = torch.tensor(value, dtype=torch.float64)
        elif isinstance(value, str):
            out[name] = torch.tensor(list(value.encode("utf-8")), dtype=torch.uint8)
        elif isinstance(value, dict):
            out.update(param_tensors(value, f"{name}."))
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, list, tuple)) for v in value):
            out[name] = torch.tensor(value, dtype=torch.int64).reshape(
                len(value), *([2] if value and isinstance(value[0], (list, tuple)) else [])
            )
    return out


def write_request(path: Path, component: str, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> None:
    """One call's input file, exactly as a program receives it (docs/subprocess-protocol.md)."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in inputs.items()}
    tensors.update(param_tensors(params))
    save_file(tensors, str(path), metadata={"component": component, "params": json.dumps(params)})


class SubprocessAdapter:
    def __init__(
        self,
        name: str,
        command: list[str],
        batch: bool,
        supports: list[str] | None,
        root: Path,
        call_timeout: float | None = None,
    ):
        self.name = name
        self.command = command
        self.batch = batch
        self.root = root
        self.call_timeout = call_timeout
        self._patterns = list(supports) if supports is not None else None  # conformance.yaml's supports:
        self._answer: list[str] | None = None  # what `COMMAND components` lists
        self._server: subprocess.Popen | None = None
        self._stderr: IO[bytes] | None = None  # the batch process's stderr file
        self._stderr_read = 0
        self._tmp = tempfile.TemporaryDirectory(prefix="conformance-io-")
        self._count = 0

    @classmethod
    def from_conf(cls, name: str, conf: dict[str, Any], root: Path) -> SubprocessAdapter:
        from .supports import supports_patterns

        adapter = cls(
            name, _command(conf, name, root), bool(conf.get("batch", False)), supports_patterns(conf, name), root
        )
        if not Path(adapter.command[0]).exists() and not _on_path(adapter.command[0]):
            raise UsageError(f"impls.{name}: command {adapter.command[0]!r} not found (build it first?)")
        return adapter

    def supports(self, component: str) -> bool:
        """What `COMMAND components` lists, narrowed by the `supports:` patterns of conformance.yaml."""
        from .supports import matches_any

        if self._patterns is not None and not matches_any(component, self._patterns):
            return False
        return matches_any(component, self.components_answer())

    def components_answer(self) -> list[str]:
        """What `COMMAND components` lists (asked once); `*` for a program without the answer that
        has `supports:` patterns."""
        if self._answer is None:
            proc = subprocess.run(
                [*self.command, "components"], capture_output=True, text=True, timeout=60, cwd=self.root
            )
            if proc.returncode == 0:
                self._answer = [line.strip() for line in proc.stdout.splitlines() if line.strip()]
            elif self._patterns is not None:  # no `components` answer: the patterns say it all
                self._answer = ["*"]
            else:
                raise ImplementationError(
                    f"`{' '.join(self.command)} components` exited {proc.returncode}: "
                    f"{proc.stderr[-500:]} (answer it, or list supports: in conformance.yaml)"
                )
        return self._answer

    def run(self, component: str, inputs: dict[str, torch.Tensor], params: dict[str, Any]) -> dict[str, torch.Tensor]:
        self._count += 1
        folder = Path(self._tmp.name)
        in_path, out_path = folder / f"in{self._count}.safetensors", folder / f"out{self._count}.safetensors"
        write_request(in_path, component, inputs, params)
        try:
            if self.batch:
                try:
                    self._request(component, in_path, out_path)
                finally:
                    self._forward_stderr()
            else:
                proc = subprocess.run(
                    [*self.command, "run", component, str(in_path), str(out_path)], capture_output=True, cwd=self.root
                )
                _forward(1, proc.stdout)
                _forward(2, proc.stderr)
                declined = next(
                    (
                        line
                        for line in proc.stdout.decode("utf-8", "replace").splitlines()
                        if line.startswith("unsupported")
                    ),
                    None,
                )
                if proc.returncode == 0 and declined is not None:
                    raise Unsupported(declined[len("unsupported") :].strip() or "declined by the program")
                if proc.returncode != 0:
                    stderr = proc.stderr.decode("utf-8", "replace").strip()
                    raise ImplementationError(f"exited with code {proc.returncode}: {stderr[-1000:]}")
            if not out_path.exists():
                raise ImplementationError(f"wrote no output file {out_path.name}")
            return read_outputs(out_path)
        finally:
            for path in (in_path, out_path):
                if path.exists():
                    path.unlink()

    def _request(self, component: str, in_path: Path, out_path: Path) -> None:
        if self._server is None or self._server.poll() is not None:
            # stderr goes to a file of its own; after each request the new part is copied to this
            # process's stderr, so it lands in the capture of the case that caused it
            self._stderr = open(Path(self._tmp.name) / "serve.stderr", "ab+")
            self._server = subprocess.Popen(
                [*self.command, "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
                bufsize=1,
                cwd=self.root,
            )
        server = self._server
        assert server.stdin is not None and server.stdout is not None  # started with both piped
        try:
            server.stdin.write(f"run {component} {in_path} {out_path}\n")
            server.stdin.flush()
        except BrokenPipeError:
            raise ImplementationError(f"the batch process exited with code {server.wait()}") from None
        line = server.stdout.readline()
        if not line:
            code = server.wait()
            self._server = None
            raise ImplementationError(f"the batch process exited (code {code}) without answering")
        line = line.strip()
        if line == "ok":
            return
        if line.startswith("error"):
            raise ImplementationError(line[5:].strip() or "error")
        if line.startswith("unsupported"):
            raise Unsupported(line[len("unsupported") :].strip() or "declined by the program")
        # Its answers no longer line up with the requests: start a fresh process for the next case.
        self.close(kill=True)
        raise ImplementationError(
            f"this case broke the protocol: the batch process answered {line[:200]!r} instead of "
            f"{ANSWERS} (anything else on stdout breaks it: write logs to stderr); the process "
            "was restarted for the next case"
        )

    def _forward_stderr(self) -> None:
        """Copy what the batch process wrote to stderr since the last request to our stderr."""
        if self._stderr is None:
            return
        self._stderr.seek(self._stderr_read)
        data = self._stderr.read()
        self._stderr_read += len(data)
        _forward(2, data)

    def close(self, kill: bool = False) -> None:
        if self._server is not None and self._server.poll() is None:
            try:
                if kill:
                    raise ProcessLookupError
                assert self._server.stdin is not None  # started with stdin piped
                self._server.stdin.close()
                self._server.wait(timeout=5)
            except Exception:
                self._server.kill()
                self._server.wait()
        self._server = None
        if self._stderr is not None:
            self._forward_stderr()
            self._stderr.close()
            self._stderr, self._stderr_read = None, 0

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _forward(fd: int, data: bytes) -> None:
    """Write a program's output to our own fd 1 or 2 (captured per case; see v41_conformance.capture)."""
    if data:
        try:
            os.write(fd, data)
        except OSError:
            pass


def _on_path(program: str) -> bool:
    return any((Path(p) / program).exists() for p in os.environ.get("PATH", "").split(os.pathsep))
