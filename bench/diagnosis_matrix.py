"""Diagnosis accuracy on every emulator scenario, through the real scrape -> store -> diagnose path.

    python3 bench/diagnosis_matrix.py                # 3 seeds x (vLLM, TGI, SGLang, TensorRT-LLM)
    python3 bench/diagnosis_matrix.py --seeds 1 --engines sglang,trtllm
    python3 bench/diagnosis_matrix.py --seeds 1 --quick
    python3 bench/diagnosis_matrix.py --offline      # no HTTP: for a loaded machine (see below)

The emulated engines run in a child process (so they do not share the monitor's GIL),
each on its own loopback port, sped up ``--time-scale`` times. The monitor is the real
service (``app.main.create_app``): it scrapes every target over HTTP each second, stores
the samples in SQLite and is asked for a diagnosis every ``--eval-interval`` (simulated)
seconds. Every scrape's outcome is counted, so a run whose targets could not be scraped
says so instead of reporting "insufficient data".

Prints
* a confusion matrix: one row per scenario (expected label), one column per verdict
  (the primary finding, ``healthy`` or ``insufficient_data``) taken at the end of the
  steady phase, summed over seeds and engines. ``healthy`` and ``healthy_bursty`` are
  judged on *every* evaluation instead: a run counts as healthy only if no evaluation had
  a finding (pending or active), otherwise under the regime of its first false finding;
* for the healthy scenarios: how many evaluations had a (false) finding, per run;
* for each transition scenario (``healthy->REGIME``): the detection latency, counted in
  evaluation intervals from the moment of the switch to the first evaluation whose
  primary finding is REGIME, and to the evaluation where that finding became active.

A regime whose rule could not be judged on an engine (the engine does not export what the
rule reads: trtllm-serve has no per-step ITL histogram, for example) is counted in the
``not_judged`` column, never as healthy and never as correct; accuracy is over the runs
whose engine exposes the regime's signals, and a per-engine table shows which those are.

``--offline`` runs the same scenarios without HTTP or wall-clock time: each emulator is advanced
on its own simulated clock, its page is rendered and processed in-process every scrape interval
(``PageProcessor`` -> store -> signals -> rules -> lifecycle, the service's path after the
fetch), and evaluated every evaluation interval. On a machine too loaded for real-time
emulation (scrapes that time out turn every verdict into ``insufficient_data``) it still
measures the diagnosis; it does not measure the scraper.

Targets: every regime scenario gets its own label as the primary finding; ``healthy``
and ``healthy_bursty`` get no finding at any evaluation; detection within three
evaluation intervals. Window, evaluation interval and thresholds are the service
defaults (``diagnosis.window`` 60 s, ``diagnosis.interval`` 30 s) in simulated time: a
regime is seen once the window holds little of the previous phase, i.e. 2-3 intervals
after a switch with a window of two intervals (with 45 s / 20 s it would be 2.25-3.25,
and the target would depend on where the evaluations fall). Exits 1 when any target is
missed (the last line says ``MISS``).
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

import yaml

from app.config import DiagnosisConfig
from app.emulator import scenarios
from app.targets import repository as target_repository

STEADY = ["healthy", "healthy_bursty", "queueing", "prefill_compute", "prefill_interference", "bandwidth_bound",
          "kv_cache_pressure", "weights_offloaded", "kv_transfer", "speculation_ineffective", "dp_imbalance",
          "frontend_bound", "scheduler_cpu_bound", "lora_adapter_slots"]
REGIMES = STEADY[2:]
#: Regimes whose signals only some engines export: a scenario runs on the engines whose page carries
#: them. TGI has no P/D transfer, speculative-decoding, data-parallel or render metrics; trtllm-serve
#: labels no data-parallel rank; only vLLM (0.34) times the front end's rendering; only SGLang (0.5.20+)
#: accounts its scheduler's time; only vLLM says which LoRA adapters are in demand.
EXPOSED_BY = {"kv_transfer": {"vllm", "sglang", "trtllm"}, "speculation_ineffective": {"vllm", "sglang", "trtllm"},
              "dp_imbalance": {"vllm", "sglang"}, "frontend_bound": {"vllm"}, "scheduler_cpu_bound": {"sglang"},
              "lora_adapter_slots": {"vllm"}}
VERDICTS = ["healthy", *REGIMES, "insufficient_data", "not_judged"]
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
    parser.add_argument("--engines", default="vllm,tgi,sglang,trtllm")
    parser.add_argument("--time-scale", type=float, default=5.0)
    parser.add_argument("--scrape-interval", type=float, default=10.0, help="simulated seconds between scrapes")
    parser.add_argument("--steady", type=float, default=180.0, help="simulated seconds observed")
    parser.add_argument("--switch", type=float, default=60.0, help="simulated seconds after warm-up when "
                                                                    "transition scenarios switch")
    defaults = DiagnosisConfig()  # the service's diagnosis.interval and diagnosis.window
    parser.add_argument("--eval-interval", type=float, default=defaults.interval,
                        help="simulated seconds between evaluations")
    parser.add_argument("--window", type=float, default=defaults.window,
                        help="simulated seconds each evaluation looks at")
    parser.add_argument("--quick", action="store_true", help="1 seed, vLLM only")
    parser.add_argument("--offline", action="store_true", help="simulated clocks, pages processed in-process")
    parser.add_argument("--only", default="", help="comma-separated scenarios (default: all)")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.engines = 1, "vllm"
    engines = args.engines.split(",")
    ts = args.time_scale
    only = set(args.only.split(",")) - {""}

    specs, expected = [], {}
    for engine in engines:
        for seed in range(args.seeds):
            for scenario in STEADY:
                if engine not in EXPOSED_BY.get(scenario, {engine}) or (only and scenario not in only):
                    continue
                name = f"{engine}-{scenario}-{seed}".replace("_", "-")
                specs.append(dict(name=name, scenario=scenario, engine=engine, seed=seed, time_scale=ts,
                                  warmup_s=WARMUP))
                expected[name] = ("steady", scenario, engine)
            for regime in REGIMES:
                if engine not in EXPOSED_BY.get(regime, {engine}) or (only and regime not in only):
                    continue
                spec = f"healthy->{regime}@{WARMUP + args.switch:g}"
                name = f"{engine}-to-{regime}-{seed}".replace("_", "-")
                specs.append(dict(name=name, scenario=spec, engine=engine, seed=100 + seed, time_scale=ts,
                                  warmup_s=WARMUP))
                expected[name] = ("transition", regime, engine)

    if args.offline:
        timeline, unjudged = run_offline(specs, args)
        print(f"{len(specs)} emulated targets, offline", file=sys.stderr)
        return report(args, engines, expected, timeline, unjudged)

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
            "targets": [{"name": s["name"], "url": urls[s["name"]] + "/metrics",
                         "scrape_interval": f"{scrape_real:g}s", "scrape_timeout": f"{0.9 * scrape_real:g}s",
                         "hardware": hardware_of(s["scenario"])} for s in specs],
            "diagnosis": {"interval": "1h", "window": f"{args.window / ts:g}s"},  # evaluated by this script
        }
        config_path = Path(tmp) / "targets.yaml"
        config_path.write_text(yaml.safe_dump(config))
        settings = Settings(data_dir=Path(tmp), config_file=config_path, default_scrape_interval=scrape_real,
                            default_scrape_timeout=0.9 * scrape_real, write_batch_interval=0.25, summary_interval=3600,
                            max_concurrent_scrapes=128)
        app = create_app(settings)
        timeline: dict[str, list[tuple[float, str, list, list]]] = defaultdict(list)
        unjudged: dict[str, set[str]] = {}  # per target: the regimes its last evaluation could not judge
        with TestClient(app):
            monitor = app.state.monitor
            end = fleet_started + args.steady / ts
            next_eval = time.time() + interval_real
            while time.time() < end:
                time.sleep(max(0.0, next_eval - time.time()))
                now = time.time()
                for diagnosis, transitions in monitor.evaluate_diagnoses(now=now):
                    timeline[diagnosis.target].append((now, diagnosis.verdict, [f.regime for f in diagnosis.findings],
                                                       transitions))
                    unjudged[diagnosis.target] = {n["regime"] for n in diagnosis.not_judged}
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

    timeline = {name: [(offsets[name] + t * ts, v, regimes, tr) for t, v, regimes, tr in events]
                for name, events in timeline.items()}
    return report(args, engines, expected, timeline, unjudged)


def run_offline(specs: list[dict], args: argparse.Namespace) -> tuple[dict[str, list], dict[str, set[str]]]:
    """Every target on its simulated clock: a scrape every ``--scrape-interval``, an evaluation
    every ``--eval-interval`` over ``--window``, both in simulated seconds from the warm-up on."""
    from app.diagnosis import engine as diagnosis_engine
    from app.diagnosis.profile import HardwareProfile
    from app.emulator.simulation import Simulation
    from app.scrape.jobs import PageProcessor
    from app.store import db
    from app.store.record import ScrapeRecord
    from app.store.writer import SampleWriter

    t = DiagnosisConfig().thresholds
    timeline: dict[str, list[tuple[float, str, list, list]]] = {}
    unjudged: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in specs:
            url = f"sqlite:///{Path(tmp) / (spec['name'] + '.db')}"
            db.upgrade(url)
            sql = db.make_engine(url)
            sessions = db.make_sessionmaker(sql)
            hardware = HardwareProfile(**hardware_of(spec["scenario"]))
            with sessions.begin() as session:
                target_id = target_repository.create_target(session, name=spec["name"], url="http://emulated/metrics",
                                                     engine="auto", labels={}).id
            sim = Simulation(spec["scenario"], engine=spec["engine"], seed=spec["seed"])
            sim.run_for(WARMUP)
            processor, writer, events = PageProcessor("auto"), SampleWriter(sql), []
            end, next_eval = WARMUP + args.steady, WARMUP + args.eval_interval
            while sim.clock + 1e-9 < end:
                sim.run_for(args.scrape_interval)
                page, canonical, _ = processor.process(sim.render_metrics())
                writer.write([ScrapeRecord(target_id, round(sim.clock, 3), True, 0.001, 0, page.samples_seen,
                                           page.samples_kept, page.malformed, processor.engine, None, None,
                                           canonical)])
                if sim.clock + 1e-9 >= next_eval:
                    now = round(sim.clock, 3)
                    with sessions.begin() as session:
                        for d in diagnosis_engine.evaluate_target(session, target_id, spec["name"],
                                                                  processor.engine or "vllm", now, args.window, t,
                                                                  hardware):
                            transitions = diagnosis_engine.apply_lifecycle(session, target_id, d, t, now)
                            events.append((now, d.verdict, [f.regime for f in d.findings], transitions))
                            unjudged[spec["name"]] = {n["regime"] for n in d.not_judged}
                    next_eval += args.eval_interval
            timeline[spec["name"]] = events
            sql.dispose()
    return timeline, unjudged


def report(args: argparse.Namespace, engines: list[str], expected: dict, timeline: dict[str, list],
           unjudged: dict[str, set[str]]) -> int:
    """Print the tables; 0 when every target is met."""
    matrix: dict[str, Counter] = defaultdict(Counter)
    per_engine: dict[tuple[str, str], Counter] = defaultdict(Counter)  # (scenario, engine) -> right / judged / n/j
    detection: dict[str, list] = defaultdict(list)
    false_findings: dict[str, tuple[int, list]] = {}  # healthy run -> (evaluations, [(t, regimes)] with a finding)
    for name, (kind, label, engine) in expected.items():
        events = timeline.get(name, [])
        if kind == "steady" and label.startswith("healthy"):
            wrong = [(round(t), regimes) for t, _, regimes, _ in events if regimes]
            false_findings[name] = (len(events), wrong)
            verdict = wrong[0][1][0] if wrong else ("healthy" if events else "insufficient_data")
            matrix[label][verdict] += 1
            per_engine[label, engine]["right" if verdict == "healthy" else "wrong"] += 1
        elif kind == "steady":
            final = events[-1][1] if events else "insufficient_data"
            if final != label and label in unjudged.get(name, set()):
                final = "not_judged"
            matrix[label][final] += 1
            per_engine[label, engine]["right" if final == label else "n/j" if final == "not_judged" else "wrong"] += 1
            if final != label:
                print(f"{name}: verdicts {[v for _, v, _, _ in events]}", file=sys.stderr)
        elif label in unjudged.get(name, set()):
            continue  # this engine does not export what the rule reads: no detection to time
        else:
            switch = WARMUP + args.switch
            first = next((t for t, v, _, _ in events if t > switch and v == label), None)
            active = next((t for t, _, _, tr in events if t > switch and any(x["regime"] == label and x["state"] ==
                                                                            "active" for x in tr)), None)
            wrong = [(round(t), regimes) for t, _, regimes, _ in events if t <= switch and regimes]
            if wrong:
                print(f"{name}: findings before the switch at {switch:g} s: {wrong}", file=sys.stderr)
            wrong_before = len(wrong)
            if first is None or first - switch > 3 * args.eval_interval:
                print(f"{name}: late; evaluations after the switch at {switch:g} s: "
                      f"{[(round(t - switch, 1), v) for t, v, _, _ in events if t > switch][:6]}", file=sys.stderr)
            detection[label].append((None if first is None else (first - switch) / args.eval_interval,
                                     None if active is None else (active - switch) / args.eval_interval,
                                     wrong_before))

    print(f"\n## Confusion matrix ({args.seeds} seed(s) x {', '.join(engines)}; verdict after "
          f"{args.steady:g} simulated s, healthy rows at every evaluation; window {args.window:g} s, evaluation "
          f"every {args.eval_interval:g} s)\n")
    print("| scenario \\ verdict | " + " | ".join(VERDICTS) + " | correct |")
    print("|---|" + "---|" * (len(VERDICTS) + 1))
    total = correct = unjudged_runs = 0
    for scenario in STEADY:
        want = "healthy" if scenario.startswith("healthy") else scenario
        row = matrix[scenario]
        n = sum(row.values()) - row["not_judged"]
        total += n
        correct += row[want]
        unjudged_runs += row["not_judged"]
        print(f"| {scenario} | " + " | ".join(str(row[v]) if row[v] else "." for v in VERDICTS)
              + f" | {row[want]}/{n} |")
    print(f"\nAccuracy: {correct}/{total} (runs whose engine exposes the regime's signals); not judged: "
          f"{unjudged_runs}")
    print("\n## Per engine (right / runs; n/j = not judged: the engine does not export what the rule reads)\n")
    print("| scenario | " + " | ".join(engines) + " |")
    print("|---|" + "---|" * len(engines))
    for scenario in STEADY:
        cells = []
        for engine in engines:
            c = per_engine[scenario, engine]
            judged = c["right"] + c["wrong"]
            cells.append(f"{c['right']}/{judged}" + (f" ({c['n/j']} n/j)" if c["n/j"] else "") if judged
                         else f"n/j ({c['n/j']})")
        print(f"| {scenario} | " + " | ".join(cells) + " |")
    print("\n## False findings in the healthy scenarios (every evaluation; target 0)\n")
    print("| run | evaluations | with a pending or active finding | regimes |")
    print("|---|---|---|---|")
    for name, (evaluations, wrong) in false_findings.items():
        regimes = Counter(r for _, rs in wrong for r in rs)
        print(f"| {name} | {evaluations} | {len(wrong)} | "
              + (", ".join(f"{r} x{n}" for r, n in sorted(regimes.items())) or "-") + " |")
    false_total = sum(len(w) for _, w in false_findings.values())
    print(f"\nFalse findings: {false_total} of {sum(e for e, _ in false_findings.values())} evaluations")
    print("\n## Detection latency after healthy -> regime (in evaluation intervals; target <= 3)\n")
    print("| regime | first fired (per run) | active (per run) | false findings before the switch | within 3 |")
    print("|---|---|---|---|---|")
    all_ok = correct == total and false_total == 0
    for regime in REGIMES:
        runs = detection[regime]
        fmt = lambda xs: ", ".join("never" if x is None else f"{x:.1f}" for x in xs)  # noqa: E731
        if not runs:
            print(f"| {regime} | n/j | n/j | - | n/j |")
            continue
        ok = all(f is not None and f <= 3 for f, _, _ in runs)
        all_ok &= ok and all(w == 0 for _, _, w in runs)
        print(f"| {regime} | {fmt([r[0] for r in runs])} | {fmt([r[1] for r in runs])} | "
              f"{sum(r[2] for r in runs)} | {'PASS' if ok else 'MISS'} |")
    print(f"\nOverall: {'PASS' if all_ok else 'MISS'}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
