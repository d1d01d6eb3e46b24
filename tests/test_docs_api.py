"""The API reference: every public name on one page, once, in a group by capability.

docs/api.md groups the user API (session and hooks, training toolkit, input
pipelines, evaluation and metrics, the Estimator, the Supervisor, errors); docs/plugin-api.md
holds what plugin authors use. A name added to ``monitored.__all__`` (or to a
subpackage's) without a place in either fails here.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import monitored
import monitored.data
import monitored.estimator
import monitored.evaluation
import monitored.metrics
import monitored.supervisor

DOCS = Path(__file__).parent.parent / "docs"
SECTIONS = [
    "The session and hooks",
    "The training toolkit",
    "Input pipelines",
    "Evaluation and metrics",
    "The Estimator",
    "The Supervisor",
    "Errors",
]


def _documented(page: str) -> Counter[str]:
    return Counter(re.findall(r"^::: (\S+)$", (DOCS / page).read_text(), flags=re.MULTILINE))


def test_every_public_name_is_documented_once_on_one_of_the_two_pages() -> None:
    documented = _documented("api.md") + _documented("plugin-api.md")
    assert [name for name, count in documented.items() if count > 1] == []
    wanted = {f"monitored.{name}" for name in monitored.__all__ if name != "__version__"}
    root = set(monitored.__all__)
    subpackages = (
        monitored.data,
        monitored.evaluation,
        monitored.metrics,
        monitored.supervisor,
        monitored.estimator,
        monitored.estimator.learn_runner,
    )
    for module in subpackages:
        # Names also exported from monitored itself are documented there, once.
        wanted |= {
            f"{module.__name__}.{n}"
            for n in module.__all__
            if n not in root or getattr(monitored, n) is not getattr(module, n)
        }
    assert set(documented) == wanted


def test_the_reference_is_grouped_by_capability_and_plugin_authors_have_their_own_page() -> None:
    headings = re.findall(r"^## (.+)$", (DOCS / "api.md").read_text(), flags=re.MULTILINE)
    assert headings == SECTIONS
    plugin_api = _documented("plugin-api.md")
    assert {"monitored.hookimpl", "monitored.Cluster", "monitored.BackgroundSpan"} <= set(
        plugin_api
    )
    assert "monitored.MonitoredTrainingSession" not in plugin_api
    nav = (DOCS.parent / "mkdocs.yml").read_text()
    assert nav.index("plugins.md") < nav.index("plugin-api.md")  # beside writing plugins
