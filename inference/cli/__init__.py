"""The inference part's commands, one module per group, found by import path from the
`sieverag` command table (sieverag/cli.py): `run` (eval, ask, demo, trace, report, export,
judge-sweep), `index` (index build / search, eval-retrieval, hard-negatives). The `filter`
group is the training part's (`training/cli/filter.py`: its fit-combination runs training's
fits). Nothing here is imported at start-up; `sieverag --help` imports none of them.
"""
