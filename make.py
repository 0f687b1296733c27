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


BROWSER = ("/usr/bin/chromium", "/usr/bin/chromedriver")


def ensure_browser() -> None:
    """The browser test drives Debian's headless Chromium; install it once if missing."""
    if all(Path(p).exists() for p in BROWSER):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        print("note: Chromium is missing and cannot be installed here (needs root and apt-get); "
              "the browser test will fail. Install the Debian packages chromium and chromium-driver.", flush=True)
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium", "chromium-driver"], env=env)


def main(argv: list[str]) -> None:
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
