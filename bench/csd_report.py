"""Results of the computational-storage study (bench/seed_csd.py): pure functions over the
raw runs, unit-tested without a cluster (bench/tests/test_csd_report.py).

  flatten(doc)            `locus fs compute --json` (or `locus bench compute-host`) output
                          as flat {key: number}, the keys every path reports
  compare(results)        every path's results against the reference, with tolerances
  summarize(raw)          medians per dataset, path, workers and operator
  goals(raw)              the issue's goals, each with its figure and pass/miss
  markdown(raw), chart(raw, png), write_all(raw, out_dir, stem)

The raw document (JSON next to the table):
  {"profile": "lan", "quick": true, "reps": 1, "workers": [1, 2], "k": 3, "m": 7,
   "datasets": [{"name": "128MiB-10", "size": S, "files": 10, "bytes": B, "rows": R}],
   "runs": [{"dataset": "128MiB-10", "path": "locus-warm", "workers": 1, "op": "stats",
             "seconds": [...], "link_bytes": [...], "scanned": B, "results": {flat}}, ...],
   "plain_read": [{"dataset": ..., "seconds": [...], "bytes": B}],
   "checks": [{"dataset", "op", "path", "workers", "reference", "keys", "mismatches": [...]}]}
Host paths and DuckDB have "workers": 0 (no cluster).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

OPS = ["count", "stats", "modsum", "stddev", "normalize", "gram", "digits", "entropy"]
ALL = "all"
ROWS = OPS + [ALL]
COLS = [f"c{i}" for i in range(8)]

# id -> (label, needs a cluster)
PATHS = {
    "locus-cold": ("Locus cold", True),
    "locus-warm": ("Locus warm", True),
    "locus-sql": ("Locus SQL warm (`locus sql`, scans on the workers)", True),
    "host-py": ("host pull, Python (boto3 + pandas/numpy)", False),
    "host-rust": ("host pull, Rust (OpenDAL + locus-compute)", False),
    "spark": ("Spark SQL over s3a", False),
    "duckdb": ("DuckDB on a tmpfs copy (floor)", False),
}
SHORT = {"locus-cold": "Locus cold", "locus-warm": "Locus warm", "locus-sql": "Locus SQL", "host-py": "host Python",
         "host-rust": "host Rust", "spark": "Spark SQL s3a", "duckdb": "DuckDB tmpfs"}
# Reference for the agreement checks: the plain numpy definitions first.
REFERENCE_ORDER = ["host-py", "duckdb", "host-rust", "locus-warm", "locus-cold", "locus-sql", "spark"]

GOAL_WARM_ALL_1G = 5.0  # seconds, warm all operators on 1 GiB
GOAL_VS_DUCKDB = 1.5  # Locus warm / DuckDB (SQL aggregates; operator rows stand in)
GOAL_VS_SPARK = 20.0  # Spark / Locus warm
GOAL_COLD_VS_READ = 1.1  # Locus cold / plain read
GOAL_RETURNED = 0.001  # bytes returned / bytes scanned

REL_SUM = 1e-9  # sums: the brief's tolerance
GiB, MiB = 1 << 30, 1 << 20


# --------------------------------------------------------------------------- results


def op_keys(op: str) -> list[str]:
    """The flat keys an operator's results have (every path reports these)."""
    if op == "count":
        return ["rows"]
    if op == "stats":
        return [f"{c}.{s}" for c in COLS for s in ("sum", "mean", "min", "max")]
    if op == "modsum":
        return [f"{c}.modsum" for c in COLS]
    if op == "stddev":
        return [f"{c}.{s}" for c in COLS for s in ("std_pop", "std_samp")]
    if op == "normalize":
        return [f"{c}.{s}" for c in COLS for s in ("zscore_sum", "minmax_sum")]
    if op == "gram":
        return [f"gram.{i}.{j}" for i in range(8) for j in range(i, 8)] + ["gram.det"]
    if op == "digits":
        return [f"digit.{d}" for d in range(10)]
    if op == "entropy":
        return ["entropy.bits", "entropy.distinct"]
    if op == ALL:
        return [k for o in OPS for k in op_keys(o)]
    raise ValueError(op)


