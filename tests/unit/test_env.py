"""Settings are read strictly: a value that does not parse stops start-up, naming the variable."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from webapp.env import EnvError, env_bool, env_float, env_int, env_map, write_private
from webapp.provisioning import create_secret, read_secret

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("word", ["1", "true", "YES", "on", " On "])
def test_it_reads_true_words(word: str) -> None:
    assert env_bool("X_FLAG", False, {"X_FLAG": word}) is True


@pytest.mark.parametrize("word", ["0", "false", "No", "off"])
def test_it_reads_false_words(word: str) -> None:
    assert env_bool("X_FLAG", True, {"X_FLAG": word}) is False


def test_an_unset_or_empty_value_is_the_default() -> None:
    assert env_bool("X_FLAG", True, {}) is True
    assert env_bool("X_FLAG", True, {"X_FLAG": ""}) is True
    assert env_int("X_NUM", 7, {"X_NUM": " "}) == 7


@pytest.mark.parametrize("typo", ["ture", "flase", "enabled", "2"])
def test_a_boolean_typo_is_an_error_naming_the_variable(typo: str) -> None:
    with pytest.raises(EnvError, match=f"X_FLAG='{typo}' is not a boolean"):
        env_bool("X_FLAG", False, {"X_FLAG": typo})


@pytest.mark.parametrize("raw", ["²", "1.5", "ten", "1_000", "0x10"])
def test_a_whole_number_must_be_ascii_digits(raw: str) -> None:
    with pytest.raises(EnvError, match="X_NUM="):
        env_int("X_NUM", 1, {"X_NUM": raw})


def test_numbers_parse() -> None:
    assert env_int("X_NUM", 1, {"X_NUM": "-3"}) == -3
    assert env_float("X_F", 1.0, {"X_F": "2.5"}) == 2.5
    with pytest.raises(EnvError, match="X_F='fast' is not a number"):
        env_float("X_F", 1.0, {"X_F": "fast"})


def test_a_map_entry_without_equals_is_an_error() -> None:
    assert env_map("X_MAP", "", {"X_MAP": "a=b, c = d"}) == {"a": "b", "c": "d"}
    with pytest.raises(EnvError, match="X_MAP"):
        env_map("X_MAP", "", {"X_MAP": "a=b,oops"})


def test_django_refuses_to_start_on_a_boolean_typo(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TTS_"))}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "webapp.settings",
            "DJANGO_DEBUG": "flase",
            "TTS_VAR_DIR": str(tmp_path),
            "TTS_LOG_TO_FILE": "0",
        }
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "DJANGO_DEBUG='flase' is not a boolean" in result.stderr


def test_a_secret_file_is_private_from_the_first_byte(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "one"
    assert read_secret(path) == "" and not path.parent.exists()  # reading creates nothing
    old = os.umask(0)  # a permissive umask must not widen the mode
    try:
        assert create_secret(path) is True
    finally:
        os.umask(old)
    value = read_secret(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(value) >= 50 and value.replace("-", "").replace("_", "").isalnum()
    assert create_secret(path) is False and read_secret(path) == value  # created once, then kept
    assert sorted(p.name for p in path.parent.iterdir()) == ["one"]  # no draft left behind


def test_a_private_config_file_replaces_a_readable_one(tmp_path: Path) -> None:
    path = tmp_path / "redis.conf"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, "requirepass x\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == "requirepass x\n"


def test_database_url_is_parsed_with_its_socket_form() -> None:
    from webapp.settings import _database_from_url

    tcp = _database_from_url("postgres://tts:p%40ss@db.internal:5433/tts")
    assert (tcp["HOST"], tcp["PORT"], tcp["PASSWORD"], tcp["NAME"]) == ("db.internal", 5433, "p@ss", "tts")
    sock = _database_from_url("postgres://tts@/tts?host=/run/postgresql")
    assert sock["HOST"] == "/run/postgresql"
    with pytest.raises(ValueError, match="postgres"):
        _database_from_url("mysql://u:p@h/db")
