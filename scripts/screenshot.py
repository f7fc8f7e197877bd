#!/usr/bin/env python3
"""The README's picture: the status page of ``llm-latency demo`` with every target diagnosed.

Starts the demo (emulated engines and the monitor) on a free port with a scratch data
directory, waits until each demo target carries the verdict it is built to show, takes a
screenshot of ``/`` in headless Chromium (Debian's ``/usr/bin/chromium`` driven by
Playwright; never ``playwright install``) and stops the demo by its process id.

    python3 scripts/screenshot.py                      # writes docs/images/status-page.png
    python3 scripts/screenshot.py --out /tmp/page.png --timeout 300

Re-take it when the status page changes. Exit status: 0 written, 1 the demo did not show
its verdicts in time (or stopped), 2 Chromium or Playwright is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.cli import DEMO_TARGETS  # noqa: E402 (the repository's own package, found through ROOT)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DEFAULT_OUT = ROOT / "docs" / "images" / "status-page.png"
#: The verdict each demo target is built to show.
EXPECTED = {name: ("healthy" if scenario.startswith("healthy") else scenario) for name, scenario, _ in DEMO_TARGETS}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def verdicts(base: str) -> dict[str, str]:
    """The demo's current verdicts by target, a finding's only once it is active (held for the
    lifecycle's evaluations, no longer "pending"); empty while the demo does not answer yet."""
    try:
        with urllib.request.urlopen(f"{base}/api/v1/diagnoses", timeout=5) as response:
            diagnoses = json.load(response)
    except (urllib.error.URLError, OSError, ValueError):
        return {}
    return {d["target"]: d["verdict"] for d in diagnoses
            if d["verdict"] == "healthy" or d["verdict"] in (d.get("active") or [])}


def wait_for_verdicts(base: str, demo: subprocess.Popen[bytes], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        if demo.poll() is not None:
            raise SystemExit(f"screenshot: the demo stopped (exit {demo.returncode})")
        seen = verdicts(base)
        if seen == EXPECTED:
            return seen
        time.sleep(2)
    raise SystemExit(f"screenshot: after {timeout:.0f} s the verdicts are {seen}, expected {EXPECTED}")


def screenshot(url: str, out: Path, width: int, height: int) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("screenshot: the playwright package is missing (pip install -e '.[test]')", file=sys.stderr)
        sys.exit(2)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": height}, color_scheme="light")
            page.goto(url, wait_until="load")
            out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(out), full_page=True)  # the page's own height
        finally:
            browser.close()


def stop(demo: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as a user stops the demo; killed if it does not stop within 20 s."""
    if demo.poll() is None:
        os.kill(demo.pid, signal.SIGINT)
        try:
            demo.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(demo.pid, signal.SIGKILL)
            demo.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="PNG to write (default: %(default)s)")
    parser.add_argument("--port", type=int, default=0, help="the demo's port (default: a free one)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for the verdicts")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=400, help="the viewport's; the picture takes the page's")
    args = parser.parse_args()
    if not os.access(CHROMIUM, os.X_OK):
        print(f"screenshot: {CHROMIUM} is missing (apt-get install chromium)", file=sys.stderr)
        return 2
    command = shutil.which("llm-latency")
    if command is None:
        print("screenshot: the llm-latency command is missing (python3 -m pip install -e .)", file=sys.stderr)
        return 2
    port = args.port or free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="llm-latency-screenshot-") as scratch:
        demo = subprocess.Popen([command, "demo", "--port", str(port), "--data-dir", scratch],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            print(f"demo started (pid {demo.pid}) on {base}; waiting for its verdicts", file=sys.stderr)
            wait_for_verdicts(base, demo, args.timeout)
            screenshot(f"{base}/", args.out, args.width, args.height)
        finally:
            stop(demo)
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