def flatten(doc: dict) -> dict:
    """`locus fs compute --json` (or compute-host) output as flat {key: number}."""
    f: dict = {}
    if "count" in doc:
        f["rows"] = doc["count"]["rows"]
    for c, st in (doc.get("stats") or {}).items():
        for s in ("sum", "mean", "min", "max"):
            f[f"{c}.{s}"] = st[s]
    if doc.get("modsum"):
        for c, v in doc["modsum"]["sums"].items():
            f[f"{c}.modsum"] = v
    for c, sd in (doc.get("stddev") or {}).items():
        f[f"{c}.std_pop"], f[f"{c}.std_samp"] = sd["population"], sd["sample"]
    for c, nz in (doc.get("normalize") or {}).items():
        f[f"{c}.zscore_sum"], f[f"{c}.minmax_sum"] = nz["zscore_sum"], nz["minmax_sum"]
    if doc.get("gram"):
        names = doc["gram"]["columns"]
        idx = [COLS.index(n) for n in names]
        m = doc["gram"]["matrix"]
        for a, i in enumerate(idx):
            for b, j in enumerate(idx):
                if i <= j:
                    f[f"gram.{i}.{j}"] = m[a][b]
        f["gram.det"] = doc["gram"]["determinant"]
    if doc.get("digits"):
        counts = doc["digits"].get("counts") or doc["digits"].get("bytes")
        for d, n in counts.items():
            f[f"digit.{d}"] = n
    if doc.get("entropy"):
        f["entropy.bits"] = doc["entropy"]["bits"]
        if "distinct" in doc["entropy"]:
            f["entropy.distinct"] = doc["entropy"]["distinct"]
    return f


def tolerance(key: str, rows: int) -> tuple[str, float]:
    """How `key` must agree across paths: ("exact"|"rel"|"abs", bound)."""
    if key in ("rows", "entropy.distinct") or key.startswith("digit."):
        return "exact", 0.0
    if key == "gram.det":
        return "rel", 1e-6  # LU of a product of sums: not a sum itself
    if key.endswith(".zscore_sum"):
        # About 0 (a sum of z-scores): the cancellation leaves rounding noise only.
        return "abs", 1e-6 * max(rows, 1)
    if key.endswith((".min", ".max")):
        return "rel", 1e-12  # parsers may round a decimal an ulp apart
    return "rel", REL_SUM


def agree(key: str, a, b, rows: int) -> bool:
    kind, bound = tolerance(key, rows)
    if a is None or b is None:
        return a is b
    a, b = float(a), float(b)
    if kind == "exact":
        return a == b
    if kind == "abs":
        return abs(a - b) <= bound
    return a == b or abs(a - b) <= bound * max(abs(a), abs(b), 1e-300)


def compare(op: str, results: dict[str, dict], rows: int) -> list[dict]:
    """`results`: {path label: flat results of `op`}. Every one against the reference
    (the first of REFERENCE_ORDER present); the disagreements, one per key and path."""
    labels = list(results)
    if not labels:
        return []
    ref = next((lb for p in REFERENCE_ORDER for lb in labels if lb.split(" ")[0] == p), labels[0])
    out = []
    for lb in labels:
        if lb == ref:
            continue
        for key in op_keys(op):
            a, b = results[ref].get(key, "missing"), results[lb].get(key, "missing")
            if a == "missing" or b == "missing" or not agree(key, a, b, rows):
                out.append({"op": op, "key": key, "reference": ref, "path": lb, "want": a, "got": b})
    return out


# --------------------------------------------------------------------------- summary


def median(xs):
    return statistics.median(xs) if xs else None


def summarize(raw: dict) -> dict:
    """{(dataset, path, workers, op): {"median": s, "runs": n, "link_bytes": b, "scanned": b}};
    the total (op "total") is the sum of the operators' medians."""
    s = {}
    for r in raw["runs"]:
        s[(r["dataset"], r["path"], r["workers"], r["op"])] = {
            "median": median(r["seconds"]),
            "runs": len(r["seconds"]),
            "link_bytes": median(r.get("link_bytes") or []),
            "scanned": r.get("scanned"),
        }
    for key in {(d, p, w) for (d, p, w, _) in s}:
        meds = [s.get((*key, op), {}).get("median") for op in OPS]
        if all(m is not None for m in meds):
            s[(*key, "total")] = {"median": sum(meds), "runs": None, "link_bytes": None, "scanned": None}
    return s


def columns(raw: dict) -> list[tuple[str, int]]:
    """The table's columns: (path, workers), Locus once per worker count."""
    present = {(r["path"], r["workers"]) for r in raw["runs"]}
    cols = []
    for w in raw.get("workers", [1]):
        for p in ("locus-cold", "locus-warm", "locus-sql"):
            if (p, w) in present:
                cols.append((p, w))
    for p in ("host-py", "host-rust", "spark", "duckdb"):
        if (p, 0) in present:
            cols.append((p, 0))
    return cols


