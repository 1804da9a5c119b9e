from django.contrib import admin

from demo.models import LoyaltyEntry


@admin.register(LoyaltyEntry)
class LoyaltyEntryAdmin(admin.ModelAdmin):
    list_display = ["order_id", "points", "created_at"]
