"""FSDP with leanbatch's adapters against DDP: for a machine with GPUs.

Lightning refuses FSDP without a GPU (``The strategy fsdp requires a GPU accelerator``), and
accelerate ignores its FSDP plugin on the CPU (it trains DDP there: see
tests/test_hf_distributed.py), so the CPU tests cover FSDP only through torch's ``fully_shard``
in a plain loop (tests/test_distributed_resume.py). This script runs the adapters' FSDP paths
where they can run, each twice on every visible GPU, once under DDP and once under FSDP, and
checks that the plans, the served batches and the scores agree (the scores up to float sums
that sharding reorders). It prints one line per check.

    python benchmarks/gpu_fsdp.py [--devices N]          # Lightning strategy="ddp" vs "fsdp"
    python benchmarks/gpu_fsdp.py --hf [--devices N]     # the HF Trainer: accelerate DDP vs FSDP

Exit status 0 when every check passes, 1 otherwise, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def fit(strategy: str, devices: int, out: str) -> None:
    """One fit with InfoBatch under ``strategy``; rank 0 saves the plans, batches and scores."""
    from lightning_job import EPOCHS, make_data, make_module, make_trainer, quiet

    from leanbatch import InfoBatch
    from leanbatch.lightning import LeanBatchCallback

    quiet()
    ib = InfoBatch(make_data(2003), EPOCHS, prune_ratio=0.5, delta=0.75, seed=5)
    lb = LeanBatchCallback(ib)
    module = make_module(lb, loss="ce")
    trainer = make_trainer(
        [lb], strategy=strategy, accelerator="gpu", devices=devices, use_distributed_sampler=False
    )
    trainer.fit(module)
    if trainer.global_rank == 0:
        torch.save(
            {"stats": ib.epoch_stats, "rows": module.rows, "scores": ib.scores.values.cpu()},
            os.path.join(out, f"{strategy}.pt"),
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=max(1, torch.cuda.device_count()))
    parser.add_argument("--hf", action="store_true", help="the Hugging Face Trainer under torchrun")
    parser.add_argument("--strategy", default=None, help=argparse.SUPPRESS)  # a launched run
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this check needs a GPU")
        return 2
    if args.strategy is not None:  # Lightning re-runs this script in every process it launches
        fit(args.strategy, args.devices, args.out)
        return 0
    if args.hf:
        return hf(args.devices)
    out = tempfile.mkdtemp()
    for strategy in ("ddp", "fsdp"):
        import subprocess

        cmd = [sys.executable, __file__, "--devices", str(args.devices), "--strategy", strategy, "--out", out]
        if subprocess.run(cmd).returncode != 0:
            print(f"FAIL {strategy} fit")
            return 1
    ddp, fsdp = (torch.load(os.path.join(out, f"{s}.pt"), weights_only=False) for s in ("ddp", "fsdp"))
    checks = {
        "the same plans": ddp["stats"] == fsdp["stats"],
        "the same batches": [r[2] for r in ddp["rows"]] == [r[2] for r in fsdp["rows"]],
        "the same scores (1e-4)": torch.allclose(
            ddp["scores"], fsdp["scores"], rtol=1e-4, atol=1e-5, equal_nan=True
        ),
    }
    return report(checks)


def report(checks: dict[str, bool]) -> int:
    """One line per check; 0 when all pass, else 1."""
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


def hf(devices: int) -> int:
    """tests/hf_ddp_worker.py on ``devices`` GPUs under torchrun, as DDP and with accelerate's FSDP."""
    import subprocess

    out = tempfile.mkdtemp()
    worker = os.path.join(HERE, "..", "tests", "hf_ddp_worker.py")
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(devices)]
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..", "tests"))
    for name, extra in (("ddp", []), ("fsdp", ["--fsdp"])):
        if subprocess.run([*run, worker, os.path.join(out, name), *extra, "--gpu"], env=env).returncode:
            print(f"FAIL HF {name} run")
            return 1
    ddp, fsdp = (torch.load(os.path.join(out, s, "rank0.pt"), weights_only=False) for s in ("ddp", "fsdp"))
    return report(
        {
            "HF: FSDP really sharded the model": fsdp["fsdp"]
            and fsdp["wrapper"] != "DistributedDataParallel",
            "HF: the same plans": ddp["plans"] == fsdp["plans"] and ddp["epoch_stats"] == fsdp["epoch_stats"],
            "HF: the same batches and weights": [(m["indices"], m["weights"]) for m in ddp["micro"]]
            == [(m["indices"], m["weights"]) for m in fsdp["micro"]],
            "HF: the same scores (1e-4)": torch.allclose(
                ddp["scores"], fsdp["scores"], rtol=1e-4, atol=1e-5, equal_nan=True
            ),
        }
    )


if __name__ == "__main__":
    sys.exit(main())
