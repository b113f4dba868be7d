"""Processes: ``run_poller`` (``runner``), a fleet member (``member``), the supervisor of
``--processes N`` (``supervisor``) and the no-server demo (``demo``)."""
