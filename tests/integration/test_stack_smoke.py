from django.db import connection


def test_it_uses_the_test_database(db: None) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_database(), inet_server_port()")
        name, port = cursor.fetchone()
    assert name == "tts"
    from tests.stack import CFG

    assert port == CFG.pg_port
