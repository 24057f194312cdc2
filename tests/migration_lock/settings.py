"""The test settings with the ``migration_lock`` app installed, for the subprocesses of its tests only."""

from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.migration_lock"]  # noqa: F405
