"""A test-only app whose migrations alter a table of their own: the migration lock tests run the real
``manage.py migrate`` on it (tests/integration/test_migration_lock.py), never on the service's tables."""
