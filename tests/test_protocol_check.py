"""`conformance check-protocol`: every tensor dtype and param type round-trips through a program's
`protocol.echo`; a program that misreads one (a BOOL [] read as I64, falling back to its default) is
caught by name, in single and batch mode, before any case runs."""

from __future__ import annotations

import sys
import textwrap

import pytest

from conftest import run_cli

ECHO = textwrap.dedent('''
    # An echo in plain Python, reading safetensors by hand as a port in another language does.
    import json, struct, sys

    MISREAD_BOOL = {misread}
    DEFAULTS = {{"sorted": True, "largest": True}}  # a port's own defaults, used when a param "is missing"

    def echo(inp, out):
        raw = open(inp, "rb").read()
        size = struct.unpack("<Q", raw[:8])[0]
        header, data = json.loads(raw[8:8 + size]), bytearray(raw[8 + size:])
        header.pop("__metadata__", None)
        for name, info in header.items():
            if MISREAD_BOOL and name.startswith("param.") and info["dtype"] == "BOOL":
                # it expects I64 here, finds no such tensor and falls back to its default
                begin, end = info["data_offsets"]
                data[begin:end] = bytes([DEFAULTS.get(name.split(".")[-1], False)]) * (end - begin)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        open(out, "wb").write(struct.pack("<Q", len(text)) + text + bytes(data))

    if sys.argv[1] == "components":
        print("quant.*"); print("protocol.echo")
    elif sys.argv[1] == "serve":
        for line in sys.stdin:
            _, component, inp, out = line.split()
            echo(inp, out)
            print("ok", flush=True)
    elif sys.argv[2] == "protocol.echo":
        echo(sys.argv[3], sys.argv[4])
''')


@pytest.fixture
def programs(tmp_path):
    good, bad = tmp_path / "echo.py", tmp_path / "misreads_bools.py"
    good.write_text(ECHO.format(misread=False))
    bad.write_text(ECHO.format(misread=True))
    return good, bad


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
def test_a_faithful_echo_passes_and_a_bool_misread_is_named(programs, tmp_path, batch):
    good, bad = programs
    flag = ["--batch"] if batch else []
    proc = run_cli("check-protocol", *flag, "--", sys.executable, str(good), cwd=tmp_path)
    assert proc.returncode == 0 and "protocol ok" in proc.stdout, proc.stdout + proc.stderr
    proc = run_cli("check-protocol", *flag, "--", sys.executable, str(bad), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if line.startswith("MISREAD")]
    named = {line.split()[1].rstrip(":") for line in lines}
    # each bool is sent once true and once false: the false ones come back as the default true
    assert named == {"param.sorted", "param.largest", "param.config.fp8"}, proc.stdout
    assert any(
        "param.sorted: sent BOOL [] = False; returned BOOL [] = True" in line and "default" in line for line in lines
    ), proc.stdout


def test_a_program_without_echo_or_with_unknown_components_is_told_what_to_do(tmp_path):
    program = tmp_path / "plain.py"
    program.write_text(
        "import sys\nif sys.argv[1] == 'components':\n    print('quant.e2m1'); print('qaunt.fp4')\n"
        "else:\n    print('unsupported no echo here')\n"
    )
    proc = run_cli("check-protocol", "--", sys.executable, str(program), cwd=tmp_path)
    assert proc.returncode == 1
    assert "'qaunt.fp4', which names no component" in proc.stdout
    assert "declined protocol.echo" in proc.stdout and "Checking the protocol" in proc.stdout
    assert run_cli("check-protocol", cwd=tmp_path).returncode == 2
