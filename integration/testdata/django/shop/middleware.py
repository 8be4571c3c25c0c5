"""Tells the client whether the request opened a new database connection,
so the test can check that CONN_MAX_AGE does what it says (a new connection
per request with 0, kept across requests with 60)."""
from django.db.backends.signals import connection_created

_opened = [False]


def _on_connection_created(sender, connection, **kwargs):
    _opened[0] = True


connection_created.connect(_on_connection_created, weak=False)


class ConnectionReport:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        # Django's request_started handler (close_old_connections) has run
        # already: a connection too old to keep is closed by now.
        _opened[0] = False
        response = self.get_response(request)
        response["X-New-DB-Connection"] = "1" if _opened[0] else "0"
        return response
