"""The HTTP API for producers (``scheduler api``): the same rules, errors and idempotency as
``Client``, over HTTP, for any language."""
