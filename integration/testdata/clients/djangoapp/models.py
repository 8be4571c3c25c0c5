from django.db import models


class Item(models.Model):
    name = models.CharField(max_length=100, unique=True)
    qty = models.IntegerField()
    created = models.DateTimeField(null=True)

    class Meta:
        app_label = "djangoapp"
        db_table = "clients_django_item"
