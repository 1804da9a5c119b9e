from django.contrib import admin
from django.urls import path

from benchmarks.pruning import jobs  # noqa: F401 - registers the history's job names

urlpatterns = [path("admin/", admin.site.urls)]
