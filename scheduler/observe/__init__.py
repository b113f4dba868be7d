"""Seeing what the system does: metrics, fault logs and log digests, clock skew, checkpoint
lag and views (``lag``), the audit, re-fire, the exporter and the check for broken
recurring chains (``chains``), traces (``tracing``, ``attempts``: OpenTelemetry, optional).
Below the producer and the poller, which report into it."""
