"""Seeing what the system does: metrics, fault logs and log digests, clock skew, checkpoint
lag and views (``lag``), the audit, re-fire, the exporter and the check for broken
recurring chains (``chains``). Below the producer and the poller, which report into it."""
