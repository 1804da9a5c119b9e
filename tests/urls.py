from django.contrib import admin
from django.urls import path

import django_gator.metrics
from tests.testapp import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("async/dispatch/", views.dispatch_view),
    path("async/dispatch-in-transaction/", views.dispatch_in_transaction_view),
    path("gator-metrics/", django_gator.metrics.view),
]
