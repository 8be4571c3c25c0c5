"""Seeds the products and accounts the workload uses, so that `migrate`
runs a data migration (RunPython inside the migration's transaction) as
well as DDL."""
from django.db import migrations

PRODUCTS = 20
ACCOUNTS = 10
OPENING_BALANCE = 1000


def seed(apps, schema_editor):
    Product = apps.get_model("shop", "Product")
    Account = apps.get_model("shop", "Account")
    Product.objects.bulk_create([Product(sku="p-%02d" % k, price=(k + 1) * 100) for k in range(PRODUCTS)])
    Account.objects.bulk_create([Account(name="a-%d" % k, balance=OPENING_BALANCE) for k in range(ACCOUNTS)])


def unseed(apps, schema_editor):
    apps.get_model("shop", "Product").objects.all().delete()
    apps.get_model("shop", "Account").objects.all().delete()


class Migration(migrations.Migration):

    dependencies = [("shop", "0001_initial")]

    operations = [migrations.RunPython(seed, unseed)]
