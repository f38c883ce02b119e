"""LLM inference: generation (prefill, KV-cached decode, speculative decoding) and its analytical model."""
