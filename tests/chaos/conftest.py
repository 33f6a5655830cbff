"""Seeds of the chaos tests: ``--chaos-seed N`` (repeatable; pass it with ``tests/chaos``
on the command line) or ``PRORL_CHAOS_SEED=N[,M...]`` replays given seeds;
``PRORL_CHAOS_SEEDS=K`` runs seeds 0..K-1; otherwise the fixed CI set (a test module's own
``CI_SEEDS``, else the one below)."""

from __future__ import annotations

import os

import pytest

# A few fixed seeds for CI, each its own server: budget 1 with no warm pool and no JIT
# INIT (2); warm pools above the budget (3: 4 of 3, 5: 4 of 2), at budget 1 (7: 2), with
# JIT INIT off (9: 1). Before the warm pool gave slots back, 3, 5, 7 and 9 hung.
CI_SEEDS = (2, 3, 5, 7, 9)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--chaos-seed",
        action="append",
        type=int,
        default=[],
        help="replay this chaos seed (repeatable); see also PRORL_CHAOS_SEED(S)",
    )


def chaos_seeds(config: pytest.Config, default: tuple[int, ...] = CI_SEEDS) -> list[int]:
    given: list[int] = list(config.getoption("--chaos-seed", default=None) or [])
    env = os.environ.get("PRORL_CHAOS_SEED", "").strip()
    if env:
        given += [int(s) for s in env.replace(",", " ").split()]
    if given:
        return given
    count = os.environ.get("PRORL_CHAOS_SEEDS", "").strip()
    if count:
        return list(range(int(count)))
    return list(default)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "chaos_seed" in metafunc.fixturenames:
        seeds = chaos_seeds(metafunc.config, getattr(metafunc.module, "CI_SEEDS", CI_SEEDS))
        metafunc.parametrize("chaos_seed", seeds, ids=[f"seed{s}" for s in seeds])
