"""HTTP load generation against a running service: what ``python -m service loadtest`` drives.

A run measures ``/healthz`` (what the framework alone can do) and the query workloads in one
go, so their ratios hold on a noisy machine. Two drivers send the same workloads: ``wrk``
(a C load generator scripted in Lua; the default when it is installed) and an asyncio
``httpx`` generator (always available, heavier on the CPU it shares with the server).
"""
