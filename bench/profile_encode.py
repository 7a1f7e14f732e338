"""Where encoding time goes: ``torch.profiler`` over cselab's ``encode`` and the peer's (CPU).

The same 2,048 shared wiki lines, the packaged all-MiniLM-L6-v2, batch 128, at most 256 tokens;
each side warmed on 256 sentences, then profiled; prints the top operators by self CPU time
(the table of ``docs/results/encode_benchmark.md``). Take it on a quiet machine.

    python bench/profile_encode.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import harness
from torch.profiler import ProfilerActivity, profile


def show(name: str, encode: Callable[[list[str]], object], sentences: list[str]) -> None:
    encode(sentences[:256])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        encode(sentences)
        elapsed = time.perf_counter() - t0
    print(f"### {name}: {len(sentences) / elapsed:.1f} sentences/s while profiled")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


def main() -> None:
    import cselab

    sentences = harness.wiki_lines(2048)
    model = str(harness.minilm_path())
    enc = cselab.load(model)
    show("cselab fp32 (eager)",
         lambda s: enc.encode(s, batch_size=128, normalize=True, max_seq_len=256), sentences)  # fmt: skip
    peer = harness.peer_api().SentenceTransformer(model, device="cpu")
    peer.max_seq_length = 256
    show("peer fp32", lambda s: peer.encode(s, batch_size=128, convert_to_tensor=True), sentences)


if __name__ == "__main__":
    main()
