"""refbayes.models.conv K-FAC against curvlinops' KFACLinearOperator on the same torch network.

derivations/conv.md (conv.24)-(conv.29) and its conventions table: curvlinops' expand and reduce
(summed cross-entropy, exact GGN "type-2" and "empirical" Fisher) are refbayes' expand and reduce
factors with scalar factor 1, joint weight-and-bias factors = A kron B on W~ (conv.24), separate
ones = A without its ones row for the weight and B for the bias. Compared as dense D x D matrices
(the operator applied to the identity), mapped from torch's parameter order to theta's. float64,
EXACT_F64. Skipped without torch and curvlinops (the conformance environment has both).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
curvlinops = pytest.importorskip("curvlinops")
from torch import nn

from refbayes.conformance.backpack import torch_cnn
from refbayes.models.conv import (
    CNN,
    KFAC_APPROX,
    Activation,
    AvgPool2d,
    Conv2d,
    Dense,
    Flatten,
    MaxPool2d,
    tiny_cnn,
)
from tests.reference.conv_loops import kfac_dense
from tests.tolerances import EXACT_F64, assert_close

_FISHER = {"ggn": "type-2", "ef": "empirical"}


def _theta_and_positions(net):
    """(theta, pos): theta from ``parameters()`` (Linear weights transposed, (conv.2)-(conv.3)),
    and pos[k] = the theta index of entry k of torch's flattened parameter vector."""
    pieces, pos, start = [], [], 0
    for mod in net.modules():
        if not isinstance(mod, (nn.Conv2d, nn.Linear)):
            continue
        for name, p in mod.named_parameters(recurse=False):
            t = p.detach()
            n = t.numel()
            if isinstance(mod, nn.Linear) and name == "weight":
                n_out, n_in = t.shape  # torch (o, i) <-> theta W[i, o] at start + i n_out + o
                pos.append((start + np.arange(n_in)[None, :] * n_out
                            + np.arange(n_out)[:, None]).ravel())
                t = t.T
            else:
                pos.append(start + np.arange(n))
            pieces.append(t.reshape(-1).numpy())
            start += n
    return np.concatenate(pieces), np.concatenate(pos)


def _mixed():
    return CNN((2, 7, 8), [
        Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 2)), Activation("tanh"),
        AvgPool2d(2, stride=1),
        Conv2d(3, 2, 2, stride=(1, 2), bias=False), Activation("sigmoid"),
        MaxPool2d((2, 2), stride=(1, 2)), Flatten(),
        Dense(4, 4, bias=False), Activation("relu"), Dense(4, 3)], "categorical")


CASES = {"tiny": tiny_cnn, "mixed": _mixed}


@pytest.mark.parametrize("separate", [False, True])
@pytest.mark.parametrize("curvature", ["ggn", "ef"])
@pytest.mark.parametrize("approx", KFAC_APPROX)
@pytest.mark.parametrize("name", list(CASES))
def test_factors_match_curvlinops(name, approx, curvature, separate):
    # checks (conv.26), (conv.27), (conv.29), (conv.24): the conventions table's curvlinops rows,
    # scalar factor 1 under reduction="sum"
    torch.manual_seed(0)
    model = CASES[name]()
    net = torch_cnn(model)
    M = 4
    rng = np.random.default_rng(0)
    X = rng.normal(size=(M,) + model.input_shape)
    y = rng.integers(0, model.n_out, size=M)
    theta, pos = _theta_and_positions(net)
    assert theta.shape == (model.D,)
    op = curvlinops.KFACLinearOperator(
        net, nn.CrossEntropyLoss(reduction="sum"), list(net.parameters()),
        [(torch.from_numpy(X), torch.from_numpy(y))], fisher_type=_FISHER[curvature],
        kfac_approx=approx, separate_weight_and_bias=separate, check_deterministic=False)
    K_torch = (op @ torch.eye(model.D, dtype=torch.float64)).numpy()
    K_theta = np.zeros_like(K_torch)
    K_theta[np.ix_(pos, pos)] = K_torch
    K = kfac_dense(model, model.kfac_curvature(theta, X, y, curvature, approx), separate)
    assert_close(K, K_theta, EXACT_F64, f"{name} {approx} {curvature} separate={separate}")


def test_mean_reduction_scales_b_by_one_over_m():
    # checks (conv.26): the table's row for reduction="mean": curvlinops' gradient covariance
    # is B / M, its input covariance A, so its K-FAC is refbayes' divided by M
    torch.manual_seed(1)
    model = tiny_cnn()
    net = torch_cnn(model)
    M = 5
    rng = np.random.default_rng(1)
    X = rng.normal(size=(M,) + model.input_shape)
    y = rng.integers(0, model.n_out, size=M)
    theta, pos = _theta_and_positions(net)
    op = curvlinops.KFACLinearOperator(
        net, nn.CrossEntropyLoss(reduction="mean"), list(net.parameters()),
        [(torch.from_numpy(X), torch.from_numpy(y))], fisher_type="type-2",
        kfac_approx="expand", separate_weight_and_bias=False, check_deterministic=False)
    K_torch = (op @ torch.eye(model.D, dtype=torch.float64)).numpy()
    K_theta = np.zeros_like(K_torch)
    K_theta[np.ix_(pos, pos)] = K_torch
    K = kfac_dense(model, model.kfac_curvature(theta, X, y, "ggn", "expand"), False)
    assert_close(K / M, K_theta, EXACT_F64, "mean reduction")


def test_backpack_kflr_is_the_hybrid_of_the_table():
    # checks (conv.28): BackPACK's KFLR for Conv2d is [B_reduce, Omega], Omega = KFC's input factor
    # = P A_expand without the ones row (the conventions table: neither expand nor reduce), and
    # its bias factor B_reduce; for Linear the MLP's [B, A] (peg.13) without the ones row
    backpack = pytest.importorskip("backpack")
    from backpack.extensions import KFLR
    torch.manual_seed(2)
    model = tiny_cnn()
    net = backpack.extend(torch_cnn(model))
    loss_fn = backpack.extend(nn.CrossEntropyLoss(reduction="sum"))
    M = 4
    rng = np.random.default_rng(2)
    X = rng.normal(size=(M,) + model.input_shape)
    y = rng.integers(0, model.n_out, size=M)
    theta, _ = _theta_and_positions(net)
    loss = loss_fn(net(torch.from_numpy(X)), torch.from_numpy(y))
    with backpack.backpack(KFLR()):
        loss.backward()
    expand = model.kfac_curvature(theta, X, y, "ggn", "expand")
    reduce_ = model.kfac_curvature(theta, X, y, "ggn", "reduce")
    conv, dense = net[0], net[4]
    P = 4 * 4  # the conv's output positions
    G_bp, Omega = (t.numpy() for t in conv.weight.kflr)
    assert_close(Omega, P * expand[0][0][:-1, :-1], EXACT_F64, "Omega = P A_expand")
    assert_close(G_bp, reduce_[0][1], EXACT_F64, "G = B_reduce")
    assert_close(conv.bias.kflr[0].numpy(), reduce_[0][1], EXACT_F64, "bias: B_reduce")
    G_bp, A_bp = (t.numpy() for t in dense.weight.kflr)
    assert_close(A_bp, expand[1][0][:-1, :-1], EXACT_F64, "dense A")
    assert_close(G_bp, expand[1][1], EXACT_F64, "dense B")
