"""The training step alone, timed in process: ``forward + backward + optimiser`` at the trainer's
settings, on batches made beforehand (so neither the host's batch nor the loop's bookkeeping
counts). Run it from two trees in alternating processes to compare them:

    PYTHONPATH=src python bench/step_time.py --precision bf16
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import harness


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--steps", type=int, default=22, help="timed steps (after 3 warm-up steps)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=32)
    args = p.parse_args(argv)
    from cselab.app.train import build_trainer
    from cselab.config import load_config

    with tempfile.TemporaryDirectory() as work:
        overrides = [
            f"--model.name_or_path={harness.minilm_path()}", f"--data.train_file={harness.WIKI}",
            f"--data.cache_dir={work}/cache", f"--train.output_dir={work}/out",
            f"--train.batch_size={args.batch_size}", f"--model.max_seq_len={args.max_seq_len}",
            "--train.max_steps=1000", "--train.eval_steps=0", "--train.report_to=[]",
            f"--train.precision={args.precision}",
        ]  # fmt: skip
        trainer = build_trainer(load_config(None, overrides))
        trainer.encoder.train()
        batches = [trainer.batch_for(step) for step in range(3 + args.steps)]
        times = []
        for step, batch in enumerate(batches):
            trainer.step = step
            start = time.perf_counter()
            trainer.train_step(batch)
            if step >= 3:
                times.append(time.perf_counter() - start)
    median, mean = statistics.median(times) * 1e3, statistics.mean(times) * 1e3
    print(f"{args.precision}: median step {median:.1f} ms, mean {mean:.1f} ms ({len(times)} steps)")


if __name__ == "__main__":
    main()
