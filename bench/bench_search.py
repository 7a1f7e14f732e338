"""Benchmark: ``cselab.Index`` search over 1M vectors of width 384, exact vs FAISS.

Vectors: the shared wiki lines (11,914) encoded with the packaged all-MiniLM-L6-v2 (``avg``
pooler, as sentence-transformers uses it) through ``Index.build``, then replicated to ``--n``
rows, each copy plus Gaussian noise of norm ``--noise`` and renormalised, written with
``Index.from_vectors``. Queries: the STS-B dev sentences encoded with the same model (text the
index never saw). Measured, in one process on the same vectors:

* build: encoding the wiki lines (lines/s), writing the 1M index, FAISS HNSW and IVF builds;
* query latency p50/p99 at batch 1 and batch 64 for exact (cselab's blocked matrix product),
  FAISS flat, HNSW and IVF;
* exact-search throughput vs FAISS flat (queries/s, ratio);
* recall@10 of HNSW and IVF against exact search, at two settings each;
* memory: resident set (current and peak) after each stage, and the files on disk.

    python bench/bench_search.py --out docs/results/search_benchmark.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import harness
import numpy as np

MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def latencies(search, queries: np.ndarray, batch: int, rounds: int) -> np.ndarray:
    """Seconds per call of ``search(queries[i:i+batch])`` over ``rounds`` calls (after one
    warm-up call)."""
    search(queries[:batch])
    out = []
    for r in range(rounds):
        start = (r * batch) % max(1, len(queries) - batch)
        q = queries[start : start + batch]
        t0 = time.perf_counter()
        search(q)
        out.append(time.perf_counter() - t0)
    return np.asarray(out)


def recall_at_k(approx: np.ndarray, exact: np.ndarray) -> float:
    k = exact.shape[1]
    return float(np.mean([len(set(a) & set(e)) / k for a, e in zip(approx, exact, strict=True)]))


def dir_mib(path: Path, pattern: str = "*") -> float:
    return sum(f.stat().st_size for f in path.glob(pattern) if f.is_file()) / 2**20


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="vectors in the index")
    ap.add_argument("--noise", type=float, default=0.5, help="norm of the noise per copy")
    ap.add_argument("--queries", type=int, default=1000, help="STS-B dev sentences as queries")
    ap.add_argument("--rounds-1", type=int, default=50, help="timed batch-1 calls per backend")
    ap.add_argument("--rounds-64", type=int, default=10, help="timed batch-64 calls per backend")
    ap.add_argument("--backends", default="exact,flat,hnsw,ivf")
    ap.add_argument("--wiki-lines", type=int, default=None, help="encode only this many lines")
    ap.add_argument("--hnsw-m", type=int, default=None, help="HNSW links per node (index default)")
    ap.add_argument("--ef-construction", type=int, default=None, help="HNSW build depth")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--work-dir", default=None, help="where the index goes (default: a temp dir)")
    ap.add_argument("--out", default=None, help="markdown results file")
    args = ap.parse_args(argv)

    import torch

    from cselab import Index, load
    from cselab.evaluation.datasets import load_stsb
    from cselab.search.settings import IndexSettings

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="cselab-bench-search-"))
    work.mkdir(parents=True, exist_ok=True)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    rows: dict[str, object] = {"threads": torch.get_num_threads()}
    mem: list[tuple[str, float, float]] = [("start", *harness.rss_mib())]

    # 1. the real build path on the wiki lines
    corpus = harness.WIKI
    if args.wiki_lines:
        corpus = work / "wiki-head.txt"
        corpus.write_text("\n".join(harness.wiki_lines(args.wiki_lines)) + "\n", encoding="utf-8")
    encoder = load(args.model, pooler="avg")
    t0 = time.perf_counter()
    wiki = Index.build(
        corpus, encoder, work / "wiki.index", IndexSettings(chunk_size=4096, batch_size=128)
    )
    rows["encode_s"] = time.perf_counter() - t0
    rows["encode_lines"] = len(wiki)
    mem.append(("after encoding the wiki lines", *harness.rss_mib()))

    # 2. replicate to N rows (a --work-dir kept from an earlier run resumes step 1 for free) with noise (a stand-in for a large corpus of related sentences)
    rng = np.random.default_rng(0)
    base = np.asarray(wiki.vectors)
    dim = base.shape[1]
    big_path = work / "vectors-1m.npy"
    big = np.lib.format.open_memmap(big_path, mode="w+", dtype=np.float32, shape=(args.n, dim))
    for start in range(0, args.n, 1 << 16):
        idx = np.arange(start, min(args.n, start + (1 << 16))) % len(base)
        noise = rng.standard_normal((len(idx), dim)).astype(np.float32)
        noise *= args.noise / np.linalg.norm(noise, axis=1, keepdims=True)
        big[start : start + len(idx)] = base[idx] + noise
    big.flush()
    texts = [wiki.text(i % len(base)) for i in range(args.n)]
    t0 = time.perf_counter()
    index = Index.from_vectors(work / "big.index", big, texts, args.model, "avg")
    rows["write_s"] = time.perf_counter() - t0
    del texts, big
    mem.append(("after writing the 1M index", *harness.rss_mib()))

    pairs = load_stsb("dev", harness.SENTEVAL)
    qtexts = list(dict.fromkeys(pairs.sent1 + pairs.sent2))[: args.queries]
    queries = encoder.encode(qtexts, batch_size=128, normalize=True)

    # 3. FAISS builds
    build_s: dict[str, float] = {}
    for backend in ("hnsw", "ivf"):
        if backend in backends:
            t0 = time.perf_counter()
            from cselab.search.index import ann_params

            given = {"m": args.hnsw_m, "ef_construction": args.ef_construction}
            index.build_ann(backend, ann_params(backend, len(index), **given))
            build_s[backend] = time.perf_counter() - t0
            mem.append((f"after building {backend}", *harness.rss_mib()))
    if "flat" in backends:
        t0 = time.perf_counter()
        index._faiss_index("flat")  # the flat copy is built on first use
        build_s["flat"] = time.perf_counter() - t0
        mem.append(("after loading FAISS flat", *harness.rss_mib()))

    # 4. exact results for recall, then latency per backend
    _, exact_rows = index.search_vectors(queries, 10, backend="exact")
    lat: dict[str, dict[int, np.ndarray]] = {}
    for backend in backends:
        lat[backend] = {}
        for batch, rounds in ((1, args.rounds_1), (64, args.rounds_64)):
            lat[backend][batch] = latencies(
                lambda q, b=backend: index.search_vectors(q, 10, backend=b),
                queries,
                batch,
                rounds,
            )
    recalls: list[tuple[str, str, float]] = []
    if "hnsw" in backends:
        for ef in (64, 128, 256):
            _, got = index.search_vectors(queries, 10, backend="hnsw", ef_search=ef)
            recalls.append(("hnsw", f"efSearch={ef}", recall_at_k(got, exact_rows)))
    if "ivf" in backends:
        nlist = index.meta["ann"]["ivf"]["nlist"]
        nprobe0 = index.meta["ann"]["ivf"]["nprobe"]
        for nprobe in (nprobe0, 4 * nprobe0, 16 * nprobe0):
            _, got = index.search_vectors(queries, 10, backend="ivf", nprobe=nprobe)
            recalls.append(("ivf", f"nlist={nlist}, nprobe={nprobe}", recall_at_k(got, exact_rows)))
    if "flat" in backends:
        _, got = index.search_vectors(queries, 10, backend="flat")
        recalls.append(("flat", "-", recall_at_k(got, exact_rows)))
    mem.append(("end", *harness.rss_mib()))

    # 5. report
    from cselab.evaluation.report import markdown_table
    from cselab.search.index import LINES_FILE, OFFSETS_FILE, TEXTS_FILE, VECTORS_FILE

    build_rows = [
        [f"encode {rows['encode_lines']:,} wiki lines (`Index.build`, MiniLM, batch 128)",
         f"{rows['encode_s']:.1f}", f"{rows['encode_lines'] / rows['encode_s']:.0f} lines/s"],
        [f"write the {args.n:,}-row index (`Index.from_vectors`)", f"{rows['write_s']:.1f}", ""],
    ]  # fmt: skip
    for backend, sec in build_s.items():
        what = {"hnsw": "FAISS HNSW build", "ivf": "FAISS IVF train + add",
                "flat": "FAISS flat (copy into IndexFlatIP)"}[backend]  # fmt: skip
        params = index.meta.get("ann", {}).get(backend, {})
        build_rows.append([f"{what} {params if params else ''}", f"{sec:.1f}", ""])
    qps: dict[tuple[str, int], float] = {}
    latency_rows = []
    for backend, by_batch in lat.items():
        for batch, secs in by_batch.items():
            qps[backend, batch] = batch / float(np.median(secs))
            latency_rows.append([backend, batch, f"{1e3 * np.percentile(secs, 50):.2f}",
                                 f"{1e3 * np.percentile(secs, 99):.2f}",
                                 f"{qps[backend, batch]:.1f}", len(secs)])  # fmt: skip
    vers = harness.versions(("torch", "numpy", "faiss"), missing=None)
    lines = [
        "# Search benchmark: `cselab.Index`, exact vs FAISS",
        "",
        f"Command: `{harness.command('bench_search.py', argv)}`  ",
        f"CPU: {harness.cpu_model()}, {os.cpu_count()} logical cores visible; torch threads "
        f"{rows['threads']}; faiss-cpu and numpy with their default threads.  ",
        "**The machine is shared with 4-5 other agents working at the same time**: timings are "
        "noisy and likely pessimistic; compare the ratios within this run rather than the "
        "absolute numbers with other machines.  ",
        f"Python {vers['python']}, torch {vers['torch']}, numpy {vers['numpy']}"
        + (f", faiss-cpu {vers['faiss']}" if vers["faiss"] else ""),
        "",
        "## Vectors",
        "",
        f"{rows['encode_lines']:,} wiki lines (`{harness.WIKI.name}`) encoded with {args.model} "
        f"(avg pooler) by `Index.build`, then **replicated with noise** to {args.n:,} rows "
        f"of width {dim}: copy i is line i mod {rows['encode_lines']:,} plus a Gaussian vector "
        f"of norm {args.noise}, renormalised (so about {args.n // rows['encode_lines']} noisy "
        "copies of each sentence). Queries: "
        f"{len(qtexts)} distinct STS-B dev sentences encoded with the same model.",
        "",
        "## Build",
        "",
        markdown_table(["step", "seconds", "rate"], build_rows, align="lr"),
        "",
        "## Query latency (k = 10)",
        "",
        markdown_table(
            ["backend", "batch", "p50 ms", "p99 ms", "queries/s (median)", "calls"],
            latency_rows,
            align="lrrrrr",
        ),  # fmt: skip
    ]
    if ("exact", 64) in qps and ("flat", 64) in qps:
        lines += [
            "",
            f"Exact-search throughput vs FAISS flat, batch 64: {qps['exact', 64]:.1f} vs "
            f"{qps['flat', 64]:.1f} queries/s, ratio exact/flat = "
            f"**{qps['exact', 64] / qps['flat', 64]:.2f}**; batch 1: ratio "
            f"{qps['exact', 1] / qps['flat', 1]:.2f}.",
        ]
    big = work / "big.index"
    lines += [
        "",
        "## Recall@10 against exact search",
        "",
        markdown_table(["backend", "setting", "recall@10"],
                       [[b, s, f"{r:.3f}"] for b, s, r in recalls], align="llr"),
        "",
        "## Memory",
        "",
        markdown_table(["point", "RSS MiB", "peak RSS MiB"],
                       [[name, f"{cur:.0f}", f"{peak:.0f}"] for name, cur, peak in mem],
                       align="lrr"),
        "",
        f"On disk: vectors {dir_mib(big, VECTORS_FILE):.0f} MiB, texts + offsets + line numbers "
        f"{sum(dir_mib(big, f) for f in (TEXTS_FILE, OFFSETS_FILE, LINES_FILE)):.0f} MiB"
        + "".join(f", {f.name} {f.stat().st_size / 2**20:.0f} MiB"
                  for f in sorted(big.glob("faiss-*.index")))
        + ". Exact search reads the vectors through a memory map (they count in RSS as page "
        "cache once touched); FAISS indexes are loaded into memory.",
        "",
    ]  # fmt: skip
    report = "\n".join(lines)
    print(report)
    if args.out:
        harness.write_page(args.out, report)
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return {"qps": qps, "recalls": recalls, "build_s": build_s}


if __name__ == "__main__":
    main()
