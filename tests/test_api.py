"""The public surface: ``__all__`` and the hook reference."""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

import monitored
import monitored.data
import monitored.estimator
import monitored.evaluation
import monitored.metrics
import monitored.supervisor
import monitored.train
from monitored import hookspecs

DOCS = Path(__file__).parent.parent / "docs"


def test_all_lists_exactly_the_public_names() -> None:
    public = {name for name in dir(monitored) if not name.startswith("_")}
    modules = {name for name in public if inspect.ismodule(getattr(monitored, name))}
    assert set(monitored.__all__) - {"__version__"} == public - modules
    assert len(monitored.__all__) == len(set(monitored.__all__))


@pytest.mark.parametrize(
    "subpackage",
    [
        monitored.train,
        monitored.data,
        monitored.metrics,
        monitored.evaluation,
        monitored.supervisor,
        monitored.estimator,
    ],
)
def test_each_capability_subpackage_lists_exactly_its_public_names(subpackage: Any) -> None:
    public = {name for name in vars(subpackage) if not name.startswith("_")}
    modules = {name for name in public if inspect.ismodule(getattr(subpackage, name))}
    assert set(subpackage.__all__) == public - modules


@pytest.mark.parametrize(
    "subpackage",
    [
        monitored.train,
        monitored.data,
        monitored.metrics,
        monitored.evaluation,
        monitored.supervisor,
        monitored.estimator,
    ],
)
def test_errors_of_each_subpackage_report_a_public_module(subpackage: Any) -> None:
    errors = [
        obj
        for obj in (getattr(subpackage, name) for name in subpackage.__all__)
        if inspect.isclass(obj) and issubclass(obj, BaseException)
    ]
    for error in errors:
        module = error.__module__
        assert not any(part.startswith("_") for part in module.split(".")), error
        assert getattr(sys.modules[module], error.__qualname__) is error
    if subpackage is monitored.evaluation:
        assert repr(monitored.evaluation.NoCheckpointError) == (
            "<class 'monitored.evaluation.NoCheckpointError'>"
        )


def test_the_training_toolkit_is_exported_from_the_top_level_too() -> None:
    missing = [name for name in monitored.train.__all__ if name not in monitored.__all__]
    assert not missing, f"monitored.train exports {missing} but monitored does not"
    for name in monitored.train.__all__:
        assert getattr(monitored, name) is getattr(monitored.train, name)


def test_every_public_name_is_documented() -> None:
    for name in monitored.__all__:
        obj = getattr(monitored, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"monitored.{name} has no docstring"


def test_tf1_names_are_available() -> None:
    for name in [
        "MonitoredSession",
        "MonitoredTrainingSession",
        "SingularMonitoredSession",
        "SessionRunHook",
        "SessionRunArgs",
        "SessionRunContext",
        "SessionRunValues",
        "Coordinator",
        "Scaffold",
        "SessionManager",
        "StopAtStepHook",
        "StepCounterHook",
        "LoggingTensorHook",
        "SecondOrStepTimer",
        "GlobalStepWaiterHook",
        "FinalOpsHook",
        "FeedFnHook",
        "OutOfRangeError",
        "AbortedError",
        "UnavailableError",
    ]:
        assert hasattr(monitored, name), name


def _spec_names() -> list[str]:
    return [
        name for name in hookspecs.__all__ if hasattr(getattr(hookspecs, name), "monitored_spec")
    ]


def test_hookspecs_all_lists_every_spec() -> None:
    marked = {
        name
        for name, obj in vars(hookspecs).items()
        if callable(obj) and hasattr(obj, "monitored_spec")
    }
    assert set(_spec_names()) == marked
    assert {"begin", "after_create_session", "before_run", "after_run", "end"} <= marked


def test_every_hookspec_has_a_docstring_and_a_section_in_the_hook_reference() -> None:
    reference = (DOCS / "hooks.md").read_text()
    headings = set(re.findall(r"^##+ `(\w+)\(", reference, flags=re.MULTILINE))
    for name in _spec_names():
        assert inspect.getdoc(getattr(hookspecs, name)), f"hookspec {name} has no docstring"
        assert name in headings, f"hookspec {name} is missing from docs/hooks.md"
    assert headings <= set(_spec_names()), "docs/hooks.md documents hooks that do not exist"


def test_the_capability_hooks_are_those_of_the_reference_section() -> None:
    """``monitored.provider`` tells a session's owner of a capability by these names."""
    from monitored._core._capabilities import CAPABILITY_HOOKS

    section = _section("hooks.md", "## Capability hooks")
    assert set(re.findall(r"^### `(\w+)\(", section, flags=re.MULTILINE)) == CAPABILITY_HOOKS
    assert set(_spec_names()) >= CAPABILITY_HOOKS


def test_plugins_find_a_capability_through_a_public_function() -> None:
    """Issue 22: plugins reach another plugin's capability without importing it."""
    assert {"provider", "Provider"} <= set(monitored.__all__)
    assert "session" in inspect.signature(monitored.provider).parameters
    guide = (DOCS / "plugins.md").read_text()
    assert "monitored.provider(" in guide


def test_errors_report_the_public_module_and_other_classes_their_own() -> None:
    for name in monitored.__all__:
        obj = getattr(monitored, name)
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            assert not obj.__module__.startswith("monitored._core"), name
        elif inspect.isclass(obj):
            # Left where it is defined, so that its string annotations resolve there.
            assert getattr(sys.modules[obj.__module__], obj.__qualname__) is obj, name
    assert repr(monitored.PluginValidationError) == "<class 'monitored.PluginValidationError'>"
    for cls in (monitored.TrainingConfig, monitored.SessionRunValues, monitored.TrainState):
        typing.get_type_hints(cls)


def test_one_way_to_open_what_is_read_from_disk_is_public() -> None:
    """Issue 25 §7: plugins share the core's opener, documented for plugin authors."""
    names = {"UnsafeFileError", "is_plain_name", "open_regular_file", "read_regular_file"}
    assert names <= set(monitored.__all__)
    guide = (DOCS / "plugins.md").read_text()
    assert "## Reading files from disk" in guide
    for name in names:
        assert name in guide, f"docs/plugins.md does not mention {name}"


def _section(page: str, heading: str) -> str:
    text = (DOCS / page).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else None]


