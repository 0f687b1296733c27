#!/usr/bin/env python3
"""The project's two entry points. Needs nothing but python3.

    python3 make.py book [--profile paper|quick] [--force]
        create .venv if missing, install the pinned dependencies, execute every
        notebook through the runner and write the static HTML book to book/_build/html

    python3 make.py test [pytest arguments]
        create .venv if missing, install the pinned dependencies (and, as root, Debian's
        chromium and chromium-driver for the browser test), run the whole test suite

The environment is reinstalled only when requirements.txt or pyproject.toml changes.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

MIN_PYTHON = (3, 11)  # the pinned numpy 2.4.6, scipy 1.17.1 and pandas 3.1.1 need 3.11
ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".installed-from"


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def run(cmd: list[str | Path], **kw) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    result = subprocess.run([str(c) for c in cmd], cwd=ROOT, **kw)
    if result.returncode != 0:
        sys.exit(result.returncode)


def ensure_environment() -> Path:
    wanted = hashlib.sha256(
        (ROOT / "requirements.txt").read_bytes() + (ROOT / "pyproject.toml").read_bytes()
    ).hexdigest()
    if not venv_python().exists():
        run([sys.executable, "-m", "venv", VENV])
    if not STAMP.exists() or STAMP.read_text().strip() != wanted:
        py = venv_python()
        run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "-r", "requirements.txt"])
        run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             "--no-deps", "-e", "."])
        STAMP.write_text(wanted + "\n")
    return venv_python()


def check_python(version=None) -> None:
    """Stop with one line on a Python older than the pinned packages need."""
    version = tuple(version or sys.version_info)[:3]
    if version[:2] < MIN_PYTHON:
        sys.exit(f"make.py: Python {'.'.join(map(str, MIN_PYTHON))} or newer is needed (the pinned numpy, scipy and "
                 f"pandas require it); this is Python {'.'.join(map(str, version))}. Run it with a newer python3.")


def find_browser() -> tuple[str, str] | None:
    """Chromium and its ChromeDriver for the browser test: $CHROME_BIN and $CHROMEDRIVER if
    set, else the first of the usual names on the PATH (Debian's, Ubuntu's, Google's)."""
    chromium = os.environ.get("CHROME_BIN") or next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")) if p),
        None)
    driver = os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver")
    if chromium and driver and Path(chromium).exists() and Path(driver).exists():
        return chromium, driver
    return None


def is_root() -> bool:
    geteuid = getattr(os, "geteuid", None)  # absent on Windows
    return geteuid is not None and geteuid() == 0


def ensure_browser() -> None:
    """The browser test drives a headless Chromium; as root with apt-get, install Debian's
    once if none is found."""
    if find_browser():
        return
    if not is_root() or shutil.which("apt-get") is None:
        print("note: no Chromium with ChromeDriver found and they cannot be installed here (needs root and "
              "apt-get); the browser test will fail. Install them (Debian: chromium, chromium-driver) or set "
              "CHROME_BIN and CHROMEDRIVER.", flush=True)
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium", "chromium-driver"], env=env)


def main(argv: list[str]) -> None:
    check_python()
    if not argv or argv[0] not in {"book", "test"}:
        sys.exit(__doc__)
    command, rest = argv[0], argv[1:]
    py = ensure_environment()
    env = dict(os.environ, PYTHONHASHSEED="0")
    if command == "test":
        ensure_browser()
        run([py, "-m", "pytest", *rest], env=env)
    else:
        run([py, "-m", "attention_dynamics.book", "--book", *rest], env=env)


if __name__ == "__main__":
    main(sys.argv[1:])
