"""VGG-16's 28x28 and 14x14 3x3 layers and ResNet-50's 7x7 3x3 layer at batch 1, the layers the
own choice lost most on against cuDNN, or the suite cells named (NETWORK:LAYER@BATCH, each with
the epilogue its suite gives it): in tf32 (`wgmma`) and fp16 (`wgmma-fp16`), the own
choice and a wide set of tilings (every tiling the variant offers, then the cost model's first
COUNT spread over block tiles: scripts/sweep_tilings.py's candidate_configs), each timed on one
problem (CUDA events around queued launches, timer.time_device, shipped and cached tunings
ignored) and verified against float64 on a sampled image, beside cuDNN's two rows of the class
(the faster of conv + ReLU and the fused kernel), and cuBLAS's GEMM row where it runs the layer
(1x1, stride 1). Says whether a layer's loss is the choice's (some tiling beats the
references) or the kernel's (none does). One JSON line a (layer, variant); its `cudnn` holds
every reference row's time, cuBLAS's too.

Usage: python scripts/small_layers_tilings_against_cudnn.py OUT.jsonl [COUNT [CELL...]]
  e.g. ... out.jsonl 24 resnet50:layer4.1.conv2@32 resnet50:layer3.0.conv3@256"""

import json
import os
import sys
import time

os.environ.setdefault("CONVLAB_IGNORE_TUNINGS", "1")

from convlab.bench import lab, suites  # noqa: E402
from convlab.gpu import timer  # noqa: E402
from convlab.kernels import get_variant  # noqa: E402
from convlab.shapes import ConvShape  # noqa: E402
from sweep_tilings import candidate_configs, compile_tilings, time_tiling  # noqa: E402

POLICY = timer.TimingPolicy(warmup=2, min_runs=10, max_runs=200, target_rse=0.01, budget_s=0.3)
LAYERS = {"vgg16 features.17": (256, 28, 512), "vgg16 features.19": (512, 28, 512),
          "vgg16 features.24": (512, 14, 512), "resnet50 layer4.1.conv2": (512, 7, 512)}
REFERENCES = {"tf32": ("cudnn-tf32", "cudnn-nhwc-tf32", "cublas-gemm-tf32"),
              "fp16": ("cudnn-fp16", "cudnn-nhwc-fp16", "cublas-gemm-fp16")}


def layers(named: list[str]):
    """(label, shape, epilogue): the named suite cells, or LAYERS at batch 1 with their ReLU."""
    if not named:
        return [(label, ConvShape(1, c, h, h, m, 3, 1, 1, bias=True), "relu")
                for label, (c, h, m) in LAYERS.items()]
    found = []
    for cell in named:
        where, batch = cell.rsplit("@", 1)
        network, name = where.split(":")
        layer = next((x for x in suites.get_suite(network) if x.name == name), None)
        if layer is None:
            sys.exit(f"{cell}: suite {network} has no layer {name}")
        found.append((f"{network} {name} b{batch}", layer.at(int(batch)), layer.epilogue))
    return found


def main():
    out, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 24
    cells = []
    for label, shape, epilogue in layers(sys.argv[3:]):
        for name in ("wgmma", "wgmma-fp16"):
            variant = lab.layer_variant(get_variant(name))
            cells.append((label, shape, epilogue, variant,
                          candidate_configs(variant, shape, epilogue, count)))
    start = time.time()
    compile_tilings([(v, c, s, e) for _, s, e, v, configs in cells for c in configs],
                    os.cpu_count())
    print(f"compiled {sum(len(c[4]) for c in cells)} in {time.time() - start:.0f} s", flush=True)
    with open(out, "w") as journal:
        for label, shape, epilogue, variant, configs in cells:
            problem = lab.LayerProblem.draw(shape, True, seed=1)
            own = variant.config_for(shape, epilogue).as_dict()
            rows = [{"config": c, **time_tiling(variant, c, shape, epilogue, problem, POLICY)}
                    for c in configs]
            reference = {name: lab.run_layer(shape, name, POLICY, epilogue,
                                             problem=problem).timing.median_ms
                         for name in REFERENCES[variant.precision]
                         if get_variant(name).supports(shape)}
            passed = [r for r in rows if r.get("passed")]
            if not passed or own not in configs:
                print(f"{label} {variant.name}: no verified tiling, or the own choice not "
                      f"among them; see {out}", flush=True)
            best = min(passed, key=lambda r: r["median_ms"], default=None)
            own_ms = next((r.get("median_ms") for r in rows if r["config"] == own), None)
            record = {"layer": label, "variant": variant.name, "own": own, "own_ms": own_ms,
                      "best": best, "cudnn": reference, "rows": rows,
                      "failed": [r for r in rows if not r.get("passed")]}
            journal.write(json.dumps(record) + "\n")
            journal.flush()
            if best is None or own_ms is None:
                continue
            b = best["config"]
            fastest = min(reference, key=reference.get)
            print(f"{label:30} {variant.name:11} own {own_ms * 1e3:6.1f} us  best "
                  f"{best['median_ms'] * 1e3:6.1f} us ({b['bm']}x{b['bn']} k{b['split_k']} "
                  f"s{b['stages']} {b['gather']} {b['schedule']} c{b.get('cluster', 1)})  "
                  f"reference {reference[fastest] * 1e3:6.1f} us ({fastest})  "
                  f"fails {len(record['failed'])}",
                  flush=True)


if __name__ == "__main__":
    main()
