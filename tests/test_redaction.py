"""Redaction of secret arguments: keys at any depth, positional parameters, values in text."""

from __future__ import annotations

from django.test import override_settings

from django_gator.redaction import MASK, mask_text, redact_payload, redact_value, secret_values
from tests.testapp.jobs import FailsFirstTime, Noop


def test_keys_are_masked_at_any_depth_without_case():
    value = {"user": {"Password": "p4ss", "name": "ann"}, "items": [{"token": "t0k3n"}]}
    assert redact_value(value, frozenset({"password", "token"})) == {
        "user": {"Password": MASK, "name": "ann"},
        "items": [{"token": MASK}],
    }


def test_positional_arguments_are_masked_by_parameter_name():
    args, kwargs = redact_payload(FailsFirstTime.name, ["ann", "1234", "p4ssw0rd"], {})
    assert args == ["ann", MASK, MASK]  # pin (class redact) and password (GATOR_REDACT)
    assert kwargs == {}


def test_secret_values_are_masked_inside_text():
    secrets = secret_values(FailsFirstTime.name, ["ann"], {"password": "p4ssw0rd", "pin": "12"})
    assert secrets == ["p4ssw0rd"]  # values under 4 characters are not searched for in text
    assert mask_text("bad password p4ssw0rd for ann", secrets) == f"bad password {MASK} for ann"


@override_settings(GATOR_REDACT=["account"])
def test_the_setting_replaces_the_default_list():
    assert redact_payload(Noop.name, [], {"account": "a-1", "password": "shown"}) == (
        [],
        {"account": MASK, "password": "shown"},
    )
