"""Tracking URIs fit for a log line or a run's parameters: no password in them."""

from __future__ import annotations

import urllib.parse

__all__ = ["without_password"]


def without_password(uri: str | None) -> str:
    """``uri`` with a password in it replaced by ``***`` (``None``: MLflow's default store)."""
    if uri is None:
        return "MLflow's default store"
    try:
        parts = urllib.parse.urlsplit(uri)
        password = parts.password
    except ValueError:  # not a URL (a port that is no number): nothing to hide in it
        return uri
    if password is None:
        return uri
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
