"""The chat page at / rendered by headless Chromium: its script runs (it
fetches /v1/models and shows the model's name) and the screenshot is a real
picture, not a blank page. Needs the Debian `chromium` package."""

import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_server import MODEL, TernServer  # noqa: E402

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1000,700",
                  "--virtual-time-budget=5000"]


def chromium():
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        pytest.fail("chromium not found: install it (apt-get install chromium)")
    return exe


def png_pixels(data):
    """Decodes a non-interlaced 8-bit RGB/RGBA PNG into (width, height, rows of bytes, channels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, rows, channels


def test_chat_page_renders():
    exe = chromium()
    srv = TernServer("--parallel", "1", "--ctx", "256")
    try:
        url = srv.base + "/"
        dom = subprocess.run([exe, *CHROMIUM_FLAGS, "--dump-dom", url], capture_output=True, text=True,
                             timeout=120).stdout
        assert "<textarea" in dom and 'id="send"' in dom
        # The script ran: it replaced the header's placeholder with the model's name.
        assert MODEL.stem in dom, dom[:2000]

        with tempfile.TemporaryDirectory() as tmp:
            shot = Path(tmp) / "page.png"
            subprocess.run([exe, *CHROMIUM_FLAGS, f"--screenshot={shot}", url], capture_output=True, timeout=120)
            assert shot.exists(), "chromium wrote no screenshot"
            width, height, rows, ch = png_pixels(shot.read_bytes())
        assert (width, height) == (1000, 700)
        lum = [sum(row[i:i + 3]) / 3 for row in rows[::4] for i in range(0, len(row), ch * 4)]
        mean = sum(lum) / len(lum)
        var = sum((v - mean) ** 2 for v in lum) / len(lum)
        distinct = len({round(v) for v in lum})
        assert var > 20 and distinct > 8, f"the page looks blank (variance {var:.1f}, {distinct} levels)"
    finally:
        assert srv.stop() == 0
