"""Benchmark: encoding speed, cselab ``SentenceEncoder.encode`` vs ``SentenceTransformer.encode``.

The same model (the packaged all-MiniLM-L6-v2: mean pooling, L2-normalised), the same sentences
(the 11,914 shared wiki1m lines, ``--sentences`` of them), the same batch size and length limit
(256 tokens, the model's own ``max_seq_length``). Each side runs in a fresh process, alternating,
``--rounds`` rounds; the table gives the median sentences/s and the ratio cselab / peer.

* fp32: both sides in float32; the vectors are compared (largest absolute difference).
* ``cselab-compiled fp32``: the same, through one ``torch.compile`` graph
  (``cselab.load(..., compile_inference=True)``); its first pass includes the compile.
  ``cselab-frozen fp32``: the same graph compiled with Inductor's ``freezing`` (the weights
  become constants of the graph, which lets Inductor pre-pack them for oneDNN).
* bf16: cselab ``encode(..., precision="bf16")`` (autocast; the weights stay float32) against the
  peer's model loaded in bfloat16 (``model_kwargs={"dtype": torch.bfloat16}``: its only bf16 mode).
  Both vectors are compared with the fp32 peer's (cosine to the fp32 vector, the worst sentence).

Both sides sort the sentences by length and pad each batch to its longest sentence. cselab's
CPU inference forward also runs on the real tokens only (:mod:`cselab.model.unpad`), so it
computes no padded positions; the table gives each side's padded-position count.

    python bench/bench_encode.py                     # writes docs/results/encode_benchmark.md
    python bench/bench_encode.py --sentences 500 --rounds 1 --out /tmp/encode.md   # quick look
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import numpy as np

DEFAULT_OUT = harness.RESULTS / "encode_benchmark.md"
SIDES = ("peer fp32", "cselab fp32", "cselab-compiled fp32", "cselab-frozen fp32", "peer bf16",
         "cselab bf16")  # fmt: skip
TARGET_FP32 = 1.8  # cselab / peer sentences/s in fp32 (the encoding target)


def worker(args: argparse.Namespace, side: str, out: Path) -> dict[str, Any]:
    """Encode with one side in this process; the timed second pass, vectors saved to ``out``."""
    import torch

    who, precision = side.split()
    sentences = harness.wiki_lines(args.sentences, args.text)
    if who == "peer":
        from harness import peer_api

        kwargs = {"dtype": torch.bfloat16} if precision == "bf16" else {}
        model = peer_api().SentenceTransformer(args.model, device="cpu", model_kwargs=kwargs)
        model.max_seq_length = args.max_seq_len

        def run(texts: list[str] = sentences) -> np.ndarray:
            vec = model.encode(texts, batch_size=args.batch_size, convert_to_tensor=True)
            return vec.float().numpy()

        module = model[0]  # the Transformer module: its preprocess() pads each batch
        widths: list[int] = []
        prep = module.preprocess

        def counting(*a: Any, **k: Any) -> Any:
            features = prep(*a, **k)
            widths.append(int(features["attention_mask"].numel()))
            return features

        module.preprocess = counting
    else:
        import cselab

        # cselab-compiled: encode through one torch.compile graph (SentenceEncoder.compile_inference)
        # cselab-frozen: the same with Inductor's freezing (weights folded in as constants)
        encoder = cselab.load(args.model)
        if who == "cselab-compiled":
            encoder.compile_inference()
        elif who == "cselab-frozen":
            encoder.compile_inference(options={"freezing": True})
        widths = []

        def run(texts: list[str] = sentences) -> np.ndarray:
            return encoder.encode(
                texts,
                batch_size=args.batch_size,
                normalize=True,
                max_seq_len=args.max_seq_len,
                precision=precision,
            )

        tokenize = encoder.tokenize

        def counting(texts: Any, *a: Any, **k: Any) -> Any:
            features = tokenize(texts, *a, **k)
            mask = features["attention_mask"]
            # the packed forward computes the real tokens only
            widths.append(int(mask.sum() if encoder.unpad_inference else mask.numel()))
            return features

        encoder.tokenize = counting
    t0 = time.perf_counter()
    run(sentences[: 4 * args.batch_size])  # warm-up: first-call costs are not the steady rate
    first = time.perf_counter() - t0  # with the compiled side's compile
    widths.clear()
    t0 = time.perf_counter()
    vectors = run()
    elapsed = time.perf_counter() - t0
    np.save(out, vectors)
    return {
        "side": side,
        "seconds": elapsed,
        "first_pass_s": first,
        "padded_positions": sum(widths),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="default: the packaged all-MiniLM-L6-v2")
    p.add_argument("--text", type=Path, default=harness.WIKI)
    p.add_argument("--sentences", type=int, default=11914)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--max-seq-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--vectors", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.model is None:
        args.model = harness.minilm_path()
    if args.worker:
        harness.reply(worker(args, args.worker, args.vectors))
        return
    sides = harness.pick_sides(args.sides, SIDES)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-encode-") as tmp:
        vec = {s: Path(tmp) / f"{s.replace(' ', '-')}.npy" for s in sides}
        common = ["--model", str(args.model), "--text", str(args.text),
                  "--sentences", str(args.sentences), "--batch-size", str(args.batch_size),
                  "--max-seq-len", str(args.max_seq_len)]  # fmt: skip

        def done(rnd: int, side: str, res: dict[str, Any]) -> None:
            rate = args.sentences / res["seconds"]
            print(f"round {rnd + 1} {side}: {rate:.1f} sentences/s", flush=True)

        results = harness.run_sides(
            __file__, sides, args.rounds,
            lambda side, _: ["--worker", side, "--vectors", str(vec[side]), *common], done=done,
        )  # fmt: skip
        vectors = {s: np.load(vec[s]) for s in sides}
    report = render(args, sides, results, vectors, time.perf_counter() - t_start, argv)
    print(report)
    harness.write_page(args.out, report)
    print(f"wrote {args.out}")


def render(args: argparse.Namespace, sides: list[str], results: dict[str, list[dict[str, Any]]],
           vectors: dict[str, np.ndarray], total_s: float, argv: list[str] | None) -> str:  # fmt: skip
    import torch

    from cselab.evaluation.report import markdown_table

    cpu = harness.cpu_description()
    rate = {s: harness.median(args.sentences / r["seconds"] for r in results[s]) for s in sides}
    ref = vectors.get("peer fp32")
    rows = []
    for side in sides:
        who, precision = side.split()
        peer = f"peer {precision}"
        ours = who.startswith("cselab")
        ratio = f"**{rate[side] / rate[peer]:.2f}×**" if ours and peer in rate else "—"
        diff = cos = "—"
        if ref is not None and side != "peer fp32":
            v = vectors[side]
            diff = f"{np.abs(v - ref).max():.2e}"
            cosines = (v * ref).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(ref, axis=1)
            cos = f"{cosines.min():.6f}"
        per_round = ", ".join(f"{args.sentences / r['seconds']:.1f}" for r in results[side])
        first = harness.median(r["first_pass_s"] for r in results[side])
        rows.append([side, f"{rate[side]:.1f}", per_round, f"{first:.1f}",
                     f"{results[side][0]['padded_positions']:,}", ratio, diff, cos])  # fmt: skip
    lines = [
        "# Encoding speed: cselab `encode` vs `SentenceTransformer.encode` (CPU)",
        "",
        f"- device: {cpu['model']}, {cpu['logical_cpus']} logical CPUs, torch threads "
        f"{torch.get_num_threads()}, SIMD {', '.join(cpu['simd'])}, native bf16 matmul: "
        f"{'yes' if cpu['native_bf16'] else 'no'}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in harness.versions().items()),
        f"- model: packaged all-MiniLM-L6-v2 (mean pooling, normalised); {args.sentences} wiki1m "
        f"sentences; batch {args.batch_size}; at most {args.max_seq_len} tokens",
        f"- command: `{harness.command('bench_encode.py', argv)}` "
        f"({args.rounds} rounds, each side in a fresh process, alternating; the second of two "
        f"passes timed (the first: {4 * args.batch_size} sentences); whole run {total_s / 60:.1f} min)",
        "",
        markdown_table(
            ["side", "sentences/s (median)", "per round", "first pass s (incl. compile)",
             "token positions computed",
             "vs peer, same precision", "largest abs. difference to peer fp32",
             "worst cosine to peer fp32"],
            rows,
        ),
    ]  # fmt: skip
    for side in sides:
        if side.startswith("cselab") and side.endswith("fp32") and "peer fp32" in rate:
            ratio = rate[side] / rate["peer fp32"]
            met = "met" if ratio >= TARGET_FP32 else "not met"
            lines += ["", f"{side}: target ≥ {TARGET_FP32}× the peer: {ratio:.2f}×, {met}."]
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
