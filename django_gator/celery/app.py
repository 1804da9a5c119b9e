"""The Celery application object: ``app = Celery("proj")``, ``@app.task``, its ``conf``
(the settings this front reads, from ``config_from_object()`` or set directly), the
routes table (``task_routes``) and the eager mode (``task_always_eager``).

Settings this front maps are read; settings that only concern a broker or a result
backend, which django-gator does not have, are accepted and documented as unused; any
other setting is refused, by its name, the first time the configuration is used."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import import_module
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import autodiscover_modules, import_string

from django_gator.celery import canvas
from django_gator.celery import task as task_module
from django_gator.celery.exceptions import NotSupported
from django_gator.validation import short_repr, validate_priority, validate_queue

if TYPE_CHECKING:
    from django_gator.celery import results
    from django_gator.celery.task import BaseTask

#: Settings this front maps, with Celery's defaults (task_default_queue: django-gator's).
MAPPED: dict[str, Any] = {
    "task_routes": None,
    "task_always_eager": False,
    "task_eager_propagates": False,
    "task_default_queue": None,
    "task_default_priority": None,
}
#: Settings that concern only a broker or a result backend, or say what is always so.
UNUSED = re.compile(
    r"(broker_.*|result_backend|result_backend_.*|accept_content|result_accept_content|"
    r"timezone|enable_utc|broker)"
)
#: Settings accepted with one value only (what django-gator always does).
ONE_VALUE = {
    "task_serializer": "json",
    "result_serializer": "json",
    "task_acks_late": True,
    "task_track_started": True,
}


class Settings:
    """``app.conf``: attribute or item access to the settings above. Values set here
    (``app.conf.task_always_eager = True``, ``update()``) win over the configuration
    object's, which is read at each use (so ``override_settings`` applies)."""

    def __init__(self) -> None:
        self._own: dict[str, Any] = {}
        self._source: tuple[Any, str] | None = None
        self._checked = False

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return self[key]
        except KeyError as exc:
            raise AttributeError(exc.args[0]) from None

    def __setattr__(self, key: str, value: Any) -> None:
        if key.startswith("_"):
            object.__setattr__(self, key, value)
        else:
            self.update({key: value})

    def __getitem__(self, key: str) -> Any:
        """A mapped setting, or an accepted one (``broker_url``: as it was given)."""
        if key in MAPPED:
            default = MAPPED[key]
        elif key in ONE_VALUE:
            default = ONE_VALUE[key]
        elif UNUSED.fullmatch(key):
            default = None
        else:
            raise KeyError(f"{key!r} is not a setting django-gator's Celery front reads")
        self.check()
        if key in self._own:
            return self._own[key]
        source = self._object()
        if source is None:
            return default
        return getattr(source, self._name(key), default)

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def update(self, values: dict[str, Any] | None = None, **more: Any) -> None:
        values = {**(values or {}), **more}
        for key, value in values.items():
            check_setting(key, value, key)
        self._own.update(values)

    def load(self, source: Any, namespace: str | None) -> None:
        """Read the settings from ``source`` (an object or its dotted path, resolved at
        first use), each named ``NAMESPACE_KEY`` with a namespace, else ``key``."""
        self._source = (source, f"{namespace}_" if namespace else "")
        self._checked = False

    def _object(self) -> Any:
        if self._source is None:
            return None
        source, prefix = self._source
        if isinstance(source, str):
            source = import_string(source.replace(":", "."))
            self._source = (source, prefix)
        return source

    def _name(self, key: str) -> str:
        assert self._source is not None
        prefix = self._source[1]
        return f"{prefix}{key.upper()}" if prefix else key

    def _all(self) -> dict[str, tuple[str, Any]]:
        """Every setting of the configuration object: ``{key: (its name there, value)}``."""
        source = self._object()
        if source is None:
            return {}
        prefix = self._source[1] if self._source else ""
        found = {}
        for name in dir(source):
            if prefix and name.startswith(prefix) and name.isupper():
                found[name[len(prefix) :].lower()] = (name, getattr(source, name))
            elif not prefix and not name.startswith("_") and name.islower():
                found[name] = (name, getattr(source, name))
        return found

    def check(self) -> None:
        """Refuse, by its name, a setting of the configuration object this front cannot
        honour (once per loaded configuration)."""
        if self._checked:
            return
        for key, (name, value) in self._all().items():
            check_setting(key, value, name)
        self._checked = True


