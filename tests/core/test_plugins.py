"""Plugin discovery, validation, ordering and disabling."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _helpers import Recorder, counting_step

import monitored
from monitored import TrainState

RECORDING_PLUGIN = """
EVENTS = []

def begin(session):
    EVENTS.append("begin")

def before_run(run_context):
    EVENTS.append("before_run")

async def after_run(run_context, run_values):
    EVENTS.append("after_run")

def end():
    EVENTS.append("end")
"""


def _events(module: str) -> list[str]:
    import importlib

    return importlib.import_module(module).EVENTS  # type: ignore[no-any-return]


async def test_installed_plugin_module_is_loaded_and_called(
    fake_plugin: Any, state: TrainState
) -> None:
    module = fake_plugin("recording", RECORDING_PLUGIN)
    async with monitored.MonitoredSession(state) as sess:
        await sess.run(counting_step)
        [info] = sess.plugins
    assert _events(module) == ["begin", "before_run", "after_run", "end"]
    assert info.name == "recording"
    assert info.distribution == "monitored-recording"
    assert info.version == "1.0"
    assert info.source == "entry point"


async def test_installed_plugins_run_after_the_session_hooks_sorted_by_name(
    fake_plugin: Any, state: TrainState
) -> None:
    log: list[tuple[str, str]] = []
    for name in ["zeta", "alpha"]:
        fake_plugin(
            name,
            f"""
            import _helpers
            LOG = None
            def before_run(run_context):
                run_context.session.test_log.append(({name!r}, "before_run"))
            """,
        )
    hook = Recorder("hook", log)
    sess = monitored.MonitoredSession(state, hooks=[hook])
    sess.test_log = log  # type: ignore[attr-defined]
    async with sess:
        await sess.run(counting_step)
    assert [who for who, event in log if event == "before_run"] == ["hook", "alpha", "zeta"]


async def test_tryfirst_and_trylast_move_implementations(
    fake_plugin: Any, state: TrainState
) -> None:
    order: list[str] = []

    class Last:
        @monitored.hookimpl(trylast=True)
        def before_run(self) -> None:
            order.append("last")

    class First:
        @monitored.hookimpl(tryfirst=True)
        def before_run(self) -> None:
            order.append("first")

    class Plain:
        def before_run(self) -> None:
            order.append("plain")

    async with monitored.MonitoredSession(state, hooks=[Last(), Plain(), First()]) as sess:
        await sess.run(counting_step)
    assert order == ["first", "plain", "last"]


async def test_a_plugin_object_entry_point_is_registered(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin(
        "obj",
        """
        class _Counter:
            calls = 0
            def after_run(self):
                type(self).calls += 1
        counter = _Counter()
        """,
        value="fake_obj_plugin:counter",
    )
    async with monitored.MonitoredSession(state) as sess:
        await sess.run(counting_step)
        assert type(sess.plugins[0].plugin).calls == 1  # type: ignore[attr-defined]


async def test_disable_by_argument_and_environment(
    fake_plugin: Any, state: TrainState, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_plugin("one", "def before_run(): pass")
    fake_plugin("two", "def before_run(): pass")
    async with monitored.MonitoredSession(state, disable_plugins=["one"]) as sess:
        assert [p.name for p in sess.plugins] == ["two"]
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "two, one")
    async with monitored.MonitoredSession(TrainState()) as sess:
        assert sess.plugins == ()


async def test_a_typo_in_the_disable_variable_is_logged_once_and_ignored(
    fake_plugin: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake_plugin("checkpoint", "def before_run(): pass")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGINS", "chekpoint,elsewhere")
    for _ in range(2):
        async with monitored.MonitoredSession(TrainState()) as sess:
            assert [p.name for p in sess.plugins] == ["checkpoint"]
    warned = [r.getMessage() for r in caplog.records if "MONITORED_DISABLE_PLUGINS" in r.message]
    assert warned == [
        "MONITORED_DISABLE_PLUGINS names 'chekpoint', which is not installed "
        "(did you mean 'checkpoint'?); it is ignored",
        "MONITORED_DISABLE_PLUGINS names 'elsewhere', which is not installed; it is ignored",
    ]


async def test_autoload_can_be_switched_off(
    fake_plugin: Any, state: TrainState, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_plugin("one", "def before_run(): pass")
    monkeypatch.setenv("MONITORED_DISABLE_PLUGIN_AUTOLOAD", "1")
    async with monitored.MonitoredSession(state) as sess:
        assert sess.plugins == ()


async def test_disabling_an_unknown_plugin_is_an_error(fake_plugin: Any, state: TrainState) -> None:
    fake_plugin("one", "def before_run(): pass")
    with pytest.raises(monitored.PluginError, match=r"disable_plugins names \['tpyo'\].*\['one'\]"):
        async with monitored.MonitoredSession(state, disable_plugins=["tpyo"]):
            pass


async def test_did_you_mean_for_a_misspelled_disable_plugins_name(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin("nan_guard", "def before_run(): pass")
    fake_plugin("progress", "def before_run(): pass")
    with pytest.raises(monitored.PluginError) as info:
        async with monitored.MonitoredSession(state, disable_plugins=["nan_gaurd", "elsewhere"]):
            pass
    assert str(info.value) == (
        "disable_plugins names ['elsewhere', 'nan_gaurd'], which are not installed "
        "(did you mean 'nan_guard' for 'nan_gaurd'?); installed plugins: "
        "['nan_guard', 'progress']"
    )


async def test_a_plugin_that_fails_to_import_names_plugin_and_distribution(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin("broken", "import does_not_exist_anywhere", dist="monitored-broken", version="2.1")
    with pytest.raises(monitored.PluginLoadError) as info:
        async with monitored.MonitoredSession(state):
            pytest.fail("must fail at session start")
    message = str(info.value)
    assert "plugin 'broken' (distribution monitored-broken 2.1) failed to import" in message
    assert "ModuleNotFoundError" in message
    assert "set MONITORED_DISABLE_PLUGINS=broken" in message
    assert info.value.plugin == "broken"
    assert info.value.distribution == "monitored-broken"


RAISING_GETATTR_MODULE = """
def __getattr__(name):
    raise RuntimeError(f"no lookups here ({name})")

