"""Options of installed plugins: declared, set by argument or environment, validated."""

from __future__ import annotations

import importlib
import logging
from typing import Any

import pytest
from _helpers import counting_step

import monitored
from monitored import Option, PluginOptionError, TrainState
from monitored._core._options import options_from_env, resolve_options

PROGRESS = """
import monitored

SEEN = []

def declare_options():
    return [
        monitored.Option("every_n_steps", 100, "refresh every this many steps"),
        monitored.Option("show", ["loss"], "outputs to show"),
        monitored.Option("colour", True),
        monitored.Option("min_interval", 0.5),
        monitored.Option("title", None, type=str),
        monitored.Option("labels", None, type=dict),
    ]

def after_create_session(session):
    SEEN.append(dict(session.options_for("progress")))

def training_hooks(config):
    SEEN.append(dict(config.plugin_options["progress"]))
"""

DEFAULTS = {
    "every_n_steps": 100,
    "show": ["loss"],
    "colour": True,
    "min_interval": 0.5,
    "title": None,
    "labels": None,
}


@pytest.fixture
def progress(fake_plugin: Any, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    monkeypatch.delenv("MONITORED_PLUGIN_OPTIONS", raising=False)
    module = fake_plugin("progress", PROGRESS, dist="monitored-progress")
    seen: list[dict[str, Any]] = importlib.import_module(module).SEEN
    return seen


async def test_a_plugin_sees_its_defaults(progress: list, state: TrainState) -> None:
    async with monitored.MonitoredSession(state):
        pass
    assert progress == [DEFAULTS]


async def test_the_argument_sets_options(progress: list, state: TrainState) -> None:
    options = {"progress": {"every_n_steps": 10, "show": ("loss", "acc"), "min_interval": 1}}
    async with monitored.MonitoredSession(state, plugin_options=options):
        pass
    assert progress == [
        {**DEFAULTS, "every_n_steps": 10, "show": ["loss", "acc"], "min_interval": 1.0}
    ]


async def test_training_hooks_read_them_from_the_config(progress: list, state: TrainState) -> None:
    async with monitored.MonitoredTrainingSession(
        state, plugin_options={"progress": {"colour": False}}
    ) as sess:
        assert sess.training_config is not None
        assert sess.training_config.plugin_options["progress"]["colour"] is False
    assert progress == [{**DEFAULTS, "colour": False}] * 2


async def test_the_environment_sets_options_and_the_argument_wins(
    progress: list, state: TrainState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "MONITORED_PLUGIN_OPTIONS",
        "progress.every_n_steps=7; progress.show=loss, acc ;progress.colour=off;"
        "progress.min_interval=2.5;progress.title=run 1;"
        'progress.labels={"lr": 0.1, "tags": ["a", "b"]}',
    )
    async with monitored.MonitoredSession(state, plugin_options={"progress": {"every_n_steps": 3}}):
        pass
    assert progress == [
        {
            "every_n_steps": 3,
            "show": ["loss", "acc"],
            "colour": False,
            "min_interval": 2.5,
            "title": "run 1",
            "labels": {"lr": 0.1, "tags": ["a", "b"]},
        }
    ]


async def test_a_dict_option_takes_a_mapping_with_string_keys(
    progress: list, state: TrainState
) -> None:
    labels = {"lr": 0.1, "layers": 3}
    async with monitored.MonitoredSession(state, plugin_options={"progress": {"labels": labels}}):
        pass
    assert progress == [{**DEFAULTS, "labels": labels}]
    assert progress[0]["labels"] is not labels, "the plugin gets its own copy"


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            {"progres": {"show": []}},
            r"plugin 'progres', which is not installed; installed plugins: \['progress'\] "
            r"\(did you mean 'progress'\?\)",
        ),
        (
            {"progress": {"every_n_step": 1}},
            r"no option 'every_n_step'.*did you mean 'every_n_steps'\?",
        ),
        (
            {"progress": {"every_n_steps": "10"}},
            r"option progress.every_n_steps: expected an int, got '10'",
        ),
        (
            {"progress": {"every_n_steps": True}},
            r"progress.every_n_steps: expected an int, got True",
        ),
        ({"progress": {"colour": 1}}, r"progress.colour: expected a bool"),
        ({"progress": {"show": "loss"}}, r"progress.show: expected a list of strings, got 'loss'"),
        ({"progress": {"show": [1]}}, r"progress.show: expected a list of strings"),
        ({"progress": ["show"]}, r"plugin_options\['progress'\] must be a mapping"),
        (
            {"progress": {"labels": [("lr", 0.1)]}},
            r"progress.labels: expected a mapping with string keys",
        ),
        ({"progress": {"labels": {1: "x"}}}, r"progress.labels: expected a mapping with string"),
    ],
)
async def test_bad_options_are_refused_before_the_session_starts(
    progress: list, state: TrainState, options: Any, match: str
) -> None:
    with pytest.raises(PluginOptionError, match=match) as info:
        async with monitored.MonitoredSession(state, plugin_options=options):
            pass
    assert progress == []
    assert info.value.plugin in {"progres", "progress"}


