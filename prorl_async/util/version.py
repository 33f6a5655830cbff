"""The package version (here, not in ``prorl_async/__init__``, so that modules can read it
without importing the package root, which names every public module)."""

__version__ = "0.1.0"