def end():
    pass
"""

RAISING_GETATTR_OBJECT = """
class Plugin:
    def __getattr__(self, name):
        raise RuntimeError(f"no lookups here ({name})")

    def end(self):
        pass

plugin = Plugin()
"""


@pytest.mark.parametrize(
    ("source", "value"),
    [(RAISING_GETATTR_MODULE, None), (RAISING_GETATTR_OBJECT, "fake_lookup_plugin:plugin")],
    ids=["module", "object"],
)
async def test_a_plugin_whose_attribute_lookup_raises_is_named_with_its_distribution(
    fake_plugin: Any, state: TrainState, source: str, value: str | None
) -> None:
    fake_plugin("lookup", source, dist="monitored-lookup", version="0.3", value=value)
    with pytest.raises(monitored.PluginLoadError) as info:
        async with monitored.MonitoredSession(state):
            pytest.fail("must fail at session start")
    message = str(info.value)
    assert "plugin 'lookup' (distribution monitored-lookup 0.3)" in message
    assert "looking up its attribute 'cluster' raised RuntimeError: no lookups here" in message
    assert "set MONITORED_DISABLE_PLUGINS=lookup" in message
    assert "pip uninstall monitored-lookup" in message
    assert (info.value.plugin, info.value.distribution) == ("lookup", "monitored-lookup")
    assert isinstance(info.value.__cause__, RuntimeError)
    async with monitored.MonitoredSession(state, disable_plugins=["lookup"]) as sess:
        assert sess.plugins == ()


async def test_a_disabled_broken_plugin_is_not_imported(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin("broken", "raise RuntimeError('imported')")
    async with monitored.MonitoredSession(state, disable_plugins=["broken"]) as sess:
        assert sess.plugins == ()


async def test_an_entry_point_naming_a_class_is_an_error(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin("cls", "class Hook:\n    def end(self): pass\n", value="fake_cls_plugin:Hook")
    with pytest.raises(monitored.PluginLoadError, match="names a class"):
        async with monitored.MonitoredSession(state):
            pass


async def test_a_hook_with_a_wrong_signature_names_plugin_distribution_and_hook(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin("sig", "def after_run(run_context, results):\n    pass\n", dist="monitored-sig")
    with pytest.raises(monitored.PluginValidationError) as info:
        async with monitored.MonitoredSession(state):
            pass
    message = str(info.value)
    assert "plugin 'sig' (distribution monitored-sig 1.0)" in message
    assert "'after_run'" in message
    assert "results" in message
    assert "(run_context, run_values)" in message
    assert info.value.hook == "after_run"


async def test_a_marked_unknown_hook_name_is_an_error(fake_plugin: Any, state: TrainState) -> None:
    fake_plugin(
        "typo",
        "import monitored\n@monitored.hookimpl\ndef befor_run(run_context):\n    pass\n",
    )
    with pytest.raises(monitored.PluginValidationError, match=r"no hook named 'befor_run'") as info:
        async with monitored.MonitoredSession(state):
            pass
    assert info.value.plugin == "typo"


async def test_a_hook_object_taking_too_many_arguments_is_named(state: TrainState) -> None:
    class Hook:
        def before_run(self, context: Any, extra: Any) -> None:
            pass

    with pytest.raises(
        monitored.PluginValidationError,
        match=r"hook 'hooks\[0\]:Hook'.*'before_run'.*needs 2 arguments.*before_run\(run_context\)",
    ) as info:
        async with monitored.MonitoredSession(state, hooks=[Hook()]):
            pass
    assert info.value.hook == "before_run"


# -- TF1 hook classes: called positionally -------------------------------------------------------
class TF1StyleHook(monitored.SessionRunHook):
    """A hook as TF1 code writes it: TF1 passes arguments positionally, names are free."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def begin(self) -> None:
        self.calls.append(("begin", ()))

    def after_create_session(self, sess: Any, coordinator: Any) -> None:
        self.calls.append(("after_create_session", (sess, coordinator)))

    def before_run(self, rc: Any) -> Any:
        self.calls.append(("before_run", (rc,)))
        return monitored.SessionRunArgs("loss")

    def after_run(self, rc: Any, rv: Any) -> None:
        self.calls.append(("after_run", (rc, rv.results)))

    def end(self, sess: Any) -> None:
        self.calls.append(("end", (sess,)))