@pytest.mark.parametrize(
    ("env", "match"),
    [
        (
            "progress.every_n_steps=ten",
            r"MONITORED_PLUGIN_OPTIONS: option progress.every_n_steps: expected an int, got 'ten'",
        ),
        ("progress.colour=maybe", r"progress.colour: expected a bool \(true/false\), got 'maybe'"),
        ("progress.min_interval=fast", r"expected a number"),
        ("progress.nope=1", r"MONITORED_PLUGIN_OPTIONS: plugin 'progress' has no option 'nope'"),
        (
            "every_n_steps=1",
            r"'every_n_steps=1' is not of the form plugin.option=value "
            r"\(for example nan_guard.lag=0\)",
        ),
        ("progress.show", r"is not of the form plugin.option=value"),
        (
            "progress.labels={lr: 0.1}",
            r"progress.labels: expected .*a JSON object\), got '\{lr: 0.1\}' \(Expecting",
        ),
        ("progress.labels=[1, 2]", r"progress.labels: expected .*a JSON object\), got '\[1, 2\]'"),
    ],
)
async def test_bad_options_in_the_environment_are_refused(
    progress: list, state: TrainState, monkeypatch: pytest.MonkeyPatch, env: str, match: str
) -> None:
    monkeypatch.setenv("MONITORED_PLUGIN_OPTIONS", env)
    with pytest.raises(PluginOptionError, match=match):
        async with monitored.MonitoredSession(state):
            pass


@pytest.mark.parametrize(
    ("env", "match"),
    [
        (
            "progress.labels=" + '{"a": ' * 100_000 + "1" + "}" * 100_000,
            r"MONITORED_PLUGIN_OPTIONS: option progress.labels: the value is 700001 characters "
            r"long, more than the 65536",
        ),
        (
            "progress.labels=" + '{"a": ' * 5000 + "1" + "}" * 5000,
            r"MONITORED_PLUGIN_OPTIONS: option progress.labels: the JSON value is nested deeper "
            r"than the 32 levels",
        ),
        (
            'progress.labels={"a": ' + "[" * 33 + "]" * 33 + "}",
            r"option progress.labels: the JSON value is nested deeper than the 32 levels",
        ),
        (
            'progress.labels={"a": [' + ",".join(["1"] * 10_001) + "]}",
            r"option progress.labels: the value holds more than the 10000 items",
        ),
        ("progress.show=" + ",".join(["x"] * 10_001), r"progress.show: the value holds more"),
    ],
    ids=["too-long", "deep-json", "33-levels", "too-many-items", "long-list"],
)
async def test_deeply_nested_or_huge_option_values_are_a_plugin_option_error(
    progress: list, state: TrainState, monkeypatch: pytest.MonkeyPatch, env: str, match: str
) -> None:
    monkeypatch.setenv("MONITORED_PLUGIN_OPTIONS", env)
    with pytest.raises(PluginOptionError, match=match) as info:
        async with monitored.MonitoredSession(state):
            pass
    assert info.value.plugin == "progress"
    assert progress == []


