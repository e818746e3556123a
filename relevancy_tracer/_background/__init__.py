"""The background machinery shared by tracing and the scoring service (internal).

:mod:`.loop`: the process's one asyncio loop on a daemon thread; :mod:`.jobqueue`: the bounded
job queue whose jobs run on it; :mod:`.fork`: the one ``os.register_at_fork`` hook that renews
locks, threads, loops and clients in a forked child. Imports nothing above it but the package's
leaf modules (``result``, ``_logging``).
"""
