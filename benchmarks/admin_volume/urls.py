from django.contrib import admin
from django.urls import path

from django_gator import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics.view),
]
