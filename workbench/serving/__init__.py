"""Serving: what an inference engine did under load, from each request down to its steps and kernels."""
