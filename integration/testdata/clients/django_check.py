#!/usr/bin/env python3
"""Django ORM requests through a DSN, the way a Django fleet with
CONN_MAX_AGE=0 makes them: a new database connection per request, closed at
the end of the request.

Usage: django_check.py DSN [REQUESTS]

Django is configured in code (settings.configure) with USE_TZ=False and
TIME_ZONE="Asia/Kolkata", so on every new connection Django's PostgreSQL
backend runs `SET TIME ZONE 'Asia/Kolkata'` in autocommit mode, that is,
outside a transaction (it does so whenever the TimeZone the server reported
at login differs from the one it wants; with USE_TZ=True it wants "UTC").

Each request does create / filter / update / delete, a transaction.atomic
block that raises and is rolled back, a nested atomic (savepoint) that is
rolled back alone, and an IntegrityError handled inside atomic.

Then it looks at what becomes of Django's connection-time SET when another
client takes the server connection it ran on, and prints "observe:" lines;
the Go test compares them with a run straight against Postgres.

Every line starts with "check:", "observe:", "error:" or is the final summary
"django: N requests, E errors". Exits 1 if E > 0.
"""

import datetime
import os
import sys
from urllib.parse import unquote, urlparse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import django  # noqa: E402
from django.conf import settings  # noqa: E402

DJANGO_TZ = "Asia/Kolkata"


def configure(dsn):
    u = urlparse(dsn)
    settings.configure(
        DEBUG=False,
        USE_TZ=False,
        TIME_ZONE=DJANGO_TZ,
        INSTALLED_APPS=["djangoapp"],
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": u.path.lstrip("/"),
                "USER": unquote(u.username or ""),
                "PASSWORD": unquote(u.password or ""),
                "HOST": u.hostname,
                "PORT": str(u.port or 5432),
                "CONN_MAX_AGE": 0,
                "OPTIONS": {"sslmode": "disable", "connect_timeout": 10},
            }
        },
    )
    django.setup()


class Mismatch(Exception):
    pass


class Boom(Exception):
    pass


def expect(what, got, want):
    if got != want:
        raise Mismatch("%s: got %r, want %r" % (what, got, want))


