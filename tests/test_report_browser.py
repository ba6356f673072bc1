"""report.html in a real browser: headless Chromium renders the page and its pictures.

Skips, saying why, where no Chromium is installed (`make browser` installs it on Debian).
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from conftest import ROOT
from test_changes import run_in_process

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def _browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(
        "no Chromium or Chrome on PATH: the report is not checked in a browser here "
        "(`make browser` installs Chromium on Debian)"
    )


def _run_browser(browser: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={cwd / 'profile'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def read_png(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and the rows of an 8-bit RGB or RGBA PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, f"unexpected PNG format {header}"
    channels = 4 if colour == 6 else 3
    raw = zlib.decompress(b"".join(chunks))
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up, corner = previous[x], previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, [bytes(r[i] for j in range(0, len(r), channels) for i in range(j, j + 3)) for r in rows]


def _has_colour(rows: list[bytes], rgb: tuple[int, int, int], tolerance: int = 24) -> int:
    count = 0
    for row in rows:
        for i in range(0, len(row), 3):
            if all(abs(row[i + k] - rgb[k]) <= tolerance for k in range(3)):
                count += 1
    return count


def test_report_renders_with_its_pictures_in_a_real_browser(tmp_path):
    browser = _browser()
    report = tmp_path / "rep"
    doc = run_in_process(
        report,
        f"{ROOT}/tests/impls/wrong_attention.py:NoInverseRope",
        select=["attention/a-p5-d7-d9-d1x2-gen-upstream", "sparse_attn/*"],
    )
    assert doc["exit_code"] == 1
    page = (report / "report.html").resolve()
    dom = _run_browser(browser, "--dump-dom", page.as_uri(), cwd=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    source = page.read_text()
    for kind in ("headroom", "histogram", "steps"):
        assert source.count(f"<svg class='{kind}'") > 0
        assert dom.stdout.count(f'<svg class="{kind}"') == source.count(f"<svg class='{kind}'"), kind
    shot = tmp_path / "shot.png"
    proc = _run_browser(browser, f"--screenshot={shot}", "--window-size=1000,1000", page.as_uri(), cwd=tmp_path)
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    width, height, rows = read_png(shot)
    assert (width, height) == (1000, 1000)
    assert _has_colour(rows, (0xC6, 0x28, 0x28)) > 500  # the failing bars and cells, drawn
    assert _has_colour(rows, (0x2E, 0x85, 0x40)) > 100  # the passing ones