async def test_a_tf1_hook_class_works_unchanged(state: TrainState) -> None:
    hook = TF1StyleHook()
    async with monitored.MonitoredSession(state, hooks=[hook]) as sess:
        await sess.run(counting_step)
    assert [event for event, _ in hook.calls] == [
        "begin",
        "after_create_session",
        "before_run",
        "after_run",
        "end",
    ]
    assert hook.calls[1][1] == (sess, sess.coord)
    assert isinstance(hook.calls[2][1][0], monitored.SessionRunContext)
    assert hook.calls[3][1][1] == 3.0
    assert hook.calls[4][1] == (sess,)


async def test_a_session_run_hook_subclass_is_called_positionally_whatever_its_names(
    state: TrainState,
) -> None:
    """TF1 semantics: a parameter named like another spec argument still gets the one in its place."""
    seen: list[Any] = []

    class Hook(monitored.SessionRunHook):
        def after_run(self, run_values: Any, run_context: Any) -> None:
            seen.append((run_values, run_context))

    async with monitored.MonitoredSession(state, hooks=[Hook()]) as sess:
        await sess.run(counting_step)
    [(first, second)] = seen
    assert isinstance(first, monitored.SessionRunContext)
    assert isinstance(second, monitored.SessionRunValues)
    assert first.session is sess


async def test_a_plain_object_with_tf1_arity_is_called_positionally(state: TrainState) -> None:
    seen: list[Any] = []

    class Hook:
        def after_create_session(self, s: Any, c: Any) -> None:
            seen.append((s, c))

        async def after_run(self, rc: Any, *rest: Any) -> None:
            seen.append((rc, *rest))

    async with monitored.MonitoredSession(state, hooks=[Hook()]) as sess:
        await sess.run(counting_step)
    assert seen[0] == (sess, sess.coord)
    assert isinstance(seen[1][0], monitored.SessionRunContext)
    assert isinstance(seen[1][1], monitored.SessionRunValues)


async def test_a_plain_object_naming_a_subset_of_the_spec_is_called_by_name(
    state: TrainState,
) -> None:
    seen: list[Any] = []

    class Hook:
        def after_run(self, run_values: Any) -> None:
            seen.append(run_values)

    async with monitored.MonitoredSession(state, hooks=[Hook()]) as sess:
        await sess.run(counting_step)
    assert isinstance(seen[0], monitored.SessionRunValues)


async def test_a_hook_class_is_read_again_when_its_methods_change(state: TrainState) -> None:
    """How a class's methods take their arguments is remembered until one is replaced."""
    seen: list[Any] = []

    class Hook:
        def after_run(self, rc: Any, rv: Any) -> None:
            seen.append(("two", rv.results))

    for _ in range(2):
        async with monitored.MonitoredSession(state, hooks=[Hook()]) as sess:
            await sess.run(counting_step)

    def one(self: Any, rc: Any) -> None:
        seen.append(("one", type(rc).__name__))

    Hook.after_run = one  # type: ignore[assignment]
    async with monitored.MonitoredSession(state, hooks=[Hook()]) as sess:
        await sess.run(counting_step)
    assert seen == [("two", None), ("two", None), ("one", "SessionRunContext")]

    def three(self: Any, a: Any, b: Any, c: Any) -> None:
        pass

    Hook.after_run = three  # type: ignore[assignment]
    with pytest.raises(monitored.PluginValidationError, match=r"'after_run'.*needs 3 arguments"):
        async with monitored.MonitoredSession(state, hooks=[Hook()]):
            pass


