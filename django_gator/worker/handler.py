"""Calling a job's ``handle()``: through the middleware, awaited when it is ``async def``."""

from __future__ import annotations

import inspect
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, sync_to_async

from django_gator import conf
from django_gator.joblogs import capturing
from django_gator.queueable import Queueable


def call_handle(instance: Queueable) -> Any:
    """``handle()`` wrapped in the middleware of ``GATOR_MIDDLEWARE`` (outermost first),
    then the class's own."""
    journal = instance._gator_journal
    if journal is not None and journal.logs is not None:
        with capturing(journal.logs):  # this thread's records
            return _call_layers(instance)
    return _call_layers(instance)


def _call_layers(instance: Queueable) -> Any:
    layers = [*conf.middleware(), *type(instance).middleware]
    if not layers:
        return _handle(instance)

    def call(index: int) -> Any:
        if index == len(layers):
            return _handle(instance)
        layer = layers[index]
        if iscoroutinefunction(layer):  # an async middleware: its call_next is awaitable
            rest = sync_to_async(call, thread_sensitive=True)
            return async_to_sync(layer)(instance, lambda: rest(index + 1))
        return layer(instance, lambda: call(index + 1))

    return call(0)


def _handle(instance: Queueable) -> Any:
    """Call ``handle()``; an ``async def`` handler is awaited to completion here, in this
    thread's own event loop (asgiref's async_to_sync), so its body really runs and its
    ORM calls (through sync_to_async) use this thread's connection."""
    result = instance.handle(*instance.args, **instance.kwargs)
    if inspect.isawaitable(result):
        if instance._gator_journal is not None:
            # Read now: no database call can be made from the loop it is awaited in.
            instance._gator_journal.start_state()
        result = async_to_sync(_awaited)(result)
    return result


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
