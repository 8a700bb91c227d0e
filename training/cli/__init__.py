"""The training part's commands, one module per job, found by import path from the `sieverag`
command table (sieverag/cli.py): `train` (train), `eval_filter` (eval-filter), `filter` (the
`filter` group: filter list / install / package / fit-combination). Nothing here is imported
at start-up; `sieverag --help` imports none of them.
"""
