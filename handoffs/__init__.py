"""Handoff Observatory application layer: settings, store access, CLI routing, demo."""

__all__ = ["__version__"]

__version__ = "0.1.0"
