"""The smaller inputs: Nsight Compute's raw CSV, ONNX Runtime's profile, TensorRT per-layer timings, CUDA memory
snapshots and HLO module text.
"""
