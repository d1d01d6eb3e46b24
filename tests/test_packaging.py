"""The packages' metadata as an index and pip see it (``.ci/wheels`` builds and installs them).

Checked here from the sources, quickly: every package has the license, bounds on its
sibling packages that match their versions, the project URLs; ``monitored[all]`` names
every plugin; the README's Quickstart is two commands, CI runs the second, and the demo
command installs no development tools.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = sorted(p.parent for p in ROOT.glob("plugins/*/pyproject.toml"))
PROJECTS = [ROOT, *PLUGINS]


def project(path: Path) -> dict[str, Any]:
    return tomllib.loads((path / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


VERSIONS = {project(p)["name"]: Version(project(p)["version"]) for p in PROJECTS}


def expected_bound(version: Version) -> SpecifierSet:
    """The same minor version or a later patch: ``>=0.1.0,<0.2``."""
    return SpecifierSet(f">={version},<{version.major}.{version.minor + 1}")


@pytest.mark.parametrize("path", PROJECTS, ids=lambda p: p.name)
def test_every_package_ships_the_license(path: Path) -> None:
    meta = project(path)
    assert meta["license"] == "Apache-2.0"
    assert meta["license-files"] == ["LICENSE"]
    # a copy per plugin (hatchling takes license files from inside the project only)
    assert (path / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert "Apache License" in (path / "LICENSE").read_text()


@pytest.mark.parametrize("path", PROJECTS, ids=lambda p: p.name)
def test_every_dependency_on_a_sibling_package_is_bounded_to_its_minor_version(
    path: Path,
) -> None:
    meta = project(path)
    requirements = [Requirement(r) for r in meta.get("dependencies", [])]
    for extra in meta.get("optional-dependencies", {}).values():
        requirements += [Requirement(r) for r in extra]
    siblings = [r for r in requirements if r.name in VERSIONS]
    if path != ROOT:
        assert "monitored" in {r.name for r in siblings}
    for requirement in siblings:
        assert requirement.specifier == expected_bound(VERSIONS[requirement.name]), requirement


def test_the_all_extra_is_every_plugin_and_what_the_examples_need() -> None:
    extra = {Requirement(r).name for r in project(ROOT)["optional-dependencies"]["all"]}
    assert extra == {project(p)["name"] for p in PLUGINS} | {"scikit-learn"}


@pytest.mark.parametrize("path", PROJECTS, ids=lambda p: p.name)
def test_every_package_has_project_urls_and_a_readme_without_unpublished_talk(
    path: Path,
) -> None:
    assert project(path)["urls"] == project(ROOT)["urls"]
    readme = (path / "README.md").read_text()
    assert "not published" not in readme.lower()
    assert "pip install" in readme


@pytest.mark.parametrize("path", PROJECTS, ids=lambda p: p.name)
def test_every_relative_readme_link_is_made_absolute_for_the_index(path: Path) -> None:
    """Applies the build's substitutions (hatch-fancy-pypi-readme) as it does, in order."""
    config = tomllib.loads((path / "pyproject.toml").read_text())
    hook = config["tool"]["hatch"]["metadata"]["hooks"]["fancy-pypi-readme"]
    assert [f["path"] for f in hook["fragments"]] == ["README.md"]
    text = (path / "README.md").read_text()
    for sub in hook["substitutions"]:
        text = re.sub(sub["pattern"], sub["replacement"], text)
    links = re.findall(r"\]\(([^)]*)\)", text)
    assert links
    assert [link for link in links if not link.startswith("https://")] == []
    assert not [link for link in links if "/index/" in link or link.endswith(".md")]


def quickstart_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_the_quickstart_is_two_commands_and_ci_runs_the_test_command() -> None:
    demo, tests = quickstart_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci.splitlines()
    assert "examples/demo.py" in demo
    # the demo installs what `monitored[all]` does, not the development group
    assert "--no-dev" in demo.split()
    assert "--extra all" in demo
    assert ".ci/wheels" in ci.splitlines()