async def test_option_values_at_the_bounds_are_taken(
    progress: list, state: TrainState, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = '{"a": ' + "[" * 31 + '"]}[{"' + "]" * 31 + "}"  # brackets in a string do not count
    monkeypatch.setenv("MONITORED_PLUGIN_OPTIONS", f"progress.labels={deep}")
    async with monitored.MonitoredSession(state):
        pass
    value = progress[0]["labels"]["a"]
    for _ in range(30):
        value = value[0]
    assert value == ["]}[{"]


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        (_nested(33), r"plugin_options: option progress.labels: the value is nested deeper"),
        ({"x": list(range(10_000))}, r"progress.labels: the value holds more than the 10000"),
    ],
    ids=["33-levels", "too-many-items"],
)
async def test_deep_or_huge_values_of_the_argument_are_refused(
    progress: list, state: TrainState, labels: dict[str, Any], match: str
) -> None:
    with pytest.raises(PluginOptionError, match=match):
        async with monitored.MonitoredSession(
            state, plugin_options={"progress": {"labels": labels}}
        ):
            pass
    async with monitored.MonitoredSession(
        state, plugin_options={"progress": {"labels": _nested(32)}}
    ):
        pass
    assert progress == [{**DEFAULTS, "labels": _nested(32)}]


async def test_a_value_that_contains_itself_is_refused(progress: list, state: TrainState) -> None:
    labels: dict[str, Any] = {}
    labels["self"] = labels
    with pytest.raises(PluginOptionError, match="nested deeper than the 32 levels"):
        async with monitored.MonitoredSession(
            state, plugin_options={"progress": {"labels": labels}}
        ):
            pass


