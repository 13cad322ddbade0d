"""Parsing and reporting for the line-count study (bench/seed_linecount.py).

Pure functions over the raw runs, so they can be unit-tested without a cluster:
  parse_json_line(text)     the JSON object a client process printed last (logs may precede it)
  summarize(raw)            first access, mean and median of the next accesses, per size/path/mode
  ratios(summary, raw)      Locus against direct, against the tmpfs floor, and against Alluxio
  goals(summary, raw)       the issue's goals, each with its figure and pass/miss
  markdown(raw)             the results table
  chart(raw, png)           a matplotlib bar chart: time per access, one group per file size
  merge(docs)               one document from harness runs of different sizes (same settings)

    python3 bench/linecount_report.py merge --stem STEM A.json B.json   # writes STEM.{md,png,json}

The raw document (written as JSON next to the table):
  {"profile": "lan", "reps": 10, "sizes": [bytes...], "machine": {...}, "workers": 1,
   "runs": [{"size": S, "path": "locus-native", "mode": "new-app", "seconds": [first, next...],
             "lines": N}, ...],
   "floor": [{"size": S, "seconds": [...], "lines": N}, ...]}
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

# id -> (label, system, family). A family is the kind of client; Locus is compared with the
# direct path and with the Alluxio paths of the same family.
PATHS = {
    "direct-s3a": ("Spark s3a -> MinIO (direct)", "direct", "spark"),
    "direct-boto3": ("boto3 -> MinIO (direct, native S3 client)", "direct", "native"),
    "locus-s3a": ("Spark s3a -> Locus S3 gateway", "locus", "spark"),
    "locus-fs": ("Spark locus:// (Locus connector)", "locus", "spark"),
    "locus-native": ("Locus native client (locus fs wc)", "locus", "native"),
    "alluxio-fs": ("Spark alluxio:// (Alluxio connector)", "alluxio", "spark"),
    "alluxio-s3a": ("Spark s3a -> Alluxio S3 proxy", "alluxio", "spark"),
    "alluxio-java": ("Alluxio Java client (FileSystem API)", "alluxio", "native"),
    # Spark counting the tmpfs copy (file://): no storage system at all, so the least any
    # Spark path can take on this machine.
    "spark-tmpfs": ("Spark file:// of the tmpfs copy (Spark's own floor)", "floor", "spark"),
}
# The path whose repeat accesses bound every Spark path from below.
SPARK_FLOOR = "spark-tmpfs"


def default_paths(quick: bool) -> list[str]:
    """The paths a harness run measures: all of them, but Spark's own floor (4 more Spark
    applications) is left out of quick mode."""
    return [p for p in PATHS if not (quick and p == SPARK_FLOOR)]

# The direct counterpart of each Locus path.
DIRECT_FOR = {"locus-s3a": "direct-s3a", "locus-fs": "direct-s3a", "locus-native": "direct-boto3"}
# (what is compared, Locus path, Alluxio path).
ALLUXIO_PAIRS = [
    ("Spark through its connector", "locus-fs", "alluxio-fs"),
    ("S3 (Spark s3a)", "locus-s3a", "alluxio-s3a"),
    ("native client", "locus-native", "alluxio-java"),
]
MODES = {"new-app": "a new application per access", "same-app": "every access in one application"}

GOAL_REPEAT_SPEEDUP = 8.0  # direct / Locus, second and later accesses
GOAL_FLOOR = 1.25  # Locus native / wc -l on tmpfs
GOAL_FIRST = 1.05  # Locus first / direct first


def parse_json_line(text: str) -> dict:
    """The last line of `text` that is a JSON object (client processes log before it)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise ValueError(f"no JSON result in the output: {text[-500:]!r}")


def human_size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << (shift - 4)) == 0:
            v = n / (1 << shift)
            return f"{v:g} {unit}"
    return f"{n} B"


def summarize(raw: dict) -> dict:
    """{(size, path, mode): {"first", "next_mean", "next_median", "next", "lines"}} plus
    {(size, "floor", ""): {"median", ...}} for the tmpfs floor."""
    out: dict = {}
    for r in raw["runs"]:
        s = r["seconds"]
        if not s:
            raise ValueError(f"run without accesses: {r}")
        nxt = s[1:]
        out[(r["size"], r["path"], r["mode"])] = {
            "first": s[0],
            "next": nxt,
            "next_mean": statistics.fmean(nxt) if nxt else None,
            "next_median": statistics.median(nxt) if nxt else None,
            "lines": r["lines"],
        }
    for f in raw.get("floor", []):
        out[(f["size"], "floor", "")] = {"median": statistics.median(f["seconds"]), "runs": f["seconds"],
                                         "lines": f["lines"]}
    return out


