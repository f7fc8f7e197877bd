"""Diagnosis accuracy on every emulator scenario, through the real scrape -> store -> diagnose path.

    python3 bench/diagnosis_matrix.py                # 3 seeds x (vLLM, TGI), ~2 minutes
    python3 bench/diagnosis_matrix.py --seeds 1 --quick

The emulated engines run in a child process (so they do not share the monitor's GIL),
each on its own loopback port, sped up ``--time-scale`` times. The monitor is the real
service (``app.main.create_app``): it scrapes every target over HTTP each second, stores
the samples in SQLite and is asked for a diagnosis every ``--eval-interval`` (simulated)
seconds. Every scrape's outcome is counted, so a run whose targets could not be scraped
says so instead of reporting "insufficient data".

Prints
* a confusion matrix: one row per scenario (expected label), one column per verdict
  (the primary finding, ``healthy`` or ``insufficient_data``) taken at the end of the
  steady phase, summed over seeds and engines;
* for each transition scenario (``healthy->REGIME``): the detection latency, counted in
  evaluation intervals from the moment of the switch to the first evaluation whose
  primary finding is REGIME, and to the evaluation where that finding became active.

Targets: every regime scenario gets its own label as the primary finding; ``healthy``
and ``healthy_bursty`` get no finding; detection within three evaluation intervals.
Window and thresholds are the service defaults expressed in simulated time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from app.emulator import scenarios  # noqa: E402

STEADY = ["healthy", "healthy_bursty", "queueing", "prefill_compute", "prefill_interference", "bandwidth_bound",
          "kv_cache_pressure", "weights_offloaded"]
REGIMES = STEADY[2:]
VERDICTS = ["healthy", *REGIMES, "insufficient_data"]
WARMUP = 60.0  # simulated seconds run before serving


def serve_fleet(specs: list[dict], conn) -> None:  # child process
    from app.emulator.server import EmulatorFleet, TargetSpec

    with EmulatorFleet([TargetSpec(**s) for s in specs], ready_timeout=120) as fleet:
        conn.send(fleet.urls)
        conn.recv()  # wait for "stop"


def hardware_of(spec: str) -> dict:
    dep = scenarios.resolve(spec).phases[-1][1].deployment
    return {"gpu": dep.gpu.name, "model": dep.model.name, "weight_dtype": dep.weight_dtype}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--engines", default="vllm,tgi")
    parser.add_argument("--time-scale", type=float, default=5.0)
    parser.add_argument("--scrape-interval", type=float, default=10.0, help="simulated seconds between scrapes")
    parser.add_argument("--steady", type=float, default=180.0, help="simulated seconds observed")
    parser.add_argument("--switch", type=float, default=60.0, help="simulated seconds after warm-up when "
                                                                    "transition scenarios switch")
    parser.add_argument("--eval-interval", type=float, default=20.0, help="simulated seconds between evaluations")
    parser.add_argument("--window", type=float, default=45.0, help="simulated seconds each evaluation looks at")
    parser.add_argument("--quick", action="store_true", help="1 seed, vLLM only")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.engines = 1, "vllm"
    engines = args.engines.split(",")
    ts = args.time_scale

    specs, expected = [], {}
    for engine in engines:
        for seed in range(args.seeds):
            for scenario in STEADY:
                name = f"{engine}-{scenario}-{seed}".replace("_", "-")
                specs.append(dict(name=name, scenario=scenario, engine=engine, seed=seed, time_scale=ts,
                                  warmup_s=WARMUP))
                expected[name] = ("steady", scenario)
            for regime in REGIMES:
                spec = f"healthy->{regime}@{WARMUP + args.switch:g}"
                name = f"{engine}-to-{regime}-{seed}".replace("_", "-")
                specs.append(dict(name=name, scenario=spec, engine=engine, seed=100 + seed, time_scale=ts,
                                  warmup_s=WARMUP))
                expected[name] = ("transition", regime)

    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=serve_fleet, args=(specs, child), daemon=True)
    proc.start()
    urls = parent.recv()
    fleet_started = time.time()  # the steady phase is timed from here
    print(f"{len(specs)} emulated targets up (time scale {ts:g}x)", file=sys.stderr)

    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    interval_real = args.eval_interval / ts
    scrape_real = args.scrape_interval / ts
    with tempfile.TemporaryDirectory() as tmp:
        config = {
            "targets": [{"name": s["name"], "url": urls[s["name"]] + "/metrics", "scrape_interval": scrape_real,
                         "scrape_timeout": 0.9 * scrape_real, "hardware": hardware_of(s["scenario"])} for s in specs],
            "diagnosis": {"interval": "1h", "window": args.window / ts},  # evaluated by this script
        }
        config_path = Path(tmp) / "targets.yaml"
        config_path.write_text(yaml.safe_dump(config))
        settings = Settings(data_dir=Path(tmp), config_file=config_path, default_scrape_interval=scrape_real,
                            default_scrape_timeout=0.9 * scrape_real, write_batch_interval=0.25, summary_interval=3600,
                            max_concurrent_scrapes=128)
        app = create_app(settings)
        timeline: dict[str, list[tuple[float, str, list]]] = defaultdict(list)
        with TestClient(app):
            monitor = app.state.monitor
            end = fleet_started + args.steady / ts
            next_eval = time.time() + interval_real
            while time.time() < end:
                time.sleep(max(0.0, next_eval - time.time()))
                now = time.time()
                for diagnosis, transitions in monitor.evaluate_diagnoses(now=now):
                    timeline[diagnosis.target].append((now, diagnosis.verdict, transitions))
                next_eval += interval_real
            # each emulated clock, read from its ground truth: simulated time = offset + real time * scale
            import httpx

            offsets = {}
            with httpx.Client(timeout=10) as client:
                for name in urls:
                    real = time.time()
                    offsets[name] = client.get(urls[name] + "/emulator/state").json()["sim_time_s"] - real * ts
            with monitor.sessions() as session:
                from sqlalchemy import func, select

                from app.store.models import Scrape
                ok, failed = (session.scalar(select(func.count()).select_from(Scrape).where(Scrape.up.is_(up)))
                              for up in (True, False))
        parent.send("stop")
        proc.join(30)
        print(f"scrapes: {ok} ok, {failed} failed", file=sys.stderr)

    timeline = {name: [(offsets[name] + t * ts, v, tr) for t, v, tr in events]
                for name, events in timeline.items()}
    matrix: dict[str, Counter] = defaultdict(Counter)
    detection: dict[str, list] = defaultdict(list)
    for name, (kind, label) in expected.items():
        events = timeline.get(name, [])
        if kind == "steady":
            final = events[-1][1] if events else "insufficient_data"
            matrix[label][final] += 1
        else:
            switch = WARMUP + args.switch
            first = next((t for t, v, _ in events if t > switch and v == label), None)
            active = next((t for t, _, tr in events if t > switch and any(x["regime"] == label and x["state"] ==
                                                                         "active" for x in tr)), None)
            wrong = [(round(t), v) for t, v, _ in events if t <= switch and v not in ("healthy", "insufficient_data")]
            if wrong:
                print(f"{name}: findings before the switch at {switch:g} s: {wrong}", file=sys.stderr)
            wrong_before = len(wrong)
            detection[label].append((None if first is None else (first - switch) / args.eval_interval,
                                     None if active is None else (active - switch) / args.eval_interval,
                                     wrong_before))

    print(f"\n## Confusion matrix ({args.seeds} seed(s) x {', '.join(engines)}; verdict after "
          f"{args.steady:g} simulated s; window {args.window:g} s, evaluation every {args.eval_interval:g} s)\n")
    print("| scenario \\ verdict | " + " | ".join(VERDICTS) + " | correct |")
    print("|---|" + "---|" * (len(VERDICTS) + 1))
    total = correct = 0
    for scenario in STEADY:
        want = "healthy" if scenario.startswith("healthy") else scenario
        row = matrix[scenario]
        n = sum(row.values())
        total += n
        correct += row[want]
        print(f"| {scenario} | " + " | ".join(str(row[v]) if row[v] else "." for v in VERDICTS) + f" | {row[want]}/{n} |")
    print(f"\nAccuracy: {correct}/{total}")
    print("\n## Detection latency after healthy -> regime (in evaluation intervals; target <= 3)\n")
    print("| regime | first fired (per run) | active (per run) | false findings before the switch | within 3 |")
    print("|---|---|---|---|---|")
    all_ok = correct == total
    for regime in REGIMES:
        runs = detection[regime]
        fmt = lambda xs: ", ".join("never" if x is None else f"{x:.1f}" for x in xs)  # noqa: E731
        ok = all(f is not None and f <= 3 for f, _, _ in runs)
        all_ok &= ok and all(w == 0 for _, _, w in runs)
        print(f"| {regime} | {fmt([r[0] for r in runs])} | {fmt([r[1] for r in runs])} | "
              f"{sum(r[2] for r in runs)} | {'PASS' if ok else 'MISS'} |")
    print(f"\nOverall: {'PASS' if all_ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