async def test_unknown_plugins_in_the_environment_are_ignored_with_a_warning(
    progress: list,
    state: TrainState,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("MONITORED_PLUGIN_OPTIONS", "summaries.flush_secs=10")
    async with monitored.MonitoredSession(state):
        pass
    assert progress == [DEFAULTS]
    assert [r.getMessage() for r in caplog.records if "MONITORED_PLUGIN_OPTIONS" in r.message] == [
        "MONITORED_PLUGIN_OPTIONS names 'summaries', which is not installed; it is ignored"
    ]


async def test_a_misspelled_plugin_in_the_options_variable_is_warned_once_with_did_you_mean(
    progress: list,
    state: TrainState,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv(
        "MONITORED_PLUGIN_OPTIONS", "progres.every_n_steps=3;progres.colour=false;elsewhere.x=1"
    )
    for _ in range(2):
        async with monitored.MonitoredSession(TrainState()):
            pass
    assert progress == [DEFAULTS, DEFAULTS], "ignored: the variable may be shared"
    warned = [r for r in caplog.records if "MONITORED_PLUGIN_OPTIONS" in r.message]
    assert [r.getMessage() for r in warned] == [
        "MONITORED_PLUGIN_OPTIONS names 'elsewhere', which is not installed; it is ignored",
        "MONITORED_PLUGIN_OPTIONS names 'progres', which is not installed "
        "(did you mean 'progress'?); it is ignored",
    ]
    assert {r.levelno for r in warned} == {logging.WARNING}


async def test_options_of_a_disabled_plugin_are_ignored(progress: list, state: TrainState) -> None:
    async with monitored.MonitoredSession(
        state, disable_plugins=["progress"], plugin_options={"progress": {"every_n_steps": 1}}
    ):
        pass
    assert progress == []


async def test_options_for_a_plugin_that_declares_none_are_an_error(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin("quiet", "def end():\n    pass\n")
    with pytest.raises(PluginOptionError, match=r"plugin 'quiet', which declares no options"):
        async with monitored.MonitoredSession(state, plugin_options={"quiet": {"x": 1}}):
            pass


async def test_options_for_an_unknown_plugin(progress: list, state: TrainState) -> None:
    async with monitored.MonitoredSession(state) as sess:
        with pytest.raises(
            monitored.PluginError, match=r"'nope' declares no options.*\['progress'\]"
        ):
            sess.options_for("nope")
        await sess.run(counting_step)


async def test_a_plugin_declaring_something_else_is_named(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin("odd", "def declare_options():\n    return [('x', 1)]\n")
    with pytest.raises(
        PluginOptionError, match=r"plugin 'odd': declare_options must return monitored.Option"
    ):
        async with monitored.MonitoredSession(state):
            pass


async def test_an_option_declared_twice_is_an_error(fake_plugin: Any, state: TrainState) -> None:
    fake_plugin(
        "twice",
        "import monitored\ndef declare_options():\n"
        "    return [monitored.Option('x', 1), monitored.Option('x', 2)]\n",
    )
    with pytest.raises(PluginOptionError, match=r"plugin 'twice' declares option 'x' twice"):
        async with monitored.MonitoredSession(state):
            pass


def test_option_needs_a_type_it_can_check() -> None:
    with pytest.raises(ValueError, match="give type= when the default is None"):
        Option("title")
    with pytest.raises(ValueError, match="must be an identifier"):
        Option("every n", 1)
    assert Option("show", ("a",)).value_type is list


def test_options_from_env_parses_entries() -> None:
    assert options_from_env({"MONITORED_PLUGIN_OPTIONS": "a.x=1;;b.y= 2 ; a.z="}) == {
        "a": {"x": "1", "z": ""},
        "b": {"y": " 2 "},
    }


def test_plugin_options_must_be_a_mapping() -> None:
    with pytest.raises(PluginOptionError, match="must map plugin names"):
        resolve_options({}, ["progress"], environ={})  # type: ignore[arg-type]


def test_options_joined_by_a_comma_in_the_environment_say_that_a_semicolon_separates() -> None:
    env = {"MONITORED_PLUGIN_OPTIONS": "early_stopping.monitor=loss,early_stopping.patience=2"}
    with pytest.raises(PluginOptionError) as caught:
        options_from_env(env)
    assert "options are separated by ';'" in str(caught.value)
    assert "'early_stopping.monitor=loss;early_stopping.patience=2'" in str(caught.value)
    # a list value's commas are no second option
    env = {"MONITORED_PLUGIN_OPTIONS": "progress.show=loss,accuracy;nan_guard.lag=0"}
    assert options_from_env(env) == {
        "progress": {"show": "loss,accuracy"},
        "nan_guard": {"lag": "0"},
    }


def test_values_of_the_environment_are_named_escaped(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 34 §2: MONITORED_PLUGIN_OPTIONS may hold anything: its values, option
    names and plugin names are named escaped (``repr``), each message on one line."""
    from _hostile import HOSTILE, assert_safe_line

    declared = {"progress": [Option("every_n_steps", 10)]}
    hostile = HOSTILE.replace("\0", "").replace(";", "")
    for env in (
        f"progress.every_n_steps={hostile}",  # a value of the wrong type
        f"progress.{hostile}=1",  # an option the plugin does not declare
        f"{hostile}",  # not plugin.option=value
    ):
        with pytest.raises(PluginOptionError) as info:
            resolve_options(
                declared, {}, loaded=["progress"], environ={"MONITORED_PLUGIN_OPTIONS": env}
            )
        assert_safe_line(str(info.value), shown="\\x1b]52c")
    with caplog.at_level(logging.WARNING, logger="monitored"):  # a plugin not installed
        resolve_options(
            declared,
            {},
            loaded=["progress"],
            installed=["progress"],
            environ={"MONITORED_PLUGIN_OPTIONS": f"{hostile.translate({46: None, 61: None})}.x=1"},
        )
    (warning,) = caplog.records
    assert_safe_line(warning.getMessage(), shown="\\x1b]52c")