def check_setting(key: str, value: Any, shown: str) -> None:
    if key in MAPPED or UNUSED.fullmatch(key):
        if key == "task_routes" and value is not None:
            routes_table(value)  # raises on a bad table
        return
    if key in ONE_VALUE and value == ONE_VALUE[key]:
        return
    why = (
        f"only {ONE_VALUE[key]!r} is possible here"
        if key in ONE_VALUE
        else "django-gator has no equivalent; see docs/celery.md for its own settings"
    )
    raise NotSupported(f"Celery setting {shown}={short_repr(value)} is not supported: {why}")


def routes_table(routes: Any) -> list[tuple[str, dict[str, Any]]]:
    """``task_routes`` (a dict, or a list of dicts, of task name or glob -> ``{"queue":
    ..., "priority": ...}``) as (pattern, route) pairs, in order; router functions and
    other route keys are refused."""
    tables = routes if isinstance(routes, list | tuple) else [routes]
    pairs = []
    for table in tables:
        if not isinstance(table, dict):
            raise NotSupported(
                f"task_routes: {short_repr(table)} is not supported: give dicts of task name "
                "or glob -> {'queue': ...} (router functions and classes are not mapped)"
            )
        for pattern, route in table.items():
            if isinstance(route, str):
                route = {"queue": route}
            if not isinstance(route, dict) or set(route) - {"queue", "priority"}:
                raise NotSupported(
                    f"task_routes[{pattern!r}]: {short_repr(route)} is not supported: a route "
                    "may set 'queue' and 'priority' (there are no exchanges or routing keys)"
                )
            if "queue" in route:
                validate_queue(route["queue"])
            if "priority" in route:
                validate_priority(route["priority"])
            pairs.append((pattern, route))
    return pairs


