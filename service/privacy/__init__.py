"""Pure privacy math: RDP curves of each mechanism, composition, conversion, calibration.

Nothing here imports FastAPI, SQLAlchemy or Redis; the ledger stores what these functions compute.
"""
