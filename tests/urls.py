from django.contrib import admin
from django.urls import path

from tests.testapp import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("async/dispatch/", views.dispatch_view),
    path("async/dispatch-in-transaction/", views.dispatch_in_transaction_view),
]
