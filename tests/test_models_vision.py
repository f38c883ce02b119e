"""torchvision: and timm: image classifiers: seeded random weights unless cached, inputs of their own size."""

from __future__ import annotations

import json

import pytest
import torch

from workbench.errors import UnknownModelError, WorkbenchError
from workbench.models import load_model


@pytest.fixture
def empty_torch_hub(tmp_path, monkeypatch):
    """A torch hub folder with no checkpoints, so no weights are cached."""
    torch_hub = pytest.importorskip("torch.hub")
    monkeypatch.setattr(torch_hub, "_hub_dir", str(tmp_path / "hub"))
    return tmp_path / "hub"


@pytest.fixture
def empty_hf_cache(tmp_path, monkeypatch):
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return tmp_path / "hf-cache"


# --- torchvision ----------------------------------------------------------------------------------------------

TORCHVISION = ["resnet50", "vit_b_16", "convnext_tiny", "efficientnet_b0", "mobilenet_v3_small", "mobilenet_v3_large"]


@pytest.mark.parametrize("name", TORCHVISION)
def test_torchvision_models_build_with_random_weights_and_run(empty_torch_hub, name):
    models = pytest.importorskip("torchvision.models")
    loaded = load_model(f"torchvision:{name}")
    assert (loaded.source, loaded.weights, loaded.default_seq) == ("torchvision", "random", None)
    (images,) = loaded.make_inputs(1)
    assert images.shape == (1, 3, 224, 224)
    assert loaded.parameter_count == models.get_model_weights(name).DEFAULT.meta["num_params"]
    with torch.no_grad():
        assert loaded.module(images).shape == (1, 1000)


def test_torchvision_inputs_take_the_weights_crop_size(empty_torch_hub):
    models = pytest.importorskip("torchvision.models")
    crop = models.get_model_weights("efficientnet_b1").DEFAULT.transforms().crop_size[0]
    assert crop != 224  # the point of this model here
    (images,) = load_model("torchvision:efficientnet_b1").make_inputs(2)
    assert images.shape == (2, 3, crop, crop)


def test_cached_torchvision_weights_load_as_real(empty_torch_hub):
    models = pytest.importorskip("torchvision.models")
    weights = models.get_model_weights("mobilenet_v3_small").DEFAULT
    torch.manual_seed(3)
    trained = models.mobilenet_v3_small().state_dict()
    checkpoint = empty_torch_hub / "checkpoints" / weights.url.rsplit("/", 1)[-1]
    checkpoint.parent.mkdir(parents=True)
    torch.save(trained, checkpoint)
    loaded = load_model("torchvision:mobilenet_v3_small")
    assert loaded.weights == "real" and loaded.config["pretrained"] == str(weights)
    state = loaded.module.state_dict()
    assert all(torch.equal(state[key], trained[key]) for key in trained)


def test_torchvision_seeds_give_the_same_weights_and_leave_the_global_rng(empty_torch_hub):
    pytest.importorskip("torchvision")
    before = torch.random.get_rng_state()
    first = load_model("torchvision:mobilenet_v3_small").module.state_dict()
    assert torch.equal(torch.random.get_rng_state(), before)
    again = load_model("torchvision:mobilenet_v3_small").module.state_dict()
    other = load_model("torchvision:mobilenet_v3_small", seed=1).module.state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first if first[k].is_floating_point())


def test_unknown_torchvision_model_lists_the_available_ones():
    models = pytest.importorskip("torchvision.models")
    with pytest.raises(UnknownModelError) as caught:
        load_model("torchvision:resnet5000")
    assert all(name in str(caught.value) for name in models.list_models(module=models))


def test_vision_models_take_only_a_seed():
    pytest.importorskip("torchvision")
    with pytest.raises(WorkbenchError, match="valid: seed"):
        load_model("torchvision:resnet50", layers=2)


# --- timm -----------------------------------------------------------------------------------------------------

TIMM = ["resnet50", "vit_base_patch16_224", "convnext_tiny", "efficientnet_b0", "mobilenetv3_small_100",
        "mobilenetv3_large_100"]


@pytest.mark.parametrize("name", TIMM)
def test_timm_models_build_with_random_weights_and_run(empty_hf_cache, empty_torch_hub, name):
    pytest.importorskip("timm")
    loaded = load_model(f"timm:{name}")
    assert (loaded.source, loaded.weights) == ("timm", "random")
    (images,) = loaded.make_inputs(1)
    assert images.shape == (1, *loaded.module.pretrained_cfg["input_size"])
    with torch.no_grad():
        assert loaded.module(images).shape == (1, 1000)


def test_cached_timm_weights_load_as_real(empty_hf_cache, empty_torch_hub):
    timm = pytest.importorskip("timm")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    name = "mobilenetv3_small_100"
    torch.manual_seed(5)
    model = timm.create_model(name, pretrained=False)
    hub_id = model.pretrained_cfg["hf_hub_id"]
    repo = empty_hf_cache / f"models--{hub_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    trained = model.state_dict()
    safetensors_torch.save_file({k: v.contiguous() for k, v in trained.items()}, snapshot / "model.safetensors")
    loaded = load_model(f"timm:{name}")
    assert loaded.weights == "real" and loaded.config["pretrained"] == hub_id
    state = loaded.module.state_dict()
    assert all(torch.equal(state[key], trained[key]) for key in trained)


def test_unknown_timm_model_names_close_matches():
    pytest.importorskip("timm")
    with pytest.raises(UnknownModelError) as caught:
        load_model("timm:resnet5O")
    assert "close matches" in str(caught.value) and "resnet50" in str(caught.value)


def test_capture_of_a_torchvision_model_writes_ops_and_numerics(empty_torch_hub, tmp_path):
    pytest.importorskip("torchvision")
    from click.testing import CliRunner

    from workbench.cli import main
    from workbench.trace.store.bundle import open_bundle

    result = CliRunner().invoke(main, ["capture", "--model", "torchvision:mobilenet_v3_small", "--variants", "eager",
                                       "--batch", "1", "--iterations", "2", "--warmup", "1", "--threads", "1",
                                       "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["runs"]
    bundle = open_bundle(run["run_id"], tmp_path)
    assert bundle.record.model["weights"] == "random" and bundle.record.model["config"]["input_size"] == [3, 224, 224]
    assert bundle.record.numerics["top1_agreement"] == 1.0
    assert bundle.trace().events.column("kind").to_pylist().count("op") > 0
