from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.slurm import PrivateSlurm, slurm_available
from tests.conftest import require


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSlurm]:
    """A private three-node Slurm for the whole session, stopped by pid at the end."""
    require(slurm_available(), "Slurm (slurmctld slurmd slurm-client) or munge not installed")
    cluster = PrivateSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
