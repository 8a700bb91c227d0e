"""Start-up benchmark: `sieverag --help` from the command table against importing every
command's module (what a CLI built by importing each part's parser pays, as sieverag's did).

Run directly (never collected by pytest):

    python tests/benchmarks/bench_cli_start.py            # 5 alternating rounds
    python tests/benchmarks/bench_cli_start.py --quick    # 2 rounds

Each round starts two fresh interpreters, alternating which goes first:
* `table` — `python -m sieverag --help`: lists the commands from `sieverag.cli.COMMANDS`
  without importing any of them;
* `import-all` — `python -c "import <every module COMMANDS names>"`: the cost of a parser
  that imports each command's code (its configs, hence torch) to list the commands.
Also checked: whether torch was imported by `sieverag --help`. Prints the median seconds
of each and their ratio, then one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from sieverag.cli import COMMANDS


def _seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds instead of 5")
    rounds = 2 if parser.parse_args().quick else 5
    modules = sorted({c.settings.partition(":")[0] for c in COMMANDS.values()})
    table = [sys.executable, "-m", "sieverag", "--help"]
    import_all = [sys.executable, "-c", "; ".join(f"import {m}" for m in modules)]
    times: dict[str, list[float]] = {"table": [], "import-all": []}
    for round_ in range(rounds):
        order = [("table", table), ("import-all", import_all)]
        for name, argv in order if round_ % 2 == 0 else reversed(order):
            times[name].append(_seconds(argv))
    probe = ("import sys, contextlib, io\nfrom sieverag.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()): main(['--help'])\n"
             "print('torch' in sys.modules)")
    torch_loaded = subprocess.run([sys.executable, "-c", probe], check=True,
                                  capture_output=True, text=True).stdout.strip() == "True"
    table_s, import_s = (statistics.median(times[k]) for k in ("table", "import-all"))
    print(f"{'start-up':<32}{'median s':>10}   ({rounds} rounds, alternating)")
    print(f"{'sieverag --help (table)':<32}{table_s:>10.3f}")
    print(f"{'import every command module':<32}{import_s:>10.3f}")
    print(f"ratio {import_s / table_s:.1f}x; torch imported by --help: {torch_loaded}")
    print(json.dumps({"help_s": round(table_s, 3), "import_all_s": round(import_s, 3),
                      "ratio": round(import_s / table_s, 1),
                      "help_imports_torch": torch_loaded}))


if __name__ == "__main__":
    main()