def _div(a, b):
    return a / b if a is not None and b else None


def ratios(summary: dict, raw: dict) -> list[dict]:
    """One row per (size, mode, Locus path): first / direct first, direct next / Locus next
    (speed-up), Locus next / floor, and Locus / Alluxio for first and next per pair."""
    rows = []
    for size in raw["sizes"]:
        floor = summary.get((size, "floor", ""), {}).get("median")
        for mode in MODES:
            for lp, dp in DIRECT_FOR.items():
                lo, di = summary.get((size, lp, mode)), summary.get((size, dp, mode))
                if not lo:
                    continue
                row = {"size": size, "mode": mode, "path": lp, "direct": dp,
                       "first_vs_direct": _div(lo["first"], di and di["first"]),
                       "repeat_speedup": _div(di and di["next_mean"], lo["next_mean"]),
                       "next_vs_floor": _div(lo["next_mean"], floor),
                       "alluxio": {}}
                sf = summary.get((size, SPARK_FLOOR, mode))
                if PATHS[lp][2] == "spark" and sf:
                    # How far Spark itself lets the 8x goal be reached, and how close Locus gets.
                    row["spark_floor"] = {"next": sf["next_mean"],
                                          "direct_speedup": _div(di and di["next_mean"], sf["next_mean"]),
                                          "locus_vs_floor": _div(lo["next_mean"], sf["next_mean"])}
                for what, l2, ap in ALLUXIO_PAIRS:
                    al = summary.get((size, ap, mode))
                    if l2 == lp and al:
                        row["alluxio"][ap] = {"what": what, "first": _div(lo["first"], al["first"]),
                                              "next": _div(lo["next_mean"], al["next_mean"])}
                rows.append(row)
    return rows


def goals(summary: dict, raw: dict) -> list[dict]:
    """Each goal of the issue as {"goal", "size", "mode", "value", "bound", "ok"}. `ok` is None
    when the figure is missing (a path did not run)."""
    out = []

    def add(goal, size, mode, value, bound, higher_is_better, strict=False):
        if value is None:
            ok = None
        elif higher_is_better:
            ok = value >= bound
        else:
            ok = value < bound if strict else value <= bound
        out.append({"goal": goal, "size": size, "mode": mode, "value": value, "bound": bound, "ok": ok})

    for r in ratios(summary, raw):
        lbl = PATHS[r["path"]][0]
        add(f"repeat accesses, direct / Locus ({lbl})", r["size"], r["mode"], r["repeat_speedup"],
            GOAL_REPEAT_SPEEDUP, True)
        add(f"first access, Locus / direct ({lbl})", r["size"], r["mode"], r["first_vs_direct"], GOAL_FIRST, False)
        if r["path"] == "locus-native":
            add("repeat accesses, Locus native / wc -l on tmpfs", r["size"], r["mode"], r["next_vs_floor"],
                GOAL_FLOOR, False)
        for ap, v in r["alluxio"].items():
            # Strictly faster than Alluxio: equal is a miss.
            add(f"first access, Locus / Alluxio, {v['what']}", r["size"], r["mode"], v["first"], 1.0, False, True)
            add(f"repeat accesses, Locus / Alluxio, {v['what']}", r["size"], r["mode"], v["next"], 1.0, False, True)
    return out


def _f(v, fmt="{:.2f}"):
    return "n/a" if v is None else fmt.format(v)


