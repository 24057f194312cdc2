"""The stack waits for Redis to read its data back before it starts anything that uses it."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import redis

from deploy.stack import wait_for_redis_data
from tests.stack import spare_port

KEYS = 1_000_000


def _start(folder: Path, port: int) -> subprocess.Popen[bytes]:
    conf = folder / "redis.conf"
    conf.write_text(
        f'port {port}\nbind 127.0.0.1\ndir {folder}\nsave ""\nappendonly no\nenable-debug-command local\n'
    )
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    return subprocess.Popen([binary, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_it_waits_until_redis_has_loaded_its_data(tmp_path: Path) -> None:
    port = spare_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = _start(tmp_path, port)
    try:
        client = redis.Redis.from_url(url)
        _until_answering(client)
        client.execute_command("DEBUG", "POPULATE", KEYS)
        client.save()
    finally:
        server.terminate()
        server.wait(30)
    server = _start(tmp_path, port)
    try:
        client = redis.Redis.from_url(url)
        # The port opens while the snapshot is still being read: commands get LOADING.
        saw_loading = False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()
                break
            except redis.BusyLoadingError:
                saw_loading = True
                break
            except redis.ConnectionError:
                time.sleep(0.005)
        assert saw_loading, "Redis loaded the snapshot before the first command: the test proves nothing"
        wait_for_redis_data(cast(Any, SimpleNamespace(redis_url=url)))
        assert client.dbsize() == KEYS
    finally:
        server.terminate()
        server.wait(30)


def _until_answering(client: redis.Redis) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
