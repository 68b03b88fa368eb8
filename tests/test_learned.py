"""Learned binary codes: the code losses against float64 transcriptions and hand-computed cases,
the hash centres against scipy's Hadamard matrices, and `pactl train --bits` end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import one_error, run_cli
from scipy.linalg import hadamard as scipy_hadamard

from pactl.codes import hamming
from pactl.codes.learned import (
    CODE_PROXIES,
    CentreCosineLoss,
    CodeLoss,
    build_code_loss,
    hadamard,
    hash_centres,
    quantization_loss,
)
from pactl.losses import ProxyAnchorLoss


def reference_quantization(x: np.ndarray) -> float:
    """Mean over rows of 1 - cos(x, sign(x)), in float64, from the cosine's definition."""
    total = 0.0
    for row in x.astype(np.float64):
        code = np.sign(row)
        total += 1.0 - float(row @ code) / (np.linalg.norm(row) * np.linalg.norm(code))
    return total / len(x)


def reference_proxy_anchor(
    x: np.ndarray, labels: np.ndarray, proxies: np.ndarray, alpha: float, delta: float
) -> float:
    """Eq. 4 of Kim et al. (CVPR 2020) in float64, term by term."""
    s = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (
        proxies / np.linalg.norm(proxies, axis=1, keepdims=True)
    ).T
    with_pos = sorted(set(labels.tolist()))
    pos = sum(
        math.log(1 + sum(math.exp(-alpha * (s[i, p] - delta)) for i in np.flatnonzero(labels == p)))
        for p in with_pos
    )
    neg = sum(
        math.log(1 + sum(math.exp(alpha * (s[i, p] + delta)) for i in np.flatnonzero(labels != p)))
        for p in range(len(proxies))
    )
    return pos / len(with_pos) + neg / len(proxies)


def test_quantization_hand_computed() -> None:
    # (3, 4): |x|_1 = 7, |x|_2 = 5, |sign x|_2 = sqrt 2; (1, 0): cos 1/sqrt 2; a code: 0.
    x = torch.tensor([[3.0, 4.0], [1.0, 0.0], [-0.5, 0.5]], dtype=torch.float64)
    expected = ((1 - 7 / (5 * math.sqrt(2))) + (1 - 1 / math.sqrt(2)) + 0.0) / 3
    assert quantization_loss(x).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("seed", "batch", "dim"), [(0, 5, 8), (1, 1, 64), (2, 9, 3)])
def test_quantization_matches_float64_reference(seed: int, batch: int, dim: int) -> None:
    x = np.random.default_rng(seed).standard_normal((batch, dim)) * 2.0
    expected = reference_quantization(x)
    got64 = quantization_loss(torch.from_numpy(x))
    assert got64.dtype == torch.float64 and got64.item() == pytest.approx(expected, rel=1e-12)
    got32 = quantization_loss(torch.from_numpy(x).float())
    assert got32.dtype == torch.float32 and got32.item() == pytest.approx(expected, rel=1e-5)


