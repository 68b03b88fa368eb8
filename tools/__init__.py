"""Tools beside the benchmarks, each run from the repository root as `python -m tools.NAME`:
real_sets (the offline real image sets), lite0_weights (ImageNet weights for EfficientNet-Lite0),
readme_picture (the README's picture), gpu_check (the GPU path on a card), binary_probe (a kept
binary bundle's recall at each setting); docker_check.sh builds and runs the cpu image."""
