"""prorl-async: rollout-as-a-service for RL training of multi-turn LLM agents."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
