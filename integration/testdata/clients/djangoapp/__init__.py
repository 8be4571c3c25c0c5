"""The one-model Django app django_check.py runs its ORM requests against."""