def col_label(p: str, w: int) -> str:
    return f"{SHORT[p]} ({w}w)" if w else SHORT[p]


def plain_read(raw: dict, ds: str):
    for r in raw.get("plain_read", []):
        if r["dataset"] == ds:
            return median(r["seconds"])
    return None


def _div(a, b):
    return a / b if a is not None and b else None


def goals(raw: dict) -> list[dict]:
    """Each goal figure: {"goal", "dataset", "workers", "op", "value", "target", "ok", "note"}."""
    s = summarize(raw)
    out = []
    dsets = raw["datasets"]
    workers = raw.get("workers", [1])

    def add(goal, ds, w, op, value, target, ok, note=""):
        out.append({"goal": goal, "dataset": ds, "workers": w, "op": op, "value": value, "target": target,
                    "ok": ok, "note": note})

    # 1. warm all operators on 1 GiB within 5 s.
    one_g = [d for d in dsets if d["size"] == GiB]
    for d in one_g:
        for w in workers:
            v = s.get((d["name"], "locus-warm", w, ALL), {}).get("median")
            if v is not None:
                add("warm-all-1g", d["name"], w, ALL, v, GOAL_WARM_ALL_1G, v <= GOAL_WARM_ALL_1G)
    if not one_g:
        big = max(dsets, key=lambda d: d["size"]) if dsets else None
        v = s.get((big["name"], "locus-warm", workers[-1], ALL), {}).get("median") if big else None
        add("warm-all-1g", big["name"] if big else "", workers[-1], ALL, v, GOAL_WARM_ALL_1G, None,
            "no 1 GiB dataset in this run; the largest one's figure is shown")
    for d in dsets:
        for w in workers:
            # 2. SQL within 1.5x of DuckDB: `locus sql` where measured, else the operator
            #    rows stand in (said in the note).
            for op in ROWS:
                sq = s.get((d["name"], "locus-sql", w, op), {}).get("median")
                lw = sq if sq is not None else s.get((d["name"], "locus-warm", w, op), {}).get("median")
                dk = s.get((d["name"], "duckdb", 0, op), {}).get("median")
                r = _div(lw, dk)
                if r is not None:
                    add("vs-duckdb", d["name"], w, op, r, GOAL_VS_DUCKDB, r <= GOAL_VS_DUCKDB,
                        "locus sql" if sq is not None else "operator rows, not SQL (locus-sql not run)")
            # 3. 20x faster than Spark SQL over s3a.
            for op in ROWS:
                lw = s.get((d["name"], "locus-warm", w, op), {}).get("median")
                sp = s.get((d["name"], "spark", 0, op), {}).get("median")
                r = _div(sp, lw)
                if r is not None:
                    add("vs-spark", d["name"], w, op, r, GOAL_VS_SPARK, r >= GOAL_VS_SPARK)
            # 4. cold within 1.1x a plain read of the same objects.
            lc = s.get((d["name"], "locus-cold", w, ALL), {}).get("median")
            r = _div(lc, plain_read(raw, d["name"]))
            if r is not None:
                add("cold-vs-read", d["name"], w, ALL, r, GOAL_COLD_VS_READ, r <= GOAL_COLD_VS_READ)
            # 5. bytes returned within 0.1% of bytes scanned.
            for p in ("locus-cold", "locus-warm"):
                e = s.get((d["name"], p, w, ALL), {})
                r = _div(e.get("link_bytes"), e.get("scanned"))
                if r is not None:
                    add("returned", d["name"], w, f"{ALL} ({SHORT[p].split()[1]})", r, GOAL_RETURNED,
                        r <= GOAL_RETURNED)
    return out


MATRIX_GOALS = ("vs-duckdb", "vs-spark")  # one figure per operator: printed as a matrix
GOAL_TARGETS = {"warm-all-1g": GOAL_WARM_ALL_1G, "vs-duckdb": GOAL_VS_DUCKDB, "vs-spark": GOAL_VS_SPARK,
                "cold-vs-read": GOAL_COLD_VS_READ, "returned": GOAL_RETURNED}
GOAL_TEXT = {
    "warm-all-1g": ("warm, all operators, 1 GiB (s)", "<= {:g} s"),
    "vs-duckdb": ("Locus SQL warm / DuckDB (same SQL; operator rows where SQL was not run)", "<= {:g}"),
    "vs-spark": ("Spark SQL s3a / Locus warm", ">= {:g}x"),
    "cold-vs-read": ("Locus cold, all operators / plain read of the objects", "<= {:g}"),
    "returned": ("bytes returned / bytes scanned", "<= {:.1%}"),
}


