"""``scheduler console``: a web console over the fleet, buckets, jobs, recurring
schedules, dead letters and the audit.

Server-rendered (Starlette and Jinja2; htmx, vendored as one static file, refreshes the
fleet page in place): no JavaScript build. Every page reads through the library calls
the CLI views use (``observe``, ``audit``, ``Client``) and is bounded: a page reads at
most a fixed number of rows whatever the keyspace holds. Read-only unless started with
``--allow-actions`` and a token (``guard.py``).
"""
