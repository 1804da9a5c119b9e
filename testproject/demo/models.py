from django.db import models


class LoyaltyEntry(models.Model):
    """Points awarded for an order, written by the atomic AwardLoyaltyPoints job."""

    order_id = models.PositiveIntegerField()
    points = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "loyalty entries"

    def __str__(self) -> str:
        return f"{self.points} points for order {self.order_id}"