# --------------------------------------------------------------------------- output


def human_size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def _f(v, fmt="{:.3f}"):
    return "—" if v is None else fmt.format(v)


def _verdict(g) -> str:
    return "n/a" if g["ok"] is None else ("pass" if g["ok"] else "**miss**")


def markdown(raw: dict) -> str:
    s = summarize(raw)
    m = raw.get("machine", {})
    cols = columns(raw)
    L = [f"# Near-data compute: the seed study's operators on a sensor log{' (quick)' if raw.get('quick') else ''}",
         "",
         f"Profile `{raw['profile']}` ({m.get('profile_desc', '')}); {m.get('cores', '?')} cores, "
         f"{m.get('memory_gib', '?')} GiB, {m.get('cpu', '')}; code {raw.get('code') or '?'}; "
         f"medians of {raw['reps']} run(s) each; Locus with {', '.join(map(str, raw.get('workers', [])))} "
         f"worker(s) (`locus local start --workers N`, {human_size(raw.get('block_size', 64 * MiB))} blocks).",
         "",
         "Data: a CSV with a header, `ts,sensor,c0,...,c7` (timestamp, sensor id, 8 numeric channels). "
         f"Operators on `c0..c7`; `modsum` with k={raw.get('k')}, m={raw.get('m')}; `digits` and `entropy` "
         "on the `sensor` column's text. `all` is one fused `locus fs compute all` (one pass; for the "
         "SQL engines, one aggregate query plus the normalize and entropy queries); `total` is the sum "
         "of the eight operator rows. Times in seconds: Locus and the Rust host pull are the wall time of "
         "one CLI process; Python, Spark and DuckDB are timed inside one long-lived process (no "
         "interpreter, JVM or session start-up).",
         ""]
    for d in raw["datasets"]:
        ds = d["name"]
        L += [f"## {human_size(d['size'])} in {d['files']} file(s) ({d['bytes']:,} bytes, {d['rows']:,} rows)", ""]
        L.append("| operator | " + " | ".join(col_label(p, w) for p, w in cols) + " |")
        L.append("|---|" + "---:|" * len(cols))
        for op in ROWS + ["total"]:
            cells = [_f(s.get((ds, p, w, op), {}).get("median")) for p, w in cols]
            name = {"all": "all operators", "total": "total (sum of the 8)"}.get(op, op)
            L.append(f"| {name} | " + " | ".join(cells) + " |")
        pr = plain_read(raw, ds)
        L += ["", f"Plain read of the objects (Rust, OpenDAL, the same ranges and concurrency, no compute): "
                  f"{_f(pr)} s.", ""]
        L += ["Bytes across the client's link, all operators (Locus: the partial results, "
              "`bytes_returned`; host pulls and Spark: the object bytes; DuckDB: none, a local copy):", "",
              "| path | bytes | of the bytes scanned |", "|---|---:|---:|"]
        for p, w in cols:
            e = s.get((ds, p, w, ALL), {})
            b = e.get("link_bytes")
            L.append(f"| {col_label(p, w)} | {_f(b, '{:,.0f}')} | {_f(_div(b, d['bytes']), '{:.4%}')} |")
        L.append("")
    gl = goals(raw)
    L += ["## Goals", "",
          "Not loosened: each figure is printed with pass or miss. The DuckDB goal compares `locus sql` "
          "(path `locus-sql`) running DuckDB's own SQL; " + (
              "in this run it did not run, so the operator rows stand in and SQL itself is **not measured**."
              if not any(r["path"] == "locus-sql" for r in raw["runs"]) else "it ran in this run."), "",
          "| goal | dataset | workers | row | figure | target | |", "|---|---|---:|---|---:|---|---|"]
    for g in (g for g in gl if g["goal"] not in MATRIX_GOALS):
        name, tgt = GOAL_TEXT[g["goal"]]
        fmt = "{:.4%}" if g["goal"] == "returned" else ("{:.3f} s" if g["goal"] == "warm-all-1g" else "{:.2f}")
        note = f" ({g['note']})" if g["note"] and g["goal"] == "warm-all-1g" else ""
        L.append(f"| {name} | {g['dataset']} | {g['workers']} | {g['op']} | {_f(g['value'], fmt)} | "
                 f"{tgt.format(g['target'])} | {_verdict(g)}{note} |")
    for goal in MATRIX_GOALS:
        name, tgt = GOAL_TEXT[goal]
        cells = {(g["dataset"], g["workers"], g["op"]): g for g in gl if g["goal"] == goal}
        if not cells:
            continue
        L += ["", f"{name}, target {tgt.format(GOAL_TARGETS[goal])} (**bold**: missed):", "",
              "| dataset | workers | " + " | ".join(ROWS) + " |", "|---|---:|" + "---:|" * len(ROWS)]
        for ds, w in sorted({(k[0], k[1]) for k in cells}, key=lambda x: ([d["name"] for d in raw["datasets"]].index(x[0]), x[1])):
            row = []
            for op in ROWS:
                g = cells.get((ds, w, op))
                v = _f(g["value"] if g else None, "{:.2f}")
                row.append(f"**{v}**" if g and g["ok"] is False else v)
            L.append(f"| {ds} | {w} | " + " | ".join(row) + " |")
        if goal == "vs-spark":
            L += spark_floor(s, sorted({k[0] for k in cells}, key=[d["name"] for d in raw["datasets"]].index))
    L.append("")
    gs = [g for g in gl if g["ok"] is not None]
    L += ["", f"{sum(g['ok'] for g in gs)} of {len(gs)} goal figures met.", ""]
    checks = raw.get("checks", [])
    bad = [c for c in checks if c["mismatches"]]
    L += ["## Agreement", "",
          f"{len(checks)} comparisons of every path's results with the reference (numpy first): sums within "
          f"{REL_SUM:g} relative, counts exact, min/max within 1e-12, the determinant within 1e-6, z-score "
          f"sums (about 0) within 1e-6 x rows. {'All agree.' if not bad else f'**{len(bad)} disagree.**'}", ""]
    if "wall_seconds" in raw:
        L.append(f"Whole run: {raw['wall_seconds']:.0f} s.")
    return "\n".join(L) + "\n"


