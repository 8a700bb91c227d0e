"""The training part's commands, found by import path from the `sieverag` command table
(sieverag/cli.py): `train` (train, eval-filter, filter fit-combination) and `filter` (filter
list / install / package). Nothing here is imported at start-up; `sieverag --help` imports
none of them.
"""
