"""Settings of the fleet test project: a Django site configured the way
docs/django.md recommends for pgtender in transaction mode.

The database comes from the environment so that the Go test
(integration/django_test.go) can point the same project at pgtender or
straight at Postgres:

  DJANGO_DB_HOST, DJANGO_DB_PORT, DJANGO_DB_NAME, DJANGO_DB_USER,
  DJANGO_DB_PASSWORD   where to connect
  DJANGO_CONN_MAX_AGE  seconds a connection is kept (0: one per request)
  DJANGO_DB_SSLMODE    libpq sslmode (default prefer)
  DJANGO_SERVER_SIDE_CURSORS  1: leave Django's server-side cursors on
"""
import os

SECRET_KEY = "pgtender-test-only-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

# Only what the workload needs: no admin, auth or sessions, so that
# `migrate` creates the project's tables and django_migrations only.
INSTALLED_APPS = ["shop"]
MIDDLEWARE = ["shop.middleware.ConnectionReport"]
ROOT_URLCONF = "fleetsite.urls"
WSGI_APPLICATION = "fleetsite.wsgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("DJANGO_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DJANGO_DB_PORT", "6432"),
        "NAME": os.environ.get("DJANGO_DB_NAME", "appdb"),
        "USER": os.environ.get("DJANGO_DB_USER", "app"),
        "PASSWORD": os.environ.get("DJANGO_DB_PASSWORD", ""),
        # 0 closes the connection at the end of every request; a positive
        # value keeps it that many seconds. Both are run by the test.
        "CONN_MAX_AGE": int(os.environ.get("DJANGO_CONN_MAX_AGE", "0")),
        # In transaction mode consecutive transactions of one Django
        # connection may run on different server connections. A server-side
        # cursor (QuerySet.iterator() outside atomic: DECLARE ... WITH HOLD,
        # then FETCH in later transactions) lives on one server connection;
        # see docs/django.md for what pgtender does with one and why it is
        # turned off. DJANGO_SERVER_SIDE_CURSORS=1 turns them back on: the
        # test does so once, to observe what happens.
        "DISABLE_SERVER_SIDE_CURSORS": os.environ.get("DJANGO_SERVER_SIDE_CURSORS") != "1",
        # Django keeps no transaction open across a request by default;
        # ATOMIC_REQUESTS would hold a server connection for the whole view.
        "ATOMIC_REQUESTS": False,
        "OPTIONS": {
            # libpq's bound on opening the connection (TCP connect and
            # login), in seconds: a pooler that does not answer fails the
            # request instead of hanging the worker until gunicorn's
            # timeout (30 s) kills it. Above pgtender's connect_timeout and
            # checkout_timeout (5 s each by default), so that a login that
            # waits for a cold pool or a passthrough verification gets
            # pgtender's answer rather than giving up first.
            "connect_timeout": 10,
            "sslmode": os.environ.get("DJANGO_DB_SSLMODE", "prefer"),
            "application_name": "pgtender-django-fleet",
        },
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django": {"handlers": ["console"], "level": "WARNING"}},
}