def markdown(raw: dict) -> str:
    summary = summarize(raw)
    rows = ratios(summary, raw)
    m = raw.get("machine", {})
    reps = raw["reps"]
    lines = [
        f"### Line-count study: profile `{raw['profile']}`, {', '.join(human_size(s) for s in raw['sizes'])}"
        + (" (quick mode)" if raw.get("quick") else ""),
        "",
        f"Machine: {m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB, kernel {m.get('kernel', '?')}. "
        f"Network profile `{raw['profile']}` ({m.get('profile_desc', '')}). Locus: 1 master, "
        f"{raw.get('workers', 1)} worker(s)"
        + (f"; Alluxio {raw.get('alluxio_version', '2.9.6')}: 1 master, 1 worker, the S3 proxy"
           if any(PATHS[r["path"]][1] == "alluxio" for r in raw["runs"] if r["path"] in PATHS) else "")
        + "; all on this host, MinIO behind the shaped link. Spark: local[2], "
        f"s3a input stream `{raw.get('s3a_stream', 'classic')}` on every s3a path"
        + ("; driver JVMs share a class-data archive (CDS)." if raw.get("spark_cds") else ".")
        + (" Fewer applications (quick mode): each new-app series opens with the same-app application's "
           "first access (both are a new application's first access on emptied caches), and a path's Spark "
           "applications start together, then count one after the other, each idle until its turn."
           if raw.get("batch_apps") else "")
        + "".join(f" Sizes {', '.join(human_size(s) for s in h['sizes'])}: one harness run of "
                  f"{h['wall_seconds']:.0f} s" + (f" (code: {h['code']})" if h.get("code") else "") + "."
                  for h in raw.get("harness_runs", []))
        + (f" Code: {raw['code']}." if raw.get("code") and not raw.get("harness_runs") else ""),
        "",
        f"Each cell: the first access (caches emptied before it) and the mean of the next {reps} accesses, "
        "in seconds, timed inside the application (process start not counted). "
        + "; ".join(f"`{k}`: {v}" for k, v in MODES.items()) + ".",
        "",
    ]
    for size in raw["sizes"]:
        fl = summary.get((size, "floor", ""))
        lines += [f"#### {human_size(size)}" + (f" ({fl['lines']:,} lines)" if fl else ""), "",
                  "| path | mode | first (s) | next mean (s) | next median (s) | next / floor |",
                  "|---|---|---:|---:|---:|---:|"]
        for p, (lbl, _, _) in PATHS.items():
            for mode in MODES:
                s = summary.get((size, p, mode))
                if s:
                    lines.append(f"| {lbl} | {mode} | {_f(s['first'])} | {_f(s['next_mean'])} | "
                                 f"{_f(s['next_median'])} | {_f(_div(s['next_mean'], fl and fl['median']))} |")
        if fl:
            lines.append(f"| `wc -l` of a tmpfs copy (floor) | | | {_f(fl['median'], '{:.3f}')} (median) | | 1.00 |")
        lines += ["", "| Locus path | mode | first / direct first | direct next / Locus next | "
                      "Locus next / floor | Locus / Alluxio (first; next) |",
                  "|---|---|---:|---:|---:|---|"]
        for r in rows:
            if r["size"] != size:
                continue
            al = "; ".join(f"{v['what']}: {_f(v['first'])}; {_f(v['next'])}" for v in r["alluxio"].values())
            lines.append(f"| {PATHS[r['path']][0]} | {r['mode']} | {_f(r['first_vs_direct'])} | "
                         f"{_f(r['repeat_speedup'])}x | {_f(r['next_vs_floor'])} | {al or 'n/a'} |")
        lines.append("")
    gs = goals(summary, raw)
    lines += [f"#### Goals (they apply to the `lan` profile; this run: `{raw['profile']}`)", "",
              "| goal | size | mode | figure | bound | met |", "|---|---|---|---:|---:|---|"]
    for g in gs:
        met = {True: "yes", False: "**no**", None: "n/a"}[g["ok"]]
        lines.append(f"| {g['goal']} | {human_size(g['size'])} | {g['mode']} | {_f(g['value'])} | "
                     f"{g['bound']:g} | {met} |")
    missed = sum(1 for g in gs if g["ok"] is False)
    lines += ["", f"{len(gs) - missed} of {len(gs)} goal figures met."]
    floors = [r for r in rows if "spark_floor" in r]
    if floors:
        lines += ["", f"Spark's own floor ({PATHS[SPARK_FLOOR][0]}): the repeat-access speed-up a Spark path "
                      "could reach if its storage took no time at all, against the "
                      f"{GOAL_REPEAT_SPEEDUP:g}x goal.", "",
                  "| size | mode | Locus path | Spark floor next mean (s) | direct next / Spark floor | "
                  "Locus next / Spark floor |",
                  "|---|---|---|---:|---:|---:|"]
        for r in floors:
            f = r["spark_floor"]
            lines.append(f"| {human_size(r['size'])} | {r['mode']} | {PATHS[r['path']][0]} | {_f(f['next'])} | "
                         f"{_f(f['direct_speedup'])}x | {_f(f['locus_vs_floor'])} |")
    return "\n".join(lines) + "\n"


