#!/usr/bin/env python3
"""What fp16 inference costs a torchvision model by itself: PyTorch fp16 (channels_last, as
bench_torch.py runs it) against PyTorch fp32 on the same weights and inputs, with the metric of
`onnx2ait validate` (max |fp16 - fp32| / max |fp32| over the logits) and top-1 agreement. Run on
the GPU machine; it tells whether a GPU validation error is onnx2ait's or the network's own
sensitivity to fp16 rounding.

    fp16_error.py [--models resnet50,mobilenet_v2] [--seeds 2] [--weights both|auto] [--json-out F]

--weights both (default) measures both weight sets of export_torchvision.py: BatchNorm statistics
calibrated on random images and torchvision's initialisation as is. --weights auto measures the
set the export uses (build_model's calibrate="auto"): what scripts/gpu-bench.sh bounds its
validation with (scripts/gpu/checks.py validate --sensitivity).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_torchvision import build_model  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet50,mobilenet_v2")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--weights", choices=["both", "auto"], default="both")
    p.add_argument("--json-out")
    a = p.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for name in a.models.split(","):
        for calibrate in (True, False) if a.weights == "both" else ("auto",):
            f32, desc = build_model(name, calibrate=calibrate)
            f32 = f32.to("cuda")
            f16 = build_model(name, calibrate=calibrate)[0].to("cuda", torch.float16, memory_format=torch.channels_last)
            calibrated = "calibrated" in desc
            for seed in range(a.seeds):
                x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(seed)).to("cuda")
                with torch.inference_mode():
                    ref = f32(x).float()
                    out = f16(x.half().contiguous(memory_format=torch.channels_last)).float()
                err = ((out - ref).abs().max() / ref.abs().max()).item()
                top1 = bool((out.argmax(1) == ref.argmax(1)).all().item())
                row = {"model": name, "weights": "calibrated" if calibrated else "torchvision init", "seed": seed,
                       "max_abs_ref": ref.abs().max().item(), "rel_err": err, "top1_agrees": top1}
                rows.append(row)
                print(f"{name:14s} {row['weights']:17s} seed {seed}: PyTorch fp16 vs fp32 rel err {err:.3e}, "
                      f"max|fp32| {row['max_abs_ref']:.3e}, top-1 {'same' if top1 else 'DIFFERENT'}", flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
