import pytest


@pytest.fixture(autouse=True)
def _own_workers_only(no_session_worker: None) -> None:
    """These tests start and kill workers of their own on the synth.* queues."""
