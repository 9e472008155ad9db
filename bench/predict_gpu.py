"""Predict a recorded study's configs on a GPU it was not measured on, before measuring it
(issue 35 item 4: "measure one, predict the other, then measure it").

Every completed trial of a study file (``studies/NAME.json``) is scaled to the target GPU with
the same model ``sweeper best --across-hardware`` uses (``sweeper.predict``: matmul time by the
ratio of dense peaks, the rest of the GPU's time by memory bandwidth, host time kept). The
predictions are printed and, with ``--save``, written to a JSON file that is committed before
the target is measured, so the figures cannot be fitted after the fact. With ``--against`` a
study measured on the target (the same space), each config both measured is compared:
predicted ÷ measured samples/s, and whether it falls within ``--within`` (15%, the issue's
target).

    python bench/predict_gpu.py --study studies/h100-llama-1b.json --target h200-sxm \\
        --save bench/predictions/h200-from-h100-llama-1b.json
    # later, on the H200: record the same space, then
    python bench/predict_gpu.py --study studies/h100-llama-1b.json --target h200-sxm \\
        --against studies/h200-llama-1b.json

Predictions are estimates (the band is ``sweeper.predict.PRIOR_BAND`` until a GPU type has
been measured beside another: ``sweeper best`` then calibrates it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sweeper import knobs, predict
from sweeper.catalog import load_catalog
from sweeper.offers import _key
from sweeper.store import Store
from sweeper.studyfile import import_study, read_study_file


def _trials(path: Path) -> tuple[str, list[dict[str, Any]]]:
    """The study's name and its completed trials (number, config, measurement, projection)."""
    document = read_study_file(path)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{tmp}/study.db")
        store.migrate()
        name = import_study(store, document)
        rows = []
        for metrics in store.trial_metrics(name, states=["complete"]):
            trial = store.get_trial(name, metrics.number)
            if trial is None or not trial.measurement:
                continue
            rows.append(
                {
                    "number": metrics.number,
                    "config": dict(metrics.config),
                    "measurement": trial.measurement,
                    "projection": metrics.projection,
                }
            )
        store.dispose()
    return name, rows


def predictions(study: Path, target: str, catalog_path: str | None) -> dict[str, Any]:
    """Each completed trial of ``study`` predicted on catalog GPU ``target``."""
    catalog = load_catalog(catalog_path)
    if target not in catalog.gpus:
        raise SystemExit(
            f"error: --target {target!r} is not in the catalog {catalog.path or '(shipped)'}; "
            f"its GPUs: {', '.join(catalog.gpus)}"
        )
    name, rows = _trials(study)
    out: list[dict[str, Any]] = []
    source_key = None
    for row in rows:
        device = (row["measurement"].get("env") or {}).get("device_name") or ""
        found = catalog.find(str(device))
        if found is None:
            out.append({"number": row["number"], "unpredictable": f"{device!r} not in catalog"})
            continue
        source_key = found[0]
        try:
            observed = predict.Observed.of(row["measurement"], row["config"], row["projection"])
            guess = predict.predict(
                observed, found[1], catalog.gpus[target], band=predict.PRIOR_BAND
            )
        except predict.Unpredictable as e:
            out.append({"number": row["number"], "unpredictable": str(e)})
            continue
        out.append(
            {
                "number": row["number"],
                "config": row["config"],
                "key": _key(row["config"]),
                "measured_samples_per_s": observed.samples_per_s,
                "predicted_samples_per_s": guess.samples_per_s,
                "speedup": guess.speedup,
                "predicted_hours_per_run": guess.hours_per_run,
                "predicted_mfu": guess.mfu,
                "fit": guess.fit,
                "memory_needed_gb": guess.memory_needed_bytes / 1e9,
                "band": guess.band,
            }
        )
    return {
        "study": name,
        "source_gpu": source_key,
        "target_gpu": target,
        "catalog": catalog.path or "sweeper/gpus.yaml (shipped)",
        "model": "sweeper.predict (matmul by dense peak, rest of the GPU by bandwidth, host kept)",
        "estimate": True,
        "trials": out,
    }


def _short(config: Mapping[str, Any]) -> str:
    return knobs.describe(dict(config))


def compare(predicted: Mapping[str, Any], measured: Path, within: float) -> int:
    """Print predicted against measured per config both have; the number outside ``within``."""
    _, rows = _trials(measured)
    by_key: dict[str, list[float]] = {}
    for row in rows:
        by_key.setdefault(_key(row["config"]), []).append(
            float(row["measurement"].get("samples_per_s") or 0.0)
        )
    outside = 0
    errors: list[float] = []
    print("| trial | config | predicted samples/s | measured | predicted ÷ measured | within |")
    print("|---:|---|---:|---:|---:|---|")
    for p in predicted["trials"]:
        if "key" not in p or p["key"] not in by_key:
            continue
        value = max(by_key[p["key"]])  # the target study's best measurement of the config
        ratio = p["predicted_samples_per_s"] / value if value > 0 else float("inf")
        errors.append(ratio - 1)
        ok = abs(ratio - 1) <= within
        outside += not ok
        print(
            f"| {p['number']} | {_short(p['config'])} | {p['predicted_samples_per_s']:,.1f} | "
            f"{value:,.1f} | {ratio:.3f} | {'yes' if ok else '**no**'} |"
        )
    if not errors:
        print("no config of the prediction was measured on the target: nothing to compare")
        return 1
    worst = max(abs(e) for e in errors)
    mean = sum(abs(e) for e in errors) / len(errors)
    print(
        f"\n{len(errors)} configs compared: mean |error| {mean:.1%}, worst {worst:.1%}; "
        f"{outside} outside ±{within:.0%}"
    )
    return outside


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", type=Path, required=True, help="a study file, measured")
    parser.add_argument("--target", required=True, help="a catalog GPU key, e.g. h200-sxm")
    parser.add_argument("--catalog", help="a GPU catalog file (default: the shipped one)")
    parser.add_argument("--save", type=Path, help="write the predictions here (JSON)")
    parser.add_argument("--against", type=Path, help="a study file measured on the target")
    parser.add_argument("--within", type=float, default=0.15, help="the error target (0.15)")
    args = parser.parse_args(argv)
    result = predictions(args.study, args.target, args.catalog)
    print(
        f"{result['study']} measured on {result['source_gpu']}, predicted on "
        f"{result['target_gpu']} (estimates, ±{predict.PRIOR_BAND:.0%} prior band):\n"
    )
    print("| trial | config | measured samples/s | predicted | × | fit | predicted h/run |")
    print("|---:|---|---:|---:|---:|---|---:|")
    for p in result["trials"]:
        if "unpredictable" in p:
            print(f"| {p['number']} | unpredictable: {p['unpredictable']} | | | | | |")
            continue
        print(
            f"| {p['number']} | {_short(p['config'])} | {p['measured_samples_per_s']:,.1f} | "
            f"{p['predicted_samples_per_s']:,.1f} | {p['speedup']:.3f} | {p['fit']} "
            f"({p['memory_needed_gb']:,.1f} GB) | {p['predicted_hours_per_run']:.2f} |"
        )
    if args.save is not None:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        print(f"\nsaved: {args.save}")
    if args.against is not None:
        print()
        return 1 if compare(result, args.against, args.within) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
