"""The workload's views. Each one does what a Django fleet does on the
database and returns JSON that depends only on its parameter n (never on
ids or on the order in which concurrent requests ran), so that the Go test
can compare the responses through pgtender with those straight from
Postgres, and check them against values it computes itself."""
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Sum
from django.http import JsonResponse
from django.views.decorators.http import require_GET, require_POST

from .models import Account, Customer, Note, Order, OrderLine, Product

# As seeded by migrations/0002_seed.py.
PRODUCTS = 20
ACCOUNTS = 10


class Rollback(Exception):
    """Raised to leave an atomic block, which rolls it back."""


def _n(request):
    return int(request.POST.get("n") if request.method == "POST" else request.GET.get("n"))


def _sku(k):
    return "p-%02d" % k


def order_lines(n):
    """(product index, qty) of order n's three lines: distinct products."""
    return [(n % PRODUCTS, n % 5 + 1), ((n + 7) % PRODUCTS, n % 3 + 1), ((n + 13) % PRODUCTS, 1)]


@require_GET
def ping(request):
    with connection.cursor() as c:
        c.execute("SELECT 1")
        return JsonResponse({"ok": c.fetchone()[0] == 1})


@require_POST
def order(request):
    """Create, bulk_create, update, and an aggregate over a join, each
    statement in autocommit (no atomic), as a plain Django view runs them."""
    n = _n(request)
    customer = Customer.objects.create(name="c-%d" % n)
    o = Order.objects.create(customer=customer, status="new")
    prices = dict(Product.objects.filter(sku__in=[_sku(k) for k, _ in order_lines(n)]).values_list("sku", "id"))
    OrderLine.objects.bulk_create([OrderLine(order=o, product_id=prices[_sku(k)], qty=q) for k, q in order_lines(n)])
    updated = Order.objects.filter(pk=o.pk, status="new").update(status="placed")
    total = OrderLine.objects.filter(order=o).aggregate(total=Sum(F("qty") * F("product__price")))["total"]
    return JsonResponse({"n": n, "updated": updated, "status": Order.objects.get(pk=o.pk).status,
                         "lines": o.lines.count(), "total": total})


@require_GET
def report(request):
    """Joins and aggregates through the ORM: annotate over two relations,
    select_related across three tables."""
    n = _n(request)
    name = "c-%d" % n
    row = (Customer.objects.filter(name=name)
           .annotate(orders_count=Count("orders", distinct=True),
                     items=Sum("orders__lines__qty"),
                     value=Sum(F("orders__lines__qty") * F("orders__lines__product__price")))
           .values("name", "orders_count", "items", "value").get())
    lines = [[line.product.sku, line.qty, line.order.customer.name]
             for line in OrderLine.objects.select_related("product", "order__customer")
             .filter(order__customer__name=name).order_by("product__sku")]
    return JsonResponse({"n": n, "customer": row, "lines": lines})


@require_POST
def nested(request):
    """Nested atomic blocks: the inner ones are savepoints; rolling one back
    keeps the rest of the transaction; on_commit runs after the outer one."""
    n = _n(request)
    key = "n-%d" % n
    committed = []
    with transaction.atomic():
        Note.objects.create(key=key, text="outer")
        with transaction.atomic():
            Note.objects.create(key=key, text="kept-1")
            try:
                with transaction.atomic():
                    Note.objects.create(key=key, text="lost-2")
                    raise Rollback()
            except Rollback:
                pass
            with transaction.atomic():
                Note.objects.create(key=key, text="kept-3")
        try:
            with transaction.atomic():
                Note.objects.create(key=key, text="lost-4")
                with transaction.atomic():
                    Note.objects.create(key=key, text="lost-5")
                raise Rollback()
        except Rollback:
            pass
        inside = Note.objects.filter(key=key).count()
        in_atomic = connection.in_atomic_block
        transaction.on_commit(lambda: committed.append(True))
    texts = sorted(Note.objects.filter(key=key).values_list("text", flat=True))
    return JsonResponse({"n": n, "inside": inside, "in_atomic": in_atomic, "texts": texts,
                         "on_commit_ran": committed == [True], "in_atomic_after": connection.in_atomic_block})


def transfer_of(n):
    src = n % ACCOUNTS
    dst = (src + 1 + n % (ACCOUNTS - 1)) % ACCOUNTS
    return src, dst, n % 7 + 1


