#!/usr/bin/python3
"""Step time of a job whose daemons are scraped every second vs. the same job unscraped.

Starts a pipetrain-coordinator and --workers pipetrain-worker processes (bench/local_cluster.py)
and runs the same job under them --repeats times each way, interleaved (which side goes
first alternates):
  scraped    a thread GETs /metrics of the coordinator and of every worker every
             --interval seconds while the job runs (as a Prometheus server would);
  unscraped  nothing reads /metrics.
With --scrapers K (K > 1) and --interval 0, K threads each scrape every daemon as fast as
they can: a hostile or broken scraper, which the endpoint's spacing (one scrape started per
100 ms per process, metrics/endpoint.h) keeps from slowing the job.
The job: the default GPT (d_model 64, 4 blocks), 1F1B, p = --workers stages, m = 8, b = 8,
--steps steps, one intra-op thread per rank. Step time: tokens per step / tokens_per_s of
the job record (rank 0's mean from step 0 to the last). "ratio" is the median over repeats
of scraped / unscraped, each scraped run against the unscraped run next to it (aim: <= 1.01).
Markdown on stdout, progress on stderr. Standard library only.

Run:  /usr/bin/python3 bench/scrape_overhead.py [--build build] [--repeats 6] [--steps 60]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import LocalCluster  # noqa: E402

SPEC = """model: {{name: gpt, d_model: 64, n_heads: 4, n_layers: 4}}
data: {{kind: synthetic, vocab: 64, seq_len: 32}}
schedule: 1f1b
stages: {p}
microbatches: 8
microbatch_size: 8
steps: {steps}
threads_per_stage: 1
"""


def scrape_until(stop, addresses, interval, counts, lock):
    while not stop.is_set():
        for address in addresses:
            try:
                with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
                    n = len(r.read())
            except OSError:
                continue
            with lock:
                counts["bytes"] += n
                counts["scrapes"] += 1
        if interval > 0:
            stop.wait(interval)


def run(cluster, spec_path, p, scraped, interval, scrapers=1):
    cluster.wait_for_idle_workers(p)
    stop = threading.Event()
    counts = {"scrapes": 0, "bytes": 0}
    lock = threading.Lock()
    threads = [threading.Thread(target=scrape_until,
                                args=(stop, cluster.metrics_addresses(), interval, counts, lock))
               for _ in range(scrapers)]
    if scraped:
        for t in threads:
            t.start()
    done = cluster.cli(["submit", spec_path, "--follow", "-o", "json"])
    stop.set()
    if scraped:
        for t in threads:
            t.join()
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    job = json.loads(cluster.cli(["status", records[-1]["id"], "-o", "json"]).stdout)
    if job.get("state") != "JOB_STATE_SUCCEEDED":
        raise SystemExit(f"job failed: {job.get('message')}")
    return 8 * 8 * 32 / job["tokens_per_s"], counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--scrapers", type=int, default=1)
    args = parser.parse_args()
    p = args.workers
    times = {"scraped": [], "unscraped": []}
    ratios, scrapes, scraped_bytes = [], 0, 0
    with LocalCluster(args.build, p) as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.wait_for_idle_workers(p)
        spec_path = os.path.join(tmp, "job.yaml")
        with open(spec_path, "w") as f:
            f.write(SPEC.format(p=p, steps=args.steps))
        run(cluster, spec_path, p, False, args.interval)  # warm-up, not counted
        for repeat in range(args.repeats):
            sides = ["scraped", "unscraped"] if repeat % 2 == 0 else ["unscraped", "scraped"]
            pair = {}
            for side in sides:
                t, counts = run(cluster, spec_path, p, side == "scraped", args.interval,
                                args.scrapers)
                pair[side] = t
                times[side].append(t)
                scrapes += counts["scrapes"]
                scraped_bytes += counts["bytes"]
                print(f"[{repeat + 1}/{args.repeats}] {side}: {t * 1e3:.1f} ms/step",
                      file=sys.stderr)
            ratios.append(pair["scraped"] / pair["unscraped"])
    print(f"| layout | scrapers | steps | unscraped ms/step | scraped ms/step |"
          f" ratio (median of pairs) | scrapes | bytes per scrape |")
    print("|---|---|---|---|---|---|---|---|")
    who = (f"{args.scrapers} x as fast as they can" if args.interval <= 0
           else f"{args.scrapers} x every {args.interval:g} s")
    print(f"| {p} stages, {p} workers | {who} | {args.steps} | "
          f"{statistics.median(times['unscraped']) * 1e3:.1f} | "
          f"{statistics.median(times['scraped']) * 1e3:.1f} | {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}) | {scrapes} | "
          f"{scraped_bytes // max(1, scrapes)} |")


if __name__ == "__main__":
    main()
