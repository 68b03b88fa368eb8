"""pactl's network as ONNX: onnxruntime gives torch's vectors on image files, the batch axis
is dynamic, the preprocessing is in the metadata, and files of other networks are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_api import tiny_run


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(best.pt of a tiny network, its model.onnx), exported once for the module."""
    from pactl.interop.onnx_model import export_onnx

    root = tmp_path_factory.mktemp("onnx")
    best = tiny_run(root)
    export_onnx(best, root / "model.onnx")
    return best, root / "model.onnx"


def test_onnxruntime_embeds_image_files_as_torch_does(exported: tuple[Path, Path]) -> None:
    """The reference is pactl's own embedding (embed_files) of the same decoded files."""
    import torch

    from pactl.checkpoint import load_model
    from pactl.console import QUIET
    from pactl.embed import embed_files
    from pactl.interop.onnx_model import open_onnx
    from pactl.loaders import collate, loader_for

    best, onnx_file = exported
    files = sorted((best.parent / "photos").rglob("*.png"))
    model, config, _ = load_model(best)
    expected = embed_files(model, files, config, torch.device("cpu"), QUIET, prepare=False)
    batch = collate([loader_for(files, None, config, 1, 0, torch.device("cpu")).dataset[i]
                     for i in range(len(files))])  # fmt: skip
    network = open_onnx(onnx_file)
    got = network(batch.images.numpy())  # 16 images: the file was exported with 2
    assert got.shape == expected.vectors.shape
    cosine = np.sum(got.astype(np.float64) * expected.vectors, axis=1)
    assert cosine.min() > 1 - 1e-4
    assert network(batch.images[:1].numpy()).shape == (1, expected.vectors.shape[1])


def test_metadata_names_the_preprocessing_and_the_weights(exported: tuple[Path, Path]) -> None:
    import onnx

    from pactl.checkpoint import load

    best, onnx_file = exported
    model = onnx.load(str(onnx_file))
    props = {p.key: p.value for p in model.metadata_props}
    payload = load(best)
    assert props["pactl.fingerprint"] == payload["fingerprint"]
    steps = json.loads(props["pactl.preprocessing"])
    config = payload["model_config"]
    assert (steps["crop"], steps["resize"]) == (config["image_size"], config["resize_size"])
    assert steps["mean"] == list(config["mean"]) and steps["std"] == list(config["std"])
    batch = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch.dim_param and not batch.dim_value  # a named, dynamic axis
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17


def test_an_onnx_file_of_another_origin_is_refused(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    from pactl.errors import PactlError
    from pactl.interop.onnx_model import open_onnx

    shape = [1, 3, 8, 8]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["images"], ["embeddings"])],
        "foreign",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, shape)],
    )
    onnx.save(helper.make_model(graph), str(tmp_path / "x.onnx"))
    with pytest.raises(PactlError, match="not a network pactl exported") as e:
        open_onnx(tmp_path / "x.onnx")
    assert "\n" not in str(e.value)
    (tmp_path / "junk.onnx").write_bytes(b"\x00garbage")
    with pytest.raises(PactlError, match="not an ONNX file|not a network pactl exported"):
        open_onnx(tmp_path / "junk.onnx")


def test_an_onnx_network_other_than_the_bundles_is_refused_naming_what_differs(
    exported: tuple[Path, Path],
) -> None:
    from pactl.checkpoint import load
    from pactl.errors import PactlError
    from pactl.interop.onnx_model import check_same_network, open_onnx

    best, onnx_file = exported
    network = open_onnx(onnx_file)
    config = load(best)["model_config"]
    same = {"dimension": 16, "fingerprint": network.fingerprint, "model_config": config}
    check_same_network(network, same, "bundle")
    other = {**same, "dimension": 64, "fingerprint": "f" * 64}
    with pytest.raises(PactlError, match=r"dimension 16 vs 64; weights fingerprint"):
        check_same_network(network, other, "bundle")