async def test_positional_hooks_keep_tryfirst(state: TrainState, log: list) -> None:
    class First:
        @monitored.hookimpl(tryfirst=True)
        def after_run(self, rc: Any, rv: Any) -> None:
            log.append(("first", "after_run"))

    async with monitored.MonitoredSession(state, hooks=[Recorder("a", log), First()]) as sess:
        log.clear()
        await sess.run(counting_step)
        assert log == [("a", "before_run"), ("first", "after_run"), ("a", "after_run")]


async def test_a_module_plugin_is_still_called_by_name(fake_plugin: Any, state: TrainState) -> None:
    module = fake_plugin(
        "named", "SEEN = []\ndef after_run(run_values):\n    SEEN.append(run_values)\n"
    )
    async with monitored.MonitoredSession(state) as sess:
        await sess.run(counting_step)
    import importlib

    [values] = importlib.import_module(module).SEEN
    assert isinstance(values, monitored.SessionRunValues)


# -- misspelled hook names -------------------------------------------------------------------------
async def test_a_misspelled_hook_in_a_module_plugin_is_an_error(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin("typo", "def after_runn(run_context, run_values):\n    pass\n")
    with pytest.raises(
        monitored.PluginValidationError,
        match=r"plugin 'typo'.*did you mean 'after_run' for 'after_runn'",
    ) as info:
        async with monitored.MonitoredSession(state):
            pass
    assert info.value.plugin == "typo"


async def test_a_misspelled_hook_beside_a_valid_one_is_an_error(state: TrainState) -> None:
    class Hook:
        def before_run(self, run_context: Any) -> None:
            pass

        def after_runn(self, run_context: Any, run_values: Any) -> None:
            pass

    with pytest.raises(
        monitored.PluginValidationError, match=r"did you mean 'after_run' for 'after_runn'\?"
    ):
        async with monitored.MonitoredSession(state, hooks=[Hook()]):
            pass


@pytest.mark.parametrize(
    ("name", "hook"),
    [
        ("befor_run", "before_run"),
        ("after_run_hook", "after_run"),
        ("plugin_states", "plugin_state"),
        ("begun", "begin"),
        ("after_create_sesion", "after_create_session"),
        ("after_runn", "after_run"),
        ("begni", "begin"),
        ("aftr_run", "after_run"),
    ],
)
def test_near_misses_of_hook_names_are_recognized(name: str, hook: str) -> None:
    from monitored._core._plugins import _misspelled

    assert _misspelled(name) == hook


@pytest.mark.parametrize(
    "name", ["step", "log_metrics", "ending", "restore", "load_weights", "run"]
)
def test_unrelated_helper_names_are_allowed(name: str) -> None:
    from monitored._core._plugins import _misspelled

    assert _misspelled(name) is None


_TF1_HELPER_NAMES = [
    "after_step",
    "checkpoint",
    "begin_step",
    "cluster_size",
    "restore_state_dict",
    "after_eval",
]


@pytest.mark.parametrize("name", _TF1_HELPER_NAMES)
def test_helper_names_a_few_edits_from_a_hook_are_not_misspellings(name: str) -> None:
    from monitored._core._plugins import _misspelled

    assert _misspelled(name) is None


async def test_a_tf1_hook_with_public_helper_methods_is_accepted(state: TrainState) -> None:
    calls: list[str] = []

    def helper(self: object) -> None:
        calls.append("helper")

    def before_run(self: object, run_context: Any) -> None:
        calls.append("before_run")

    hook_class = type(
        "Hook", (), {"before_run": before_run} | dict.fromkeys(_TF1_HELPER_NAMES, helper)
    )
    async with monitored.MonitoredSession(state, hooks=[hook_class()]) as sess:
        await sess.run(counting_step)
    assert calls == ["before_run"]


async def test_a_session_run_hook_subclass_typo_lists_only_its_own_methods(
    state: TrainState,
) -> None:
    class Hook(monitored.SessionRunHook):
        def after_runs(self, run_context: Any, run_values: Any) -> None:
            pass

    with pytest.raises(monitored.PluginValidationError) as info:
        async with monitored.MonitoredSession(state, hooks=[Hook()]):
            pass
    message = str(info.value)
    assert "did you mean 'after_run' for 'after_runs'?" in message
    assert "for 'before_run'" not in message
    assert "for 'begin'" not in message


async def test_a_helper_with_an_unrelated_name_is_allowed(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin("helpers", "def format_loss(x):\n    return x\ndef after_run():\n    pass\n")
    async with monitored.MonitoredSession(state) as sess:
        await sess.run(counting_step)


async def test_wrappers_are_rejected(state: TrainState) -> None:
    class Wrapper:
        @monitored.hookimpl(wrapper=True)
        def before_run(self, run_context: Any) -> Any:
            return (yield)

    with pytest.raises(monitored.PluginValidationError, match="does not support pluggy wrappers"):
        async with monitored.MonitoredSession(state, hooks=[Wrapper()]):
            pass


async def test_two_distributions_with_the_same_plugin_name_are_an_error(
    fake_plugin: Any, state: TrainState
) -> None:
    fake_plugin("same", "def end(): pass", dist="monitored-a")
    fake_plugin("same", "def end(): pass", dist="monitored-b")
    with pytest.raises(monitored.PluginLoadError, match="monitored-a and monitored-b"):
        async with monitored.MonitoredSession(state):
            pass


async def test_chief_only_plugins_are_skipped_on_workers(fake_plugin: Any) -> None:
    fake_plugin("chiefy", "chief_only = True\ndef end(): pass\n")
    chief_state = TrainState({"w": np.zeros(1)})
    async with monitored.MonitoredSession(chief_state) as sess:
        assert [p.name for p in sess.plugins] == ["chiefy"]
    async with monitored.MonitoredSession(chief_state, is_chief=False) as sess:
        assert sess.plugins == ()


def test_installed_plugins_can_be_listed_without_a_session(fake_plugin: Any) -> None:
    fake_plugin("listed", "def end(): pass")
    [info] = monitored.installed_plugins()
    assert info.describe() == "plugin 'listed' (distribution monitored-listed 1.0)"


async def test_a_hook_object_implementing_no_hook_at_all_is_an_error(state: TrainState) -> None:
    class Empty:
        def compute(self) -> None:
            pass

    with pytest.raises(monitored.PluginValidationError, match=r"implements none of the hooks \("):
        async with monitored.MonitoredSession(state, hooks=[Empty()]):
            pass


def test_entry_points_are_read_again_when_a_distribution_is_installed(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from monitored._core._plugins import installed_entry_points

    site = tmp_path / "site"
    site.mkdir()
    os.utime(site, ns=(0, 0))  # an old directory: the install below changes its time
    monkeypatch.syspath_prepend(str(site))
    before = installed_entry_points()
    assert installed_entry_points() is before  # unchanged: not read again
    dist = site / "monitored_late-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: monitored-late\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[monitored]\nlate = late_plugin\n")
    after = installed_entry_points()
    assert "late" in {ep.name for ep in after}
    assert "late" not in {ep.name for ep in before}


def test_dunder_methods_are_never_hooks() -> None:
    # Registration skips dunders without looking at them (a session per
    # evaluation registers its hooks each time): even a marked one is no hook.
    from monitored._core._plugins import PluginInfo, PluginManager

    class Hook:
        @monitored.hookimpl(specname="end")
        def __call__(self, session: Any) -> None: ...

        def after_run(self, run_context: Any, run_values: Any) -> None: ...

    manager = PluginManager()
    manager.add(PluginInfo("hook", Hook()))
    assert manager.ordered_impls("end") == []
    assert [impl.plugin_name for impl, _ in manager.ordered_impls("after_run")] == ["hook"]


def test_a_distributions_metadata_is_read_once_per_entry_point() -> None:
    from monitored._core._plugins import _distribution

    class Dist:
        name = "monitored-x"
        version = "1.2"
        reads = 0

        @property
        def metadata(self) -> dict[str, str]:
            type(self).reads += 1
            return {"Name": "Monitored-X"}

    class EntryPoint:
        dist = Dist()

    first, second = EntryPoint(), EntryPoint()
    assert _distribution(first) == _distribution(first) == ("Monitored-X", "1.2")  # type: ignore[arg-type]
    assert Dist.reads == 1
    assert _distribution(second) == ("Monitored-X", "1.2")  # type: ignore[arg-type]
    assert Dist.reads == 2  # another entry point object is read on its own