def test_tf1_migration_names_every_tf_train_optimizer_schedule_clipping_and_average() -> None:
    """docs/tf1-migration.md's tf.train table: every name of monitored.train appears
    in it, and every ``monitored.X`` it names exists (issue 22)."""
    table = _section("tf1-migration.md", "## `tf.train`: optimizers, schedules")
    named = set(re.findall(r"`monitored\.([A-Za-z_]\w*)", table))
    missing = sorted(set(monitored.train.__all__) - named)
    assert not missing, f"docs/tf1-migration.md's tf.train table lacks {missing}"
    unknown = sorted(name for name in named if not hasattr(monitored, name))
    assert not unknown, f"docs/tf1-migration.md names monitored.{unknown}, which do not exist"


def test_tf1_migration_run_config_table_names_real_arguments() -> None:
    """Each RunConfig field's replacement is an argument train_and_evaluate takes."""
    table = _section("tf1-migration.md", "## `tf.estimator.RunConfig`")
    arguments = set(re.findall(r"`(\w+)=`", table))
    assert {"model_dir", "save_checkpoint_steps", "keep_checkpoint_max"} <= arguments
    taken = set(inspect.signature(monitored.train_and_evaluate).parameters) | set(
        inspect.signature(monitored.MonitoredTrainingSession).parameters
    )
    assert arguments <= taken, sorted(arguments - taken)


def _imports_of_init() -> tuple[dict[str, tuple[str, ...]], set[str]]:
    """``monitored/__init__.py``'s imports: those of its ``if _TYPE_CHECKING:`` block by
    module, and the names it imports from its own modules at run time."""
    tree = ast.parse(Path(monitored.__file__).read_text())
    blocks = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "_TYPE_CHECKING"
    ]
    assert len(blocks) == 1
    checked = {
        "." * node.level + str(node.module): tuple(alias.name for alias in node.names)
        for node in blocks[0].body
        if isinstance(node, ast.ImportFrom)
    }
    eager = {
        alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 1
        for alias in node.names
    }
    return checked, eager


def test_the_lazy_names_are_those_type_checkers_read() -> None:
    """What ``__getattr__`` imports is what mypy and readers see imported, name for name,
    and with the names imported at once, that is everything ``__all__`` lists."""
    lazy = monitored._LAZY_MODULES  # type: ignore[attr-defined]
    checked, eager = _imports_of_init()
    assert checked == lazy
    names = [*eager, *(name for names in lazy.values() for name in names)]
    assert sorted(names) == sorted(set(monitored.__all__) - {"__version__"})


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'monitored' has no attribute 'Sesion'"):
        monitored.Sesion  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(ImportError, match="cannot import name 'Sesion'"):
        from monitored import Sesion  # type: ignore[attr-defined]  # noqa: F401


# Run in a fresh interpreter: in the test process everything is imported already.
_FRESH_IMPORT = """
import sys

import monitored

print(sorted(m for m in sys.modules if m.partition(".")[0] in ("monitored", "numpy", "anyio")))
print(sys.modules["monitored._core._errors"].PluginError.__module__)
from monitored import MonitoredSession, to_scalar

print(MonitoredSession.__module__, to_scalar.__module__, "numpy" in sys.modules)
print(monitored.train.AdamOptimizer is monitored.AdamOptimizer, monitored.metrics.__name__)
"""


def test_import_monitored_imports_only_its_errors_and_the_rest_at_first_use() -> None:
    """``import monitored`` leaves the runtime, NumPy and anyio to the first name used;
    a name then resolves with its public module, and the subpackages as attributes."""
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_IMPORT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        # _exit: the hook that stops anyio workers of a closed loop at exit (threading only)
        "['monitored', 'monitored._core', 'monitored._core._errors', 'monitored._core._exit', "
        "'monitored._core._files']",
        "monitored",
        "monitored._core._session monitored True",
        "True monitored.metrics",
    ]
