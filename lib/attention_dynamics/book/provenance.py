"""Where every number came from: the provenance a record carries and the footer every
chapter ends with (settings, software, commit, and the exact commands that redo the run)."""
from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import time
from pathlib import Path

import yaml

from .. import __version__
from .profiles import format_value

__all__ = ["provenance", "reproduce_commands", "repository", "launch_links", "provenance_markdown",
           "append_provenance", "CLI"]

# How a reader runs the book's command line (python -m attention_dynamics.book).
CLI = "python -m attention_dynamics.book"


def _git(root: str, *args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def provenance(job, key: str, seconds: float) -> dict:
    from ..machine import cpu_model

    import torch

    commit = _git(job.root, "rev-parse", "HEAD") or "unknown"
    dirty = bool(_git(job.root, "status", "--porcelain", "--untracked-files=no"))
    rel = os.path.relpath(job.notebook, job.root)
    runner, papermill = reproduce_commands(job, rel)
    return {
        "chapter": job.name,
        "profile": job.profile,
        "parameters": job.parameters,
        "git_commit": commit,
        "git_dirty": dirty,
        "library_version": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "cpu": cpu_model(),
        "threads": int(os.environ.get("OMP_NUM_THREADS") or torch.get_num_threads()),
        "executed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(seconds, 2),
        "cache_key": key,
        "runner_command": f"{CLI} --profile {job.profile} --only {job.name}",
        "papermill_command": papermill,
        "runner_command_explicit": runner,
    }


def reproduce_commands(job, notebook_rel: str) -> tuple[str, str]:
    """The runner and papermill commands that redo ``job`` exactly, shell-quoted, with every
    parameter written so that both parsers read back the value that was run."""
    sets = " ".join(f"--set {shlex.quote(f'{k}={format_value(v)}')}" for k, v in job.parameters.items())
    runner = f"{CLI} --profile {job.profile} --only {job.name} {sets}".strip()
    values = dict(sorted(job.parameters.items()), profile=job.profile)
    papermill = f"papermill {shlex.quote(notebook_rel)} {shlex.quote(job.stem + '.ipynb')} -y {shlex.quote(format_value(values))}"
    return runner, papermill


def repository(root: Path) -> dict:
    """The repository address and branch, set once in book/_config.yml."""
    cfg_path = root / "book" / "_config.yml"
    if not cfg_path.is_file():
        return {}
    with open(cfg_path) as f:
        return (yaml.safe_load(f) or {}).get("repository", {}) or {}


def launch_links(repo: dict, name: str) -> dict[str, str]:
    """Binder and Colab addresses of notebooks/NAME.ipynb, for a GitHub repository."""
    url = str(repo.get("url", "")).rstrip("/")
    if not url.startswith("https://github.com/"):
        return {}
    slug, branch = url.removeprefix("https://github.com/"), repo.get("branch", "main")
    return {
        "Binder": f"https://mybinder.org/v2/gh/{slug}/{branch}?labpath=notebooks%2F{name}.ipynb",
        "Colab": f"https://colab.research.google.com/github/{slug}/blob/{branch}/notebooks/{name}.ipynb",
    }


def _models_text(models: list[dict]) -> str:
    """The trained models a chapter took from the store or made and stored, with the
    seconds their training took (:func:`attention_dynamics.artifacts.models_used`)."""
    from ..store import recorded_models

    models = recorded_models(models)
    if not models:
        return "none"
    parts = []
    for loaded, verb in ((True, "loaded from the store (trained in {:.0f} s)"), (False, "trained here in {:.0f} s")):
        group = [m["seconds"] for m in models if m["loaded"] is loaded]
        if group:
            parts.append(f"{len(group)} " + verb.format(sum(group)))
    return "; ".join(parts)


def provenance_markdown(prov: dict, repo: dict) -> str:
    """The footer every chapter of the book ends with."""
    params = json.dumps(prov["parameters"], sort_keys=True)
    commit = prov["git_commit"][:12] + (" (with uncommitted changes)" if prov["git_dirty"] else "")
    links = launch_links(repo, prov["chapter"])
    lines = [
        "## Provenance",
        "",
        "Every number and figure on this page was computed by the notebook "
        f"`notebooks/{prov['chapter']}.ipynb` with these settings:",
        "",
        "| | |",
        "|---|---|",
        f"| profile | `{prov['profile']}` |",
        f"| parameters | `{params}` |",
        f"| library | `attention_dynamics` {prov['library_version']}, git commit `{commit}` |",
        f"| software | Python {prov['python']}, PyTorch {prov['torch']} |",
        f"| executed | {prov['executed_at']} in {prov['seconds']:.0f} s on {prov['machine']} |",
        *([f"| trained on | {prov['device']} |"] if prov.get("device") else []),
        f"| computation paths | {_paths_text(prov.get('paths', {}))} |",
        f"| stored models | {_models_text(prov.get('models', []))} |",
        "",
        "To reproduce it exactly, from the repository root:",
        "",
        "```bash",
        f".venv/bin/{prov['runner_command_explicit']} --out my-runs",
        "```",
        "",
        "or with papermill directly:",
        "",
        "```bash",
        f".venv/bin/{prov['papermill_command']}",
        "```",
    ]
    if links:
        lines += ["", "Run it in the cloud: " + " · ".join(f"[{k}]({v})" for k, v in links.items())
                  + " (see *Rerun a chapter* for the set-up each needs)."]
    return "\n".join(lines)


def _paths_text(paths: dict) -> str:
    if not paths:
        return "no compiled kernel involved"
    return ", ".join(f"{name}: {path}" for name, path in paths.items()) + \
        " (the kernels are chosen per processor; ATTENTION_DYNAMICS_NATIVE=0 forces PyTorch)"


def append_provenance(notebook: Path, prov: dict, repo: dict) -> None:
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    for c in nb.cells:  # the runner's own bookkeeping is not part of the chapter
        if "injected-parameters" in c.metadata.get("tags", []):
            kept = [l for l in c.source.splitlines() if not l.startswith("record_path =") and l != "# Parameters"]
            c.source = "\n".join(["# Parameters of this run (set by the runner; see Provenance at the end)"] + kept)
            c.metadata["tags"] = sorted(set(c.metadata["tags"]) | {"hide-input"})
    cell = nbformat.v4.new_markdown_cell(provenance_markdown(prov, repo))
    cell.metadata["tags"] = ["provenance"]
    nb.cells.append(cell)
    nbformat.write(nb, notebook)
