"""The insertion pipeline: the one path by which jobs enter the database.

Every insert of jobs that a caller asks for (``dispatch``, ``dispatch_many``, a batch's
members, a chain, a workflow) takes the same steps, in this order, so none can skip one:

1. **validate -> rows**: the options and arguments are checked and encoded, with no
   database access (:mod:`~django_gator.pipeline.encoding` for one dispatch call,
   :class:`~django_gator.workflows.Workflow` and :mod:`~django_gator.pipeline.workflow`
   for a workflow), into an :class:`~django_gator.pipeline.core.Insert`;
2. **now, or at the caller's commit** (``on_commit``): deferred, the INSERT is retried and,
   if it still fails, what it held is logged and ``dispatch_failed`` is sent
   (:mod:`~django_gator.pipeline.deferred`);
3. **a dispatch span** (:func:`django_gator.tracing.traced_dispatch`);
4. **the engine's INSERT** (``insert_rows``, ``insert_unique`` with the deadlock retry of
   :mod:`django_gator.engines.deadlocks`, ``insert_workflow``): no other module of the
   package outside ``engines/`` calls these (tests/test_layers.py checks it);
5. **the wakeup** of idle workers of the queues made due, by the engine's INSERT (its
   ``notify``): NOTIFY in the INSERT's transaction on PostgreSQL, a datagram once it
   commits on SQLite and MariaDB/MySQL (:mod:`django_gator.wakeup`), as for the rows an
   outcome inserts;
6. **``job_dispatched``**, the log line, and GATOR_IMMEDIATE's run.

:func:`~django_gator.pipeline.core.submit` runs steps 2 to 6. Rows an outcome inserts in
its own transaction (a chain's next step released, a batch's callbacks) are the engine's
part of that outcome write, not a dispatch.
"""
