"""The private session runtime: session, hook calling, plugins, coordinator, state.

Nothing here is imported by users directly: ``monitored/__init__.py`` re-exports the
public names, and ``monitored/hookspecs.py`` holds the hook contract. The modules
are private so that they can be split or merged without breaking anyone.
"""
