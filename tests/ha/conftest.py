from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.etcd_server import EtcdServer


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    with EtcdServer(tmp_path / "etcd") as server:
        yield server
