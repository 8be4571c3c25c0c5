from django.urls import path

from shop import views

urlpatterns = [
    path("ping", views.ping),
    path("order", views.order),
    path("report", views.report),
    path("nested", views.nested),
    path("transfer", views.transfer),
    path("integrity", views.integrity),
    path("raw", views.raw),
    path("iterate", views.iterate),
    path("summary", views.summary),
]
