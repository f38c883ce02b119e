"""The model zoo: built-in models with seeded weights, real architectures (`hf:`, `hf-config:`, `torchvision:`,
`timm:`), user factories and exported programs.

`load_model(ref, **config)` is the one entry point; everything it returns is a `LoadedModel`
(fp32, CPU, eval mode) that knows how to make its own example inputs. Built-ins are constructed
in code and are bit-identical for the same name and config; nothing is downloaded.
"""

from workbench.models.loaded import LoadedModel, count_parameters
from workbench.models.registry import describe_model, list_models, load_model

__all__ = ["LoadedModel", "count_parameters", "describe_model", "list_models", "load_model"]
