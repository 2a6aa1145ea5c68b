"""The admin-only per-edge exposure report (``python -m service ledger edge-report``).

Data-dependent figures live here and in :mod:`service.privacy.per_edge` only. Nothing on the
serving path (the API, admission, calibration, the engine) imports either; the report is read
by an admin on the command line, never served, logged, stored or used to admit or charge.
"""
