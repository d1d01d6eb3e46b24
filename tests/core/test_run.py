"""SessionRunArgs, SessionRunValues and SessionRunContext."""

from __future__ import annotations

import pytest

import monitored
from monitored import SessionRunArgs


def test_feed_dict_is_tf1s_name_for_feeds() -> None:
    args = SessionRunArgs("loss", feed_dict={"lr": 0.1})
    assert args.feeds == args.feed_dict == {"lr": 0.1}
    assert args == SessionRunArgs("loss", {"lr": 0.1})
    assert args != SessionRunArgs("w", {"lr": 0.1})
    assert "fetches='loss'" in repr(args)


def test_feeds_and_feed_dict_together_are_an_error() -> None:
    with pytest.raises(TypeError, match="pass feeds or feed_dict, not both"):
        SessionRunArgs(feeds={"a": 1}, feed_dict={"a": 1})


def test_feeds_must_be_a_mapping() -> None:
    with pytest.raises(TypeError, match="must be a mapping of names to values, got list"):
        SessionRunArgs(feeds=[("lr", 0.1)])  # type: ignore[arg-type]


def test_session_run_args_are_not_hashable() -> None:
    with pytest.raises(TypeError):
        hash(SessionRunArgs("loss"))


def test_session_run_values_defaults() -> None:
    values = monitored.SessionRunValues(3.0)
    assert values.results == 3.0
    assert values.options is None
    assert values.run_metadata is None
