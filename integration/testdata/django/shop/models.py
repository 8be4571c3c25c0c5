from django.db import models


class Product(models.Model):
    sku = models.CharField(max_length=20, unique=True)
    price = models.IntegerField()  # in cents


class Customer(models.Model):
    name = models.CharField(max_length=100, unique=True)


class Order(models.Model):
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="orders")
    status = models.CharField(max_length=20)
    created = models.DateTimeField(auto_now_add=True)


class OrderLine(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="lines")
    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="lines")
    qty = models.IntegerField()


class Account(models.Model):
    name = models.CharField(max_length=20, unique=True)
    balance = models.IntegerField()


class Note(models.Model):
    key = models.CharField(max_length=40)
    text = models.CharField(max_length=40)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "text"], name="note_key_text")]