class Celery:
    """``Celery("proj")``: the application a Celery project's tasks hang from. Only what
    django-gator can honour is here: ``task``, ``conf``, ``config_from_object``,
    ``autodiscover_tasks``, ``AsyncResult``."""

    def __init__(
        self,
        main: str | None = None,
        broker: str | None = None,
        backend: str | None = None,
        include: list[str] | tuple[str, ...] = (),
        **options: Any,
    ) -> None:
        """``broker`` and ``backend`` are accepted and unused (there is neither);
        ``include``: modules imported when Django's apps are ready, as Celery's worker
        imports them."""
        if options:
            key = next(iter(options))
            raise NotSupported(
                f"Celery({main!r}, {key}=...) is not supported: configure it through "
                "app.conf or config_from_object()"
            )
        self.main = main
        self.conf = Settings()
        self._eager_depth = 0
        self.tasks: dict[str, BaseTask] = {}
        if include:
            self._include(list(include))
        task_module.set_current(self)

    def _include(self, modules: list[str]) -> None:
        from django.apps import apps

        from django_gator import conf

        conf.request_imports(modules)
        if apps.ready:
            for module in modules:
                import_module(module)

    def __repr__(self) -> str:
        return f"<Celery {self.main or '__main__'} on django-gator>"

    def task(self, *args: Any, **options: Any) -> Any:
        """``@app.task`` or ``@app.task(bind=True, queue=...)``: see docs/celery.md."""

        def make(func: Callable[..., Any]) -> BaseTask:
            made = canvas.Task(func, self, options)
            self.tasks[made.name] = made
            return made

        if len(args) == 1 and callable(args[0]) and not options:
            return make(args[0])
        if args:
            raise TypeError(f"@app.task takes keyword options only, got {short_repr(args)}")
        return make

    def config_from_object(self, obj: Any, namespace: str | None = None, **options: Any) -> None:
        """Read this front's settings from ``obj`` (an object, or its dotted path:
        ``"django.conf:settings"``), the names prefixed ``namespace + "_"`` when given."""
        if options:
            raise NotSupported(f"config_from_object({', '.join(options)}=...) is not supported")
        self.conf.load(obj, namespace)

    def autodiscover_tasks(
        self,
        packages: Any = None,
        related_name: str = "tasks",
        force: bool = False,
    ) -> None:
        """Import ``related_name`` from every installed app (or from ``packages``) so that
        their tasks are registered, now if Django's apps are ready, else when they are."""
        from django.apps import apps

        from django_gator import conf

        if packages is not None and not callable(packages):
            self._include([f"{package}.{related_name}" for package in packages])
            return
        conf.request_autodiscover(related_name)
        if apps.ready:
            autodiscover_modules(related_name)

    def send_task(
        self,
        name: str,
        args: Any = None,
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> results.AsyncResult:
        """Dispatch the task registered as ``name`` (``apply_async()``'s options)."""
        from django_gator.registry import get_job_class

        job_class = get_job_class(name)  # JobNotRegistered names close names
        task = getattr(job_class, "celery_task", None)
        if task is None:
            raise NotSupported(
                f"send_task({name!r}): {name} is not a task of the Celery front; "
                f"dispatch it with {name}.dispatch()"
            )
        result: results.AsyncResult = task.apply_async(args, kwargs, **options)
        return result

    def AsyncResult(self, task_id: str | int) -> results.AsyncResult:
        """Celery's name: the result of the task (or canvas) of id ``task_id``."""
        from django_gator.celery.results import AsyncResult

        return AsyncResult(task_id)

    # What tasks ask their app -----------------------------------------------------------

    def _route(self, task: BaseTask) -> dict[str, Any]:
        routes = self.conf.task_routes
        for pattern, route in routes_table(routes) if routes else []:
            if pattern == task.name or fnmatch.fnmatchcase(task.name, pattern):
                return route
        return {}

    def route_queue(self, task: BaseTask, queue: str | None) -> str | None:
        """The queue of a dispatch: ``queue=``, else the task's, else its route's, else
        ``task_default_queue``, else the job class's default."""
        if queue is not None:
            return queue
        if task.queue is not None:
            return task.queue
        return self._route(task).get("queue") or self.conf.task_default_queue

    def route_priority(self, task: BaseTask, priority: int | None) -> int | None:
        if priority is not None or task.priority is not None:
            return priority if priority is not None else task.priority
        routed = self._route(task).get("priority")
        return routed if routed is not None else self.conf.task_default_priority

    @property
    def eager_now(self) -> bool:
        return self._eager_depth > 0 or bool(self.conf.task_always_eager)

    @contextmanager
    def eager(self) -> Iterator[None]:
        self._eager_depth += 1
        try:
            yield
        finally:
            self._eager_depth -= 1

    def finish_dispatch(
        self, job_ids: list[int], result: results.AsyncResult, alias: str | None
    ) -> results.AsyncResult:
        """In eager mode, run the jobs just dispatched (and what they lead to) here."""
        if self.eager_now:
            from django_gator.celery.eager import run_eagerly

            propagate = bool(self.conf.task_eager_propagates)
            run_eagerly(job_ids, propagate=propagate, alias=alias)
        return result


class CurrentApp:
    """``current_app``: stands for the last Celery app created (a default one until then),
    the one ``shared_task``'s tasks read their routes and eager mode from, as Celery's
    proxy does (``current_app.conf.task_always_eager = True``)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(task_module.get_current(), name)

    def __repr__(self) -> str:
        return repr(task_module.get_current())


current_app = CurrentApp()


def shared_task(*args: Any, **options: Any) -> Any:
    """``@shared_task`` or ``@shared_task(bind=True, ...)``: a task of no app in
    particular, which reads the current app's routes and eager mode when dispatched."""
    if len(args) == 1 and callable(args[0]) and not options:
        return canvas.Task(args[0], None, {})
    if args:
        raise TypeError(f"@shared_task takes keyword options only, got {short_repr(args)}")
    return lambda func: canvas.Task(func, None, options)


#: Until a project creates its own app, shared tasks use this one.
DEFAULT_APP = Celery("default")
