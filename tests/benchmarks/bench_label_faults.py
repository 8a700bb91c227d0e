"""A teacher labelling run against a hosted API's faults, killed halfway and resumed: does
every question get labelled once, is every reply paid once and accounted for, and does the
run keep its pace?

The teacher is the test suite's fake OpenAI server (tests/fake_openai_server.py) in this
process, on the issue's fault schedule (tests/fake_openai_faults.py, seed 0):

  - 2 minutes of 429 with `Retry-After: 90`, from 30 s after the first request;
  - 5 % of replies HTTP 500; 2 % of requests hang past the client's timeout (10 s);
  - 1 % of replies JSON cut short;

and `sieverag label` (teacher only, `--scorer none`) runs in a process of its own, with
`--teacher.rpm`, until half the questions are written; then it is killed with SIGKILL and
the same command resumes it. The comparison is the server's own count against the run's:

  requests       every request the server received (429s, faults and retries included);
  paid twice     replies the run received and paid for a second time (`usage.jsonl` lines
                 of one request key beyond the first): the promise is 0;
  lost at kill   replies the server sent to the killed process that it never stored (in
                 flight at the SIGKILL): paid, and asked again by the resumed run;
  questions      lost (in the dataset, not in labels.jsonl) and duplicated (written twice);
  tokens         the ledger's prompt and completion tokens against the server's (which
                 differ by exactly the replies lost at the kill);
  rpm            requests a minute the server saw, in 10 s bins (x time scale, at least 2 s)
                 that hold neither the throttled window (429s until the first reply after
                 it) nor the kill and restart, against `--teacher.rpm` (goal >= 90 %).

    python tests/benchmarks/bench_label_faults.py [--quick] [--questions N] [--rpm 600]
        [--time-scale S]

The default labels 1,000 questions of 2 chunks (2,000 requests at 600 a minute: about 3.5
minutes of requests and 3 of throttling, plus two process starts). `--quick` labels 100 and
shrinks every window and wait by --time-scale 0.1 (a 12 s throttle with Retry-After 9,
timeouts of 2 s): under a minute of requests, plus the two process starts (whose imports
alone took minutes on the 2 shared cores under a load of 30, where --quick took 16 minutes).
Prints a table, then one line of JSON with the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from offline_env import run_offline

run_offline()
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

from fake_openai_faults import FaultSchedule, Throttle, request_tokens  # noqa: E402
from fake_openai_server import FakeOpenAIServer, RecordedRequest, Reply, chat_reply  # noqa: E402

from sieverag.data_gen.teacher import cache_key  # noqa: E402

CHUNKS = 2
MODEL = "teacher-fault-bench"


def write_dataset(path: Path, questions: int) -> list[str]:
    """Synthetic questions, each with a chunk that answers it and one that does not."""
    ids = []
    with path.open("w") as handle:
        for q in range(questions):
            city = ["Vienna", "Lisbon", "Quito", "Oslo", "Lima"][q % 5]
            ctxs = [{"title": f"Person {q}", "text": f"Person {q} was born in {city}. They "
                     f"studied {q % 7 + 2} years of physics."},
                    {"title": "Rivers", "text": f"River {q} is long. It crosses {q % 4 + 1} "
                     "countries before it reaches the sea."}]
            ids.append(f"q{q}")
            handle.write(json.dumps({"id": f"q{q}", "question": f"Where was person {q} born?",
                                     "answers": [city], "ctxs": ctxs[:CHUNKS]}) + "\n")
    return ids


def teacher_reply(request: RecordedRequest) -> Reply:
    """A valid verdict, with token counts from a fake tokenizer (so each reply's differ)."""
    messages = request.json["messages"]
    relevant = "born in" in messages[-1]["content"]
    text = json.dumps({"relevant": relevant, "key_sentences": [1] if relevant else []})
    return Reply(body=chat_reply(text, prompt_tokens=request_tokens(messages),
                                 completion_tokens=math.ceil(len(text) / 4)))


def label_command(dataset: Path, out: Path, base_url: str, args: argparse.Namespace,
                  timeout_s: float) -> list[str]:
    return [sys.executable, "-m", "sieverag.cli", "label", "--dataset", str(dataset),
            "--out", str(out), "--scorer", "none", "--quiet", "--questions-per-step", "32",
            "--teacher.endpoint", base_url, "--teacher.model", MODEL,
            "--teacher.rpm", str(args.rpm), "--teacher.max-concurrency", "32",
            "--teacher.timeout-s", f"{timeout_s:g}",
            "--teacher.backoff-s", f"{max(0.1, args.time_scale):g}",
            "--teacher.price-in", "2.5", "--teacher.price-out", "10"]


def lines(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    found = []
    for line in path.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            pass  # the line the kill tore
    return found


def achieved_rpm(log: list[tuple[float, str]], gaps: list[tuple[float, float]],
                 bin_s: float) -> tuple[float, int]:
    """Requests a minute over the full `bin_s` bins from the first request to the last that
    overlap none of the `gaps`; and how many bins that was."""
    start, end = log[0][0], log[-1][0]
    counts: Counter[int] = Counter(int((t - start) // bin_s) for t, _ in log)
    kept = [b for b in range(int((end - start) // bin_s))
            if not any(start + b * bin_s < gap_end and gap_start < start + (b + 1) * bin_s
                       for gap_start, gap_end in gaps)]
    if not kept:
        return 0.0, 0
    return sum(counts[b] for b in kept) / (len(kept) * bin_s) * 60, len(kept)


def run(args: argparse.Namespace) -> dict:
    scale = args.time_scale
    timeout_s = max(2.0, 10.0 * scale)
    throttle = Throttle(30.0 * scale, 150.0 * scale, retry_after_s=90.0 * scale)
    faults = FaultSchedule(seed=0, throttles=(throttle,), error_share=0.05, hang_share=0.02,
                           hang_s=3 * timeout_s, malformed_share=0.01)
    work = Path(tempfile.mkdtemp(prefix="bench-label-faults-"))
    dataset, out = work / "questions.jsonl", work / "labels"
    ids = write_dataset(dataset, args.questions)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with FakeOpenAIServer(teacher_reply, faults=faults) as server:
        command = label_command(dataset, out, server.base_url, args, timeout_s)
        started = time.monotonic()
        first = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
        while len(lines(out / "labels.jsonl")) < args.questions // 2:
            if first.poll() is not None:
                raise SystemExit(f"the labelling run ended (exit {first.returncode}) before "
                                 "it was killed")
            time.sleep(0.05)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed_at = time.monotonic() - server.started_at
        time.sleep(1.0)  # replies the server was still writing to the killed process
        written_before = len(lines(out / "labels.jsonl"))
        resumed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        elapsed = time.monotonic() - started
        if resumed.returncode != 0:
            raise SystemExit(f"the resumed run failed: {resumed.stderr[-2000:]}")
        log = list(faults.log)
        served = list(server.served)
        tokens_served = Counter(server.tokens_served)
        requests_sent = len(server.requests)
    labels = lines(out / "labels.jsonl")
    written = Counter(r["question_id"] for r in labels)
    ledger = lines(out / "usage.jsonl")
    ledger_keys = Counter(line["key"] for line in ledger)
    served_keys = Counter(cache_key(r.json["model"], r.json["messages"]) for r, _ in served)
    paid_twice = sum(count - 1 for count in ledger_keys.values() if count > 1)
    lost_at_kill = sum(max(0, count - ledger_keys[key]) for key, count in served_keys.items())
    ledger_tokens = {name: sum(line[name] for line in ledger)
                     for name in ("prompt_tokens", "completion_tokens")}
    # The throttled window: from its first 429 to the first reply after its last one.
    throttled = [t for t, what in log if what == "429"]
    after = [t for t, what in log if what == "ok" and throttled and t > throttled[-1]]
    restart = [t for t, _ in log if t > killed_at]
    gaps = [(throttled[0], after[0] if after else throttled[-1])] if throttled else []
    gaps.append((killed_at - 1.0, restart[0] if restart else killed_at))
    rpm, bins = achieved_rpm(log, gaps, bin_s=max(2.0, 10.0 * scale))
    summary = json.loads((out / "summary.json").read_text())
    return {
        "questions": args.questions, "requests_per_question": CHUNKS,
        "time_scale": scale, "rpm_set": args.rpm, "seconds": round(elapsed, 1),
        "requests_sent": requests_sent, "faults": dict(faults.faults),
        "written_before_kill": written_before,
        "replies_served": len(served), "ledger_replies": len(ledger),
        "replies_paid_twice": paid_twice, "replies_lost_at_kill": lost_at_kill,
        "questions_lost": len(set(ids) - set(written)),
        "questions_duplicated": sum(1 for count in written.values() if count > 1),
        "server_prompt_tokens": tokens_served["prompt_tokens"],
        "server_completion_tokens": tokens_served["completion_tokens"],
        "ledger_prompt_tokens": ledger_tokens["prompt_tokens"],
        "ledger_completion_tokens": ledger_tokens["completion_tokens"],
        "ledger_cost_usd": summary["teacher"]["ledger"]["cost_usd"],
        "rpm_achieved": round(rpm, 1), "rpm_share": round(rpm / args.rpm, 3),
        "rpm_bins": bins,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="100 questions, every window and wait x 0.1")
    parser.add_argument("--questions", type=int, default=None)
    parser.add_argument("--rpm", type=int, default=600, help="--teacher.rpm of the run")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="multiply the throttle window, Retry-After, timeouts and "
                             "backoff by this (default 1; --quick 0.1)")
    args = parser.parse_args()
    args.questions = args.questions or (100 if args.quick else 1000)
    args.time_scale = args.time_scale or (0.1 if args.quick else 1.0)
    figures = run(args)
    rows = [
        ("questions (x 2 chunks)", figures["questions"], ""),
        ("requests sent (all attempts)", figures["requests_sent"],
         ", ".join(f"{k} {v}" for k, v in sorted(figures["faults"].items()))),
        ("written before SIGKILL", figures["written_before_kill"], ""),
        ("questions lost / duplicated",
         f"{figures['questions_lost']} / {figures['questions_duplicated']}", "goal 0 / 0"),
        ("replies paid twice", figures["replies_paid_twice"], "goal 0"),
        ("replies lost in flight at SIGKILL", figures["replies_lost_at_kill"],
         "served to the killed process, asked again"),
        ("replies served / in ledger", f"{figures['replies_served']} / "
         f"{figures['ledger_replies']}", ""),
        ("prompt tokens server / ledger", f"{figures['server_prompt_tokens']} / "
         f"{figures['ledger_prompt_tokens']}", ""),
        ("completion tokens server / ledger", f"{figures['server_completion_tokens']} / "
         f"{figures['ledger_completion_tokens']}", ""),
        ("ledger dollars ($2.5 / $10 per M)", figures["ledger_cost_usd"], ""),
        ("rpm outside the throttle", f"{figures['rpm_achieved']} of {figures['rpm_set']} "
         f"({figures['rpm_share']:.0%})", f"{figures['rpm_bins']} bins; goal >= 90 %"),
        ("wall seconds", figures["seconds"], f"time scale {figures['time_scale']:g}"),
    ]
    print("fault schedule: 2 min of 429 (Retry-After 90 s), 5 % 500, 2 % hangs past the "
          "timeout, 1 % JSON cut short, SIGKILL at half, then resumed (x time scale); load "
          f"average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    width = max(len(name) for name, _, _ in rows)
    for name, value, note in rows:
        print(f"{name:<{width}}  {value!s:>22}  {note}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