@require_POST
def transfer(request):
    """select_for_update on two shared accounts, locked in name order so
    that concurrent transfers cannot deadlock; the sum of all balances read
    inside the transaction must be what was opened."""
    n = _n(request)
    src, dst, amount = transfer_of(n)
    names = ["a-%d" % src, "a-%d" % dst]
    with transaction.atomic():
        locked = list(Account.objects.select_for_update().filter(name__in=names).order_by("name"))
        Account.objects.filter(name=names[0]).update(balance=F("balance") - amount)
        Account.objects.filter(name=names[1]).update(balance=F("balance") + amount)
        total = Account.objects.aggregate(total=Sum("balance"))["total"]
    return JsonResponse({"n": n, "locked": len(locked), "from": names[0], "to": names[1],
                         "amount": amount, "total": total})


@require_POST
def integrity(request):
    """IntegrityErrors caught in three places; after each the connection
    must go on working: a failed atomic block at the top level, a failed
    savepoint inside a transaction that then commits, and a failed
    statement in autocommit."""
    n = _n(request)
    name = "dup-%d" % n
    key = "i-%d" % n
    Customer.objects.create(name=name)
    caught = []
    try:
        with transaction.atomic():
            Customer.objects.create(name=name)
    except IntegrityError:
        caught.append("atomic")
    after_atomic = Customer.objects.filter(name=name).count()
    with transaction.atomic():
        Note.objects.create(key=key, text="before")
        try:
            with transaction.atomic():
                Note.objects.create(key=key, text="before")
        except IntegrityError:
            caught.append("savepoint")
        Note.objects.create(key=key, text="after")
    try:
        Customer.objects.create(name=name)
    except IntegrityError:
        caught.append("autocommit")
    texts = sorted(Note.objects.filter(key=key).values_list("text", flat=True))
    return JsonResponse({"n": n, "caught": caught, "after_atomic": after_atomic, "texts": texts,
                         "customers": Customer.objects.filter(name=name).count()})


@require_GET
def raw(request):
    """Raw SQL with parameters: a cursor over a four-table join, a raw
    queryset, and parameters that need quoting."""
    n = _n(request)
    name = "c-%d" % n
    with connection.cursor() as c:
        c.execute(
            "SELECT c.name, count(l.id), sum(l.qty), sum(l.qty * p.price)"
            " FROM shop_customer c JOIN shop_order o ON o.customer_id = c.id"
            " JOIN shop_orderline l ON l.order_id = o.id JOIN shop_product p ON p.id = l.product_id"
            " WHERE c.name = %s GROUP BY c.name", [name])
        joined = list(c.fetchone())
        c.execute("SELECT %s::text, %s::int + 1, %s::text IS NULL", ["it's \"quoted\" %s; -- " + name, n, None])
        echoed = list(c.fetchone())
    names = [customer.name for customer in Customer.objects.raw("SELECT id, name FROM shop_customer WHERE name = %s", [name])]
    return JsonResponse({"n": n, "joined": joined, "echoed": echoed, "raw_names": names})


@require_GET
def iterate(request):
    """QuerySet.iterator() outside a transaction: the query Django would run
    through a server-side cursor unless DISABLE_SERVER_SIDE_CURSORS is set."""
    count = 0
    total = 0
    for product in Product.objects.order_by("sku").iterator(chunk_size=5):
        count += 1
        total += product.price
    return JsonResponse({"count": count, "total": total})


@require_GET
def summary(request):
    """Totals over everything the workload wrote."""
    totals = OrderLine.objects.aggregate(lines=Count("id"), items=Sum("qty"), value=Sum(F("qty") * F("product__price")))
    products = list(Product.objects.annotate(line_count=Count("lines"), items=Sum("lines__qty"))
                    .order_by("sku").values_list("sku", "line_count", "items"))
    balances = list(Account.objects.order_by("name").values_list("name", "balance"))
    return JsonResponse({
        "customers": Customer.objects.count(),
        "orders": Order.objects.filter(status="placed").count(),
        "totals": totals,
        "products": products,
        "balances": balances,
        "balance_total": Account.objects.aggregate(total=Sum("balance"))["total"],
        "notes": Note.objects.count(),
    })
