"""One source of truth for the pins, and the CI entry point that runs the README's command."""
from __future__ import annotations

import re

import yaml

PIN = re.compile(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)$")


def pins(lines):
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        m = PIN.match(line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_environment_yml_has_the_same_pins_as_requirements(root):
    req = pins((root / "requirements.txt").read_text().splitlines())
    env = yaml.safe_load((root / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert req, "requirements.txt pins nothing"
    assert pins(pip_section) == req
    bare = [d for d in pip_section if not d.startswith("-") and "==" not in d]
    assert bare == [], f"unpinned packages in environment.yml: {bare}"


def test_requirements_are_all_pinned_and_torch_is_the_cpu_release(root):
    lines = [l.split("#", 1)[0].strip() for l in (root / "requirements.txt").read_text().splitlines()]
    lines = [l for l in lines if l]
    assert all(PIN.match(l) for l in lines), [l for l in lines if not PIN.match(l)]
    assert pins(lines)["torch"] == "2.13.0"
    assert pins(lines)["jupyter-book"].startswith("1.")


def test_pyproject_dependencies_are_pinned_in_requirements(root):
    """Every package the library asks for, extras included, is pinned in requirements.txt,
    and the pin lies in the range pyproject.toml allows (so the book's own environment is
    one the package accepts). torch is a range, not a pin: the library installs beside the
    torch a kernel already has (Colab's)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    req = pins((root / "requirements.txt").read_text().splitlines())
    extras = project.get("optional-dependencies", {})
    assert {"ssm", "dask", "book"} <= set(extras), sorted(extras)
    for dep in project["dependencies"] + [d for group in extras.values() for d in group]:
        r = Requirement(dep)
        name = r.name.lower()
        assert name in req, f"{name} is a dependency of the package but not pinned in requirements.txt"
        assert r.specifier.contains(req[name], prereleases=True), f"{dep} excludes the pinned {name}=={req[name]}"
    (torch,) = [Requirement(d) for d in project["dependencies"] if Requirement(d).name == "torch"]
    assert not any(s.operator in ("==", "===") for s in torch.specifier), f"torch is pinned in pyproject: {torch}"
    assert any(s.operator == ">=" for s in torch.specifier), f"torch has no lower bound: {torch}"


def test_ci_runs_the_readme_test_command(root):
    readme = (root / "README.md").read_text()
    ci = (root / ".ci" / "run").read_text()
    command = "python3 make.py test"
    assert command in readme and "python3 make.py book" in readme
    body = [l.strip() for l in ci.splitlines() if l.strip() and not l.strip().startswith("#")]
    assert body[-1] in (command, f"exec {command}"), body


def test_license_citation_and_changelog_agree_with_the_package(root):
    """One license, one version and one repository address, said the same way everywhere."""
    import tomllib

    import attention_dynamics

    meta = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "MIT" and (root / "LICENSE").read_text().startswith("MIT License")
    cff = yaml.safe_load((root / "CITATION.cff").read_text())
    assert cff["license"] == meta["license"] and cff["version"] == attention_dynamics.__version__
    repo = yaml.safe_load((root / "book" / "_config.yml").read_text())["repository"]["url"]
    assert cff["repository-code"] == repo == meta["urls"]["Repository"]
    assert meta["urls"]["Changelog"].startswith(repo) and (root / "CHANGELOG.md").is_file()
    reproduced = [r for r in cff["references"] if "2512.22473" in r.get("journal", "")]
    assert len(reproduced) == 1 and [a["family-names"] for a in reproduced[0]["authors"]] == ["Agarwal", "Dalal", "Misra"]