def spark_floor(s: dict, dsets: list[str]) -> list[str]:
    """Spark over the floor (DuckDB on a tmpfs copy, a top engine with no storage layer),
    per operator, from the run's medians `s` ([`summarize`]): the ratio to Spark that the
    floor itself reaches in the same run."""
    rows = []
    for ds in dsets:
        cells = [_div(s.get((ds, "spark", 0, op), {}).get("median"), s.get((ds, "duckdb", 0, op), {}).get("median"))
                 for op in ROWS]
        if any(c is not None for c in cells):
            rows.append(f"| {ds} | floor | " + " | ".join(_f(c, "{:.2f}") for c in cells) + " |")
    if not rows:
        return []
    return ["", "The same ratio for the floor, Spark SQL s3a / DuckDB on tmpfs (the same work with no storage "
            f"layer, same run): where it is under {GOAL_VS_SPARK:g}, a top engine with no storage in the way "
            "falls short of the goal too.", "",
            "| dataset | | " + " | ".join(ROWS) + " |", "|---|---|" + "---:|" * len(ROWS), *rows]


def chart(raw: dict, png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = summarize(raw)
    cols = columns(raw)
    dsets = raw["datasets"]
    n = max(len(dsets), 1)
    ncol = min(n, 2)
    nrow = math.ceil(n / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(7.5 * ncol, 4.2 * nrow), squeeze=False)
    width = 0.85 / max(len(cols), 1)
    for i, d in enumerate(dsets):
        ax = axes[i // ncol][i % ncol]
        for j, (p, w) in enumerate(cols):
            ys = [s.get((d["name"], p, w, op), {}).get("median") or 0 for op in ROWS]
            ax.bar([x + j * width for x in range(len(ROWS))], ys, width, label=col_label(p, w))
        ax.set_xticks([x + width * (len(cols) - 1) / 2 for x in range(len(ROWS))])
        ax.set_xticklabels(ROWS, rotation=30, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("seconds (log)")
        ax.set_title(f"{human_size(d['size'])} in {d['files']} file(s)")
        ax.grid(axis="y", alpha=0.3)
    for k in range(len(dsets), nrow * ncol):
        axes[k // ncol][k % ncol].axis("off")
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"seed-csd, profile {raw['profile']}: time per operator (median)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def write_all(raw: dict, out_dir: Path, stem: str) -> dict:
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": out_dir / f"{stem}.md", "png": out_dir / f"{stem}.png", "json": out_dir / f"{stem}.json"}
    paths["json"].write_text(json.dumps(raw, indent=1))
    paths["md"].write_text(markdown(raw))
    chart(raw, paths["png"])
    return paths