def main():
    if len(sys.argv) < 2:
        print("usage: django_check.py DSN [REQUESTS]", file=sys.stderr)
        return 2
    configure(sys.argv[1])
    total = int(sys.argv[2]) if len(sys.argv) > 2 else 100

    import psycopg2
    from django.db import IntegrityError, close_old_connections, connection, transaction
    from django.db.backends.signals import connection_created
    from django.db.models import F

    from djangoapp.models import Item

    print("check: django %s, psycopg2 %s" % (django.get_version(), psycopg2.__version__))
    created = []
    connection_created.connect(lambda sender, connection, **kw: created.append(connection.connection.get_backend_pid()), weak=False)

    # The TimeZone the server reports at login, before Django changes it.
    plain = psycopg2.connect(sys.argv[1])
    server_tz = plain.info.parameter_status("TimeZone")
    plain.close()
    print("observe: startup_parameter_status_TimeZone=%s" % server_tz)

    # Setup outside the counted requests: the table, with no migrations.
    with connection.cursor() as c:
        c.execute("DROP TABLE IF EXISTS " + Item._meta.db_table)
    with connection.schema_editor() as editor:
        editor.create_model(Item)
    connection.close()
    created.clear()

    errors = 0
    tz_kept = 0
    naive = datetime.datetime(2024, 1, 1, 12, 0, 0)
    for i in range(1, total + 1):
        close_old_connections()  # request_started
        try:
            # Django's connect-time SET TIME ZONE, seen by this request's first query.
            with connection.cursor() as c:
                c.execute("SHOW TimeZone")
                if c.fetchone()[0] == DJANGO_TZ:
                    tz_kept += 1

            item = Item.objects.create(name="item-%d" % i, qty=i, created=naive)
            expect("filter count", Item.objects.filter(name="item-%d" % i).count(), 1)
            expect("filter exists", Item.objects.filter(qty=i, name__startswith="item-").exists(), True)
            expect("update", Item.objects.filter(pk=item.pk).update(qty=F("qty") + 1), 1)
            item.refresh_from_db()
            expect("qty after update", item.qty, i + 1)
            expect("datetime round trip", item.created, naive)

            try:
                with transaction.atomic():
                    Item.objects.create(name="ghost-%d" % i, qty=-1)
                    Item.objects.filter(pk=item.pk).update(qty=0)
                    raise Boom()
            except Boom:
                pass
            expect("row created in a rolled-back atomic", Item.objects.filter(name="ghost-%d" % i).exists(), False)
            expect("row updated in a rolled-back atomic", Item.objects.get(pk=item.pk).qty, i + 1)

            with transaction.atomic():
                locked = Item.objects.select_for_update().get(pk=item.pk)
                Item.objects.create(name="keep-%d" % i, qty=1)
                try:
                    with transaction.atomic():  # a savepoint
                        Item.objects.create(name="ghost2-%d" % i, qty=1)
                        raise Boom()
                except Boom:
                    pass
                try:
                    with transaction.atomic():
                        Item.objects.create(name="keep-%d" % i, qty=2)  # unique violation
                    raise Mismatch("duplicate name did not raise IntegrityError")
                except IntegrityError:
                    pass
                locked.qty = 100
                locked.save(update_fields=["qty"])
            expect("savepoint rolled back alone", sorted(Item.objects.filter(name__in=["keep-%d" % i, "ghost2-%d" % i]).values_list("name", flat=True)), ["keep-%d" % i])
            expect("qty saved in the outer atomic", Item.objects.get(pk=item.pk).qty, 100)

            deleted, _ = Item.objects.filter(name__in=["item-%d" % i, "keep-%d" % i]).delete()
            expect("deleted rows", deleted, 2)
        except (Mismatch, django.db.Error) as e:
            errors += 1
            print("error: request %d: %s: %s" % (i, type(e).__name__, str(e).strip()))
        finally:
            connection.close()  # request_finished with CONN_MAX_AGE=0
    expect_connections = len(created)
    if expect_connections != total:
        errors += 1
        print("error: %d connections were opened for %d requests, want one each" % (expect_connections, total))
    print("check: %d requests, each on a new connection: create, filter, update, refresh, atomic that raises, "
          "select_for_update, savepoint rollback, IntegrityError in atomic, delete" % total)
    print("observe: requests_whose_first_query_saw_django_timezone=%d/%d" % (tz_kept, total))

    observe_timezone(sys.argv[1], connection, Item, naive)

    with connection.cursor() as c:
        c.execute("DROP TABLE " + Item._meta.db_table)
    connection.close()
    print("django: %d requests, %d errors" % (total, errors))
    return 1 if errors else 0


def observe_timezone(dsn, connection, Item, naive):
    """Django connects (and SETs TIME ZONE outside a transaction); another
    client (a psycopg2 connection not in autocommit, so it stays in a
    transaction) then queries, and only then does the Django request run its
    ORM queries. Straight to Postgres the SET belongs to Django's session.
    Prints what happened; it is not an error either way."""
    import psycopg2

    connection.close()
    connection.ensure_connection()
    print("observe: django_client_parameter_status_TimeZone=%s" % connection.connection.get_parameter_status("TimeZone"))
    other = psycopg2.connect(dsn)
    try:
        oc = other.cursor()
        oc.execute("SHOW TimeZone")
        print("observe: other_client_timezone=%s" % oc.fetchone()[0])
        with connection.cursor() as c:
            c.execute("SHOW TimeZone")
            print("observe: django_session_timezone=%s" % c.fetchone()[0])
        # A naive datetime is stored as a timestamptz in the session's time zone.
        item = Item.objects.create(name="tz-probe", qty=0, created=naive)
        with connection.cursor() as c:
            c.execute("SELECT (created AT TIME ZONE 'UTC')::text FROM " + Item._meta.db_table + " WHERE id = %s", [item.pk])
            print("observe: naive_2024-01-01T12:00_in_%s_stored_as_utc=%s" % (DJANGO_TZ, c.fetchone()[0]))
        other.rollback()
        item.delete()
    finally:
        other.close()
        connection.close()


if __name__ == "__main__":
    sys.exit(main())
