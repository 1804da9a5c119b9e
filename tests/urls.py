from django.contrib import admin
from django.urls import path

import django_gator.metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("gator-metrics/", django_gator.metrics.view),
]
