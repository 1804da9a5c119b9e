"""Imported by the fork server of isolated attempts (see :mod:`.isolation`) before it forks
any child: it sets Django up (settings, apps, every job module), once, so that each child
starts ready. In a process where Django is set up already, importing it does nothing."""

from __future__ import annotations

import django
from django.apps import apps

if not apps.ready:
    django.setup()
