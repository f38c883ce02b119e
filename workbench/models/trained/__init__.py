"""Trained weights for the built-in models, made in code from data every machine has, so accuracy means
something offline: tiny-gpt learns the Python standard library's own source (`corpus`), convnet learns
scikit-learn's bundled handwritten digits (`digits`). Training is seeded and bounded in steps (`training`),
cached on disk (`checkpoint`), and evaluated on held-out data (`evaluate`); `recipes` ties them to the
registry's `weights="trained"`.

This `__init__` imports nothing, so importing one module of the package loads only what it needs.
"""