def chart(raw: dict, png: Path) -> Path:
    """Bars of seconds per access (log scale), one group per file size: for each path the
    first access and the mean of the next ones, in a new application per access (top) and
    in one application (bottom); the tmpfs `wc -l` floor as its own bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize(raw)
    paths = [p for p in PATHS if any((s, p, m) in summary for s in raw["sizes"] for m in MODES)]
    sizes = raw["sizes"]
    fig, axes = plt.subplots(len(MODES), 1, figsize=(max(8, 3 + 2.2 * len(sizes) * len(paths) / 4), 9),
                             squeeze=False)
    width = 0.8 / (2 * len(paths) + 1)
    colors = plt.get_cmap("tab10")
    for ax, mode in zip(axes[:, 0], MODES):
        for i, p in enumerate(paths):
            for j, (key, alpha, tag) in enumerate((("first", 1.0, "first"), ("next_mean", 0.45, "next mean"))):
                xs, ys = [], []
                for k, size in enumerate(sizes):
                    s = summary.get((size, p, mode))
                    if s and s[key] is not None:
                        xs.append(k + (2 * i + j) * width)
                        ys.append(s[key])
                ax.bar(xs, ys, width, color=colors(i), alpha=alpha, label=f"{PATHS[p][0]}: {tag}")
        fx, fy = [], []
        for k, size in enumerate(sizes):
            fl = summary.get((size, "floor", ""))
            if fl:
                fx.append(k + 2 * len(paths) * width)
                fy.append(fl["median"])
        ax.bar(fx, fy, width, color="black", label="wc -l on tmpfs (floor)")
        ax.set_yscale("log")
        ax.set_ylabel("seconds per access")
        ax.set_xticks([k + len(paths) * width for k in range(len(sizes))])
        ax.set_xticklabels([human_size(s) for s in sizes])
        ax.set_title(f"{MODES[mode]} (profile {raw['profile']})")
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(0, -0.08 - 0.0 * len(paths)))
    fig.tight_layout()
    png = Path(png)
    fig.savefig(png, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return png


# Settings that must agree for runs of different sizes to share one table.
MERGE_KEYS = ("profile", "reps", "s3a_stream", "workers", "alluxio_version", "quick", "spark_cds", "batch_apps")


def merge(docs: list[dict]) -> dict:
    """One document from harness runs that measured different sizes with the same settings:
    each size's paths still come from a single run, so its ratios stay side by side."""
    if not docs:
        raise ValueError("nothing to merge")
    first = docs[0]
    for d in docs[1:]:
        for k in MERGE_KEYS:
            if d.get(k) != first.get(k):
                raise ValueError(f"cannot merge runs with different {k}: {first.get(k)!r} and {d.get(k)!r}")
    sizes: list[int] = []
    for d in docs:
        for s in d["sizes"]:
            if s in sizes:
                raise ValueError(f"size {human_size(s)} is in more than one run")
            sizes.append(s)
    out = {k: first.get(k) for k in MERGE_KEYS}
    out.update(machine=first.get("machine", {}), sizes=sorted(sizes),
               runs=[r for d in docs for r in d["runs"]], floor=[f for d in docs for f in d["floor"]],
               wall_seconds=sum(d.get("wall_seconds", 0) for d in docs),
               harness_runs=[{"sizes": d["sizes"], "wall_seconds": d.get("wall_seconds"), "code": d.get("code", "")}
                             for d in docs])
    return out


def write_all(raw: dict, out_dir: Path, stem: str) -> dict:
    """The table (.md), the chart (.png) and the raw runs (.json) under out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(raw)
    paths = {"md": out_dir / f"{stem}.md", "png": out_dir / f"{stem}.png", "json": out_dir / f"{stem}.json"}
    paths["md"].write_text(md + f"\n![time per access]({stem}.png)\n")
    paths["json"].write_text(json.dumps(raw, indent=1))
    chart(raw, paths["png"])
    return paths


def main():
    import argparse

    ap = argparse.ArgumentParser(description="Merge line-count study runs of different sizes into one report.")
    ap.add_argument("cmd", choices=["merge"])
    ap.add_argument("--stem", required=True, help="output file name stem")
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("inputs", nargs="+", help="raw .json documents of the harness")
    a = ap.parse_args()
    try:
        raw = merge([json.loads(Path(p).read_text()) for p in a.inputs])
    except ValueError as e:
        raise SystemExit(f"linecount_report: {e}")
    out = write_all(raw, Path(a.out_dir), a.stem)
    print(out["md"])


if __name__ == "__main__":
    main()
