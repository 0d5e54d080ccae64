"""Race drills: exercise the stop path against each mechanism and prove nothing is lost.

`run_drills()` runs each drill (`catalogue.DRILLS`) against each configured mechanism that has a
driver (its folder's `drill.py`, `drivers.driver_class`), on the sandbox, inspects the ledger and the external systems
(`checks`), stores a `DrillRun`, and returns a `Report`; `report.table()` prints it and
`reliability.write()` turns a run into docs/RELIABILITY.md. `manage.py stopdrill` is the door.
"""
