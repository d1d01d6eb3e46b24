"""The ``monitored`` command."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from monitored._cli import WIDTH, main


def test_plugins_lists_name_distribution_version_and_provides(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin(
        "progress",
        "provides = {'progress'}\nchief_only = True\ntraining_only = True\n"
        "def before_run(): pass\ndef end(): pass\n",
        version="0.3",
    )
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["plugin", "distribution", "version", "provides", "notes"]
    assert out[1].split() == [
        "progress",
        "monitored-progress",
        "0.3",
        "progress",
        "chief",
        "only,",
        "training",
        "only",
    ]
    assert out[-1] == "Hooks each plugin implements: monitored plugins --verbose"


def test_plugins_verbose_lists_the_hooks_under_each_plugin(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("progress", "def before_run(): pass\ndef end(): pass\n")
    assert main(["plugins", "--verbose"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["progress", "monitored-progress", "1.0", "-"]
    assert out[2] == "  hooks: before_run, end"


def test_monitored_plugins_table_fits_100_columns(capsys: pytest.CaptureFixture[str]) -> None:
    # The plugins of this repository, as installed in the test environment.
    for argv in (["plugins"], ["plugins", "--verbose"]):
        assert main(argv) == 0
        lines = capsys.readouterr().out.splitlines()
        assert any(line.startswith("checkpoint ") for line in lines)
        assert max(len(line) for line in lines) <= WIDTH == 100, argv
    assert main(["plugins", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "  hooks: " in out
    assert "restore_checkpoint" in out  # a long list, wrapped rather than cut


def test_python_dash_m_monitored_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "monitored", "plugins", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    names = {row["name"]: row for row in json.loads(done.stdout)}
    assert names["checkpoint"]["provides"] == ["checkpoint"]
    assert names["mpi"]["provides"] == ["cluster"]
    help_text = subprocess.run(
        [sys.executable, "-m", "monitored", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert help_text.startswith("usage: monitored ")


def test_plugins_json(fake_plugin: Any, capsys: pytest.CaptureFixture[str]) -> None:
    fake_plugin("progress", "def before_run(): pass\n")
    assert main(["plugins", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {
            "name": "progress",
            "distribution": "monitored-progress",
            "version": "1.0",
            "provides": [],
            "hooks": ["before_run"],
            "options": [],
            "chief_only": False,
            "training_only": False,
            "disabled": False,
        }
    ]


OPTIONS_PLUGIN = """
import monitored

def declare_options():
    return [
        monitored.Option("every_n_steps", 100, "refresh every this many steps"),
        monitored.Option("show", ["loss"]),
    ]
"""


def test_plugins_lists_each_plugins_options_with_defaults(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("progress", OPTIONS_PLUGIN)
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "  progress.every_n_steps = 100 (int): refresh every this many steps\n" in out
    assert "  progress.show = ['loss'] (list)\n" in out
    assert "MONITORED_PLUGIN_OPTIONS" in out
    assert main(["plugins", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["hooks"] == ["declare_options"]
    assert row["options"] == [
        {
            "name": "every_n_steps",
            "default": 100,
            "type": "int",
            "help": "refresh every this many steps",
        },
        {"name": "show", "default": ["loss"], "type": "list", "help": ""},
    ]


def test_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out
    assert "List the installed monitored plugins" in out


def test_plugins_lists_even_when_autoload_is_off(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_plugin("progress", "def before_run(): pass\n")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert main(["plugins", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 1


def test_no_plugins(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("monitored._cli.installed_plugins", lambda autoload: [])
    assert main(["plugins"]) == 0
    assert capsys.readouterr().out == "No monitored plugins are installed.\n"


def test_a_broken_plugin_is_reported_with_exit_status_1(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("broken", "raise ImportError('nope')\n")
    assert main(["plugins"]) == 1
    assert (
        "plugin 'broken' (distribution monitored-broken 1.0) failed to import"
        in capsys.readouterr().err
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("monitored ")


def test_plugins_shows_disabled_plugins_without_importing_them(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_plugin("broken", "raise ImportError('must not be imported')\n")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "broken")
    assert main(["plugins"]) == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert row.split()[0] == "broken"
    assert row.endswith("disabled by MONITORED_DISABLE_PLUGINS")