def test_quantization_of_a_zero_row_is_one_with_a_finite_gradient() -> None:
    x = torch.zeros(2, 8, dtype=torch.float16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = quantization_loss(x)
    value.backward()
    assert value.item() == 1.0 and x.grad is not None and torch.isfinite(x.grad).all()


def test_quantization_gradcheck() -> None:
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.autograd.gradcheck(quantization_loss, (x.requires_grad_(),))


@pytest.mark.parametrize("seed", [0, 1])
def test_learned_code_loss_matches_float64_reference(seed: int) -> None:
    """Proxy-Anchor on the relaxed codes plus the weight times the quantisation term of the
    codes and of the proxies."""
    rng = np.random.default_rng(seed)
    x, labels = rng.standard_normal((10, 16)), rng.integers(0, 4, 10)
    base = ProxyAnchorLoss(5, 16).double()
    proxies = base.proxies.detach().numpy().copy()
    loss = CodeLoss(base, weight=0.7)
    expected = reference_proxy_anchor(x, labels, proxies, 32.0, 0.1) + 0.7 * (
        reference_quantization(x) + reference_quantization(proxies)
    )
    got = loss(torch.from_numpy(x), torch.from_numpy(labels))
    assert got.item() == pytest.approx(expected, rel=1e-9)


def reference_centre_cosine(
    x: np.ndarray, labels: np.ndarray, centres: np.ndarray, scale: float, margin: float
) -> float:
    """OrthoHash's cross-entropy with a cosine margin, in float64, row by row."""
    total = 0.0
    for row, y in zip(x, labels, strict=True):
        cos = [float(row @ c) / (np.linalg.norm(row) * np.linalg.norm(c)) for c in centres]
        logits = [scale * (v - (margin if k == y else 0.0)) for k, v in enumerate(cos)]
        total += math.log(sum(math.exp(v) for v in logits)) - logits[y]
    return total / len(x)


def test_hadamard_code_loss_matches_float64_reference() -> None:
    rng = np.random.default_rng(4)
    x, labels = rng.standard_normal((12, 16)), rng.integers(0, 6, 12)
    loss = build_code_loss("hadamard", "proxy_anchor", 6, 16, weight=2.0)
    centres = np.concatenate([scipy_hadamard(16), -scipy_hadamard(16)])[:6].astype(np.float64)
    expected = reference_centre_cosine(x, labels, centres, 8.0, 0.2) + 2.0 * (
        reference_quantization(x)
    )
    got = loss.double()(torch.from_numpy(x), torch.from_numpy(labels))
    assert got.item() == pytest.approx(expected, rel=1e-9)
    assert list(loss.parameters()) == []  # fixed proxies: nothing for the optimiser


def test_centre_cosine_hand_computed() -> None:
    """x = (1, 1) is its class's centre (1, 1) (cos 1) and orthogonal to (1, -1) (cos 0):
    -log(e^(8 (1 - 0.2)) / (e^(8 (1 - 0.2)) + e^0)) = log(1 + e^-6.4)."""
    loss = CentreCosineLoss(torch.tensor([[1.0, 1.0], [1.0, -1.0]]))
    got = loss(torch.tensor([[1.0, 1.0]], dtype=torch.float64), torch.tensor([0]))
    assert got.item() == pytest.approx(math.log1p(math.exp(-6.4)), rel=1e-12)


@pytest.mark.parametrize("proxies", list(CODE_PROXIES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_code_losses_stay_finite_under_autocast(proxies: str, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(16, 32, generator=gen) * 50  # large: exp(32 * 1.1) overflows half
    labels = torch.randint(0, 8, (16,), generator=gen)
    loss = build_code_loss(proxies, "proxy_anchor", 8, 32, weight=1.0)
    embeddings = x.to(dtype).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(embeddings, labels)
    value.backward()
    assert value.dtype == torch.float32 and torch.isfinite(value)
    assert embeddings.grad is not None and torch.isfinite(embeddings.grad.float()).all()


def test_hadamard_is_scipys() -> None:
    for size in (1, 2, 8, 64):
        assert np.array_equal(hadamard(size).numpy(), scipy_hadamard(size))
    with pytest.raises(ValueError, match="power of 2"):
        hadamard(24)


@pytest.mark.parametrize(("classes", "bits"), [(100, 64), (128, 64), (10, 8)])
def test_hadamard_centres_are_half_the_bits_apart_or_more(classes: int, bits: int) -> None:
    codes = hash_centres(classes, bits).numpy()
    assert codes.shape == (classes, bits) and set(np.unique(codes)) == {-1.0, 1.0}
    distances = (bits - codes @ codes.T) / 2  # Hamming between +-1 rows
    np.fill_diagonal(distances, bits)
    assert distances.min() >= bits / 2


def test_centres_beyond_the_hadamard_rows_are_seeded_draws() -> None:
    draw = hash_centres(20, 24, torch.Generator().manual_seed(1))  # 24: no Sylvester matrix
    again = hash_centres(20, 24, torch.Generator().manual_seed(1))
    assert torch.equal(draw, again) and set(draw.unique().tolist()) == {-1.0, 1.0}
    assert hash_centres(129, 64, torch.Generator().manual_seed(1)).shape == (129, 64)


def test_train_bits_writes_codes_that_index_picks_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`pactl train digits --bits 32`: best.pt makes 32-bit codes, its vectors are 32-d and unit,
    the epoch's metrics are its codes' (Hamming, ties by id) on the test split, and `pactl
    index` of its vectors, given no option, holds their signs as 32-bit codes."""
    import faiss
    from conftest import read_csv

    from pactl import checkpoint

    code, _, err = run_cli(
        ["train", "digits", "--bits", "32", "--epochs", "1", "--name", "b", "--quiet"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    run = tmp_path / "runs" / "b"
    _, model_cfg, payload = checkpoint.load_model(run / "best.pt")
    assert payload["model_config"]["bits"] == 32 and model_cfg.embedding_dim == 32
    assert json.loads((run / "config.json").read_text())["model_config"]["bits"] == 32
    manifest = tmp_path / "home" / "datasets" / "digits" / "manifest.csv"
    for args in (
        ["embed", str(manifest), "--checkpoint", str(run / "best.pt"), "--out", "v"],
        ["index", "v", "--out", "b"],
    ):
        code, _, err = run_cli([*args, "--quiet"], monkeypatch, capsys)
        assert code == 0, err
    vectors = np.load(tmp_path / "v" / "vectors.npy")
    assert vectors.shape[1] == 32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    split = {str(manifest.parent / r["path"]): r["split"] for r in read_csv(manifest)}
    items = read_csv(tmp_path / "v" / "items.csv")
    test = [i for i, row in enumerate(items) if split[row["path"]] == "test"]
    labels = np.array([int(items[i]["label"]) for i in test])
    last = read_csv(run / "metrics.csv")[-1]
    scores = hamming.score_codes(vectors[test], labels, (1, 2, 4, 8))
    for name in ("recall@1", "recall@2", "map@r"):
        assert float(last[name]) == pytest.approx(scores[name], abs=1e-4), name
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert meta["binary"]["bits"] == 32 and meta["binary"]["rotation"] == "none"
    index = faiss.read_index_binary(str(tmp_path / "b" / "index.faiss"))
    ids = faiss.vector_to_array(index.id_map)
    flat = faiss.downcast_IndexBinary(index.index)
    codes = faiss.vector_to_array(flat.xb).reshape(index.ntotal, 4)  # (N, 32 bits)
    assert np.array_equal(codes[np.argsort(ids)], hamming.pack(vectors))


def test_a_code_head_centres_its_outputs_at_test_on_the_training_mean() -> None:
    from torch import nn

    from pactl.model import EmbeddingNet, TrainingMean

    net = EmbeddingNet(nn.Identity(), feat_dim=3, embedding_dim=8, pooling="avg", bits=8)
    head = net.embedding[1]
    assert isinstance(head, TrainingMean)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(9)) + 3.0
    assert torch.equal(head(x), x)  # training: the loss sees the outputs as they are
    assert torch.allclose(head.running_mean, 0.1 * x.mean(dim=0))
    head(x)
    expected = (1 - 0.9**2) * x.mean(dim=0)  # two steps of momentum 0.1 from 0
    head.eval()
    assert torch.allclose(head(x), x - expected, atol=1e-6)
    assert "embedding.1.running_mean" in net.state_dict()  # kept in checkpoints


@pytest.mark.parametrize(
    ("options", "wrong"),
    [
        (["--bits", "12"], "--bits must be 0 (float vectors) or a multiple of 8 from 8 to 8,192"),
        (["--bits", "4"], "--bits must be 0 (float vectors) or a multiple of 8"),
        (["--bits", "16384"], "--bits must be 0 (float vectors) or a multiple of 8"),
        (["--bits", "-8"], "--bits must be 0 (float vectors) or a multiple of 8"),
        (["--bits", "64", "--dim", "128"], "--dim must equal the bits, 64 (got 128)"),
    ],
)
def test_bad_bits_are_one_line_usage_errors(
    options: list[str],
    wrong: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(["train", "digits", *options, "--print-config"], monkeypatch, capsys)
    assert code == 2
    assert wrong in one_error(err)


def test_print_config_says_the_network_makes_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        ["train", "digits", "--bits", "48", "--print-config"], monkeypatch, capsys
    )
    assert code == 0, err
    shown = json.loads(out)
    assert shown["model"]["bits"] == 48 and shown["model"]["embedding_dim"] == 48
    assert any("48-bit codes" in line for line in shown["why"])
