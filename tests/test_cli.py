"""The ``monitored`` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
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


INSTALL_HINT = (
    "Plugins are packages of their own, installed beside monitored: pip install "
    "monitored-checkpoint adds 'monitored checkpoint' (ls, show, diff, verify); in a clone of "
    "the monitored repository, 'uv run --all-packages monitored ...' installs every plugin of "
    "the workspace."
)


def _no_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("_plugins", "_commands"):
        monkeypatch.setattr(f"monitored._core.{module}.installed_entry_points", tuple)


def test_no_plugins(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _no_plugins(monkeypatch)
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("No monitored plugins are installed.\n")
    assert " ".join(out.split()[5:]) == INSTALL_HINT
    assert max(map(len, out.splitlines())) <= WIDTH
    with pytest.raises(SystemExit):
        main(["--help"])
    assert INSTALL_HINT in " ".join(capsys.readouterr().out.split())


def test_a_missing_plugin_command_says_which_package_adds_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``monitored checkpoint ls`` where monitored-checkpoint is not installed (a clone run
    without ``--all-packages``): not argparse's "invalid choice", but what to install."""
    _no_plugins(monkeypatch)
    assert main(["checkpoint", "ls", "runs"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert " ".join(captured.err.split()) == (
        "monitored: error: no installed plugin adds the command 'checkpoint': the package "
        f"monitored-checkpoint does. {INSTALL_HINT}"
    )
    # Another name is argparse's to refuse, with the choices.
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_a_disabled_plugins_command_says_it_is_disabled(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "checkpoint")
    assert main(["checkpoint", "ls", "runs"]) == 2
    assert " ".join(capsys.readouterr().err.split()) == (
        "monitored: error: the command 'checkpoint' comes with the plugin 'checkpoint', "
        "disabled by MONITORED_DISABLE_PLUGINS; remove it from there to use the command"
    )


def test_a_broken_plugin_is_reported_with_exit_status_1(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("broken", "raise ImportError('nope')\n")
    assert main(["plugins"]) == 1
    assert (
        "plugin 'broken' (distribution monitored-broken 1.0) failed to import"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize("as_json", [False, True])
def test_plugins_lists_the_others_and_a_plugin_that_fails_to_import_once(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    fake_plugin("broken", "raise ImportError('nope')\n")
    fake_plugin("good", "def before_run(): pass\n")
    assert main(["plugins", *(["--json"] if as_json else [])]) == 1
    captured = capsys.readouterr()
    if as_json:
        assert [row["name"] for row in json.loads(captured.out)] == ["good"]
    else:
        assert captured.out.splitlines()[1].startswith("good  ")
        assert "broken" not in captured.out
    err = " ".join(captured.err.split())
    assert err.startswith("monitored: error: plugin 'broken' (distribution monitored-broken 1.0)")
    assert err.count("failed to import") == 1
    assert "warning" not in err


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


# -- commands added by plugins (the register_commands hook) -----------------------------------------
GREET_PLUGIN = """
import argparse

def register_commands(commands):
    group = commands.add_parser("greet", help="say hello from a plugin")
    sub = group.add_subparsers(dest="what")
    hello = sub.add_parser("hello")
    hello.add_argument("--name", default="world")
    hello.add_argument("--status", type=int, default=0)
    hello.set_defaults(handler=_hello)
    later = sub.add_parser("later")
    later.set_defaults(handler=_later)

def _hello(args):
    print(f"hello {args.name}")
    return args.status

async def _later(args):
    import anyio
    await anyio.sleep(0)
    print("awaited")
"""


def test_a_plugin_adds_a_command_group_that_runs_with_its_arguments(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("greet", GREET_PLUGIN)
    assert main(["greet", "hello", "--name", "plugins"]) == 0
    assert capsys.readouterr().out == "hello plugins\n"
    assert main(["greet", "hello", "--status", "3"]) == 3  # the handler's exit status
    assert main(["greet", "later"]) == 0  # an async def handler is awaited
    assert capsys.readouterr().out == "hello world\nawaited\n"


def test_help_lists_plugin_commands_with_the_plugin_that_adds_them(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("greet", GREET_PLUGIN, version="2.5")
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "greet say hello from a plugin [plugin 'greet', monitored-greet 2.5]" in out
    assert "plugins list installed plugins" in out


def test_options_after_a_plugin_command_go_to_its_own_parser(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("greet", GREET_PLUGIN)
    with pytest.raises(SystemExit) as info:
        main(["greet", "hello", "--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: monitored greet hello [-h] [--name NAME]")
    with pytest.raises(SystemExit) as info:
        main(["greet", "hello", "--nmae", "x"])
    assert info.value.code == 2
    assert "unrecognized arguments: --nmae" in capsys.readouterr().err


def test_a_group_called_without_a_subcommand_prints_its_help_with_status_2(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("greet", GREET_PLUGIN)
    assert main(["greet"]) == 2
    assert capsys.readouterr().err.startswith("usage: monitored greet [-h] {hello,later}")


def test_a_plugin_that_fails_to_import_loses_its_commands_only(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("broken", "raise ImportError('nope')\n")
    fake_plugin("greet", GREET_PLUGIN)
    assert main(["greet", "hello"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "hello world\n"
    err = " ".join(captured.err.split())  # wrapped to 100 columns
    assert err.startswith("monitored: warning: plugin 'broken' (distribution")
    assert "failed to import 'fake_broken_plugin': ImportError: nope" in err
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "unavailable (these plugins' commands are left out):" in out
    assert "plugin 'broken' (distribution monitored-broken 1.0) failed to import" in out


def test_running_a_command_imports_no_plugin_after_the_one_that_adds_it(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("greet", GREET_PLUGIN)
    fake_plugin("later", "raise ImportError('imported after greet')\n")
    assert main(["greet", "hello"]) == 0
    assert capsys.readouterr().err == ""
    assert "fake_later_plugin" not in sys.modules
    # The full list (help, an unknown command) imports every plugin.
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "imported after greet" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["nothing"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "imported after greet" in err
    assert "invalid choice: 'nothing'" in err


def test_a_plugin_that_raises_while_registering_loses_what_it_added(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin(
        "halfway",
        "def register_commands(commands):\n"
        "    commands.add_parser('half', help='never complete')\n"
        "    raise RuntimeError('lost my way')\n",
    )
    fake_plugin("greet", GREET_PLUGIN)
    with pytest.raises(SystemExit) as info:
        main(["half"])
    assert info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "monitored: warning: plugin 'halfway' (distribution monitored-halfway 1.0): hook "
        "'register_commands' raised RuntimeError: lost my way (at " in err
    )
    assert "fake_halfway_plugin.py:3); its commands are left out" in err
    assert "invalid choice: 'half'" in err
    assert main(["greet", "hello"]) == 0


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        (
            "def register_commands(commands):\n    commands.add_parser('plugins', help='x')\n",
            "command 'plugins' is already added by monitored itself",
        ),
        (
            "def register_commands(commands):\n    commands.add_parser('Bad Name', help='x')\n",
            "command name 'Bad Name' is not lowercase letters, digits and dashes",
        ),
        (
            "def register_commands(commands):\n    commands.add_parser('quiet', help=' ')\n",
            "command 'quiet' has no help line (add_parser('quiet', help='...'))",
        ),
        (
            "def register_commands(commands):\n"
            "    commands.add_parser('twice', help='x')\n"
            "    commands.add_parser('twice', help='x')\n",
            "command 'twice' is already added by plugin 'odd' (distribution monitored-odd 1.0)",
        ),
        (
            "async def register_commands(commands):\n    commands.add_parser('late', help='x')\n",
            "hook 'register_commands' returned an awaitable; it is called synchronously",
        ),
    ],
    ids=["core-name", "bad-name", "no-help", "twice", "async"],
)
def test_a_refused_command_names_the_plugin_and_why(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str], source: str, problem: str
) -> None:
    fake_plugin("odd", source)
    assert main(["plugins", "--json"]) == 0  # the core's own command still works
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("monitored: warning: plugin 'odd' (distribution monitored-odd 1.0)")
    assert problem in err


def test_two_plugins_cannot_add_the_same_command(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("greet", GREET_PLUGIN)
    fake_plugin("zz-greet", GREET_PLUGIN.replace("say hello", "say it again"))
    with pytest.raises(SystemExit):
        main(["--help"])
    captured = capsys.readouterr()
    assert "say hello from a plugin [plugin 'greet'" in " ".join(captured.out.split())
    err = " ".join(captured.err.split())
    assert (
        "plugin 'zz-greet' (distribution monitored-zz-greet 1.0), hook 'register_commands': " in err
    )
    assert (
        "command 'greet' is already added by plugin 'greet' (distribution monitored-greet 1.0)"
        in err
    )


def test_two_distributions_of_one_plugin_name_give_an_error_and_the_first_commands(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("greet", GREET_PLUGIN, dist="monitored-greet")
    fake_plugin("greet", GREET_PLUGIN, dist="other-greet")
    with pytest.raises(SystemExit):
        main(["--help"])
    captured = capsys.readouterr()
    assert "[plugin 'greet', monitored-greet 1.0]" in " ".join(captured.out.split())
    assert " ".join(captured.err.split()) == (
        "monitored: warning: two installed distributions register a monitored plugin named "
        "'greet': monitored-greet and other-greet; uninstall one of them"
    )


def test_a_disabled_plugin_adds_no_command_and_is_not_imported(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_plugin("greet", GREET_PLUGIN)
    fake_plugin("broken", "raise ImportError('must not be imported')\n")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "greet,broken")
    with pytest.raises(SystemExit) as info:
        main(["greet", "hello"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'greet'" in err
    assert "must not be imported" not in err


def test_a_plugin_without_register_commands_adds_nothing(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_plugin("progress", "def before_run(): pass\n")
    with pytest.raises(SystemExit):
        main(["--help"])
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "unavailable" not in captured.out


def test_register_commands_is_never_called_by_a_session(fake_plugin: Any) -> None:
    import anyio
    import numpy as np

    import monitored

    fake_plugin(
        "greet",
        "def register_commands(commands):\n    raise AssertionError('called in a session')\n"
        "def before_run(): pass\n",
    )

    def step(state: monitored.TrainState) -> None:
        state.global_step += 1

    async def train() -> int:
        state = monitored.TrainState({"w": np.zeros(1)}, seed=0)
        async with monitored.MonitoredSession(
            state, hooks=[monitored.StopAtStepHook(last_step=2)]
        ) as sess:
            while not sess.should_stop():
                await sess.run(step)
        return state.global_step

    assert anyio.run(train) == 2


def test_the_monitored_script_lists_and_runs_an_installed_plugins_commands() -> None:
    # The real console script, with the plugins of this repository installed.
    script = Path(sys.executable).with_name("monitored")
    done = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    assert done.stderr == ""
    help_text = " ".join(done.stdout.split())
    assert (
        "checkpoint look inside checkpoints: ls, show, diff, verify [plugin 'checkpoint', monitored-checkpoint "
        in help_text
    )
    done = subprocess.run(
        [str(script), "checkpoint", "--help"], capture_output=True, text=True, check=True
    )
    assert done.stdout.startswith("usage: monitored checkpoint [-h] COMMAND ...")


@pytest.mark.parametrize("argv", [["plugins", "--json"], ["plugins"]])
def test_a_reader_that_goes_away_ends_the_command_quietly(argv: list[str]) -> None:
    """``monitored plugins --json | head -1``: no BrokenPipeError traceback, status 1.

    The pipe's read end is closed before the command writes (as ``head`` closes it
    after its first line), so every write fails, whatever the pipe's buffer size.
    """
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "monitored", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == 1


def test_a_reader_of_the_first_line_only_gets_it_and_no_traceback() -> None:
    # A real ``monitored plugins --json | head -1`` pipeline.
    command = subprocess.Popen(
        [sys.executable, "-m", "monitored", "plugins", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert command.stdout is not None
    assert command.stderr is not None
    head = subprocess.run(
        ["head", "-1"], stdin=command.stdout, capture_output=True, text=True, check=True
    )
    command.stdout.close()
    assert command.wait(timeout=60) in {0, 1}  # 0 when all of it fit in the pipe's buffer
    assert command.stderr.read() == b""
    command.stderr.close()
    assert head.stdout == "[\n"


def test_a_mistyped_command_gets_a_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["plugnis"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith("did you mean 'plugins'?")


def test_a_command_unlike_any_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["zzzzzz"])
    assert "did you mean" not in capsys.readouterr().err


def test_plugins_prints_metadata_and_errors_escaped(
    fake_plugin: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 34 §2: what ``monitored plugins`` prints comes from installed packages'
    metadata on disk, and from their import errors: escaped, each on its own lines."""
    from _hostile import ESCAPED_TITLE

    title = "\x1b]0;pwned\x07\x1b]52;c;cm0g\x07\x9b"
    fake_plugin("evil", "def before_run(): pass\n", version="1.0" + title)
    forged = title + "\nList one: rm -rf ~"
    fake_plugin("broken", f"raise ImportError({forged!r})\n")
    assert main(["plugins"]) == 1
    captured = capsys.readouterr()
    for text in (captured.out, captured.err):
        bad = sorted({char for char in text if not char.isprintable() and char != "\n"})
        assert not bad, f"{bad!r} reached the output: {text!r}"
    assert ESCAPED_TITLE in captured.out
    assert ESCAPED_TITLE in captured.err
    assert not [line for line in captured.err.splitlines() if line.startswith("List one")]
