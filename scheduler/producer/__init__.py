"""Writing jobs: the producer's rules as effects (``producer``: placement, late writes,
retries), slow-write repair, nudges to owners (``nudger``, ``wire``), occurrences of
recurring schedules, ``Client.recurring``, and the public ``Client`` and ``AsyncClient``."""
