"""refbayes.models.conv against real torch modules (nn.Conv2d, pooling, nn.Flatten, nn.Linear).

theta is built from a torch network's ``parameters()`` in order, each Conv2d weight and every bias
as it is, each Linear weight transposed (derivations/conv.md (conv.2)-(conv.3)); forward outputs,
the summed cross-entropy and torch.func's per-example gradients (vmap of grad) must agree to
EXACT_F64 in float64. Skipped without torch (the conformance environment has it).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.func import functional_call, grad, vmap  # noqa: E402

from refbayes.conformance.backpack import torch_cnn  # noqa: E402
from refbayes.models import _conv_layers as cl  # noqa: E402
from refbayes.models.conv import (CNN, Activation, AvgPool2d, Conv2d, Dense, Flatten,  # noqa: E402
                                  MaxPool2d, lenet5, tiny_cnn)
from tests.tolerances import EXACT_F64, assert_close  # noqa: E402



class LeNet5(nn.Module):
    """Osawa et al.'s LeNet5, as in team-approx-bayes/dl-with-bayes classification/models/lenet.py."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        out = nn.functional.max_pool2d(nn.functional.relu(self.conv1(x)), 2)
        out = nn.functional.max_pool2d(nn.functional.relu(self.conv2(out)), 2)
        out = out.view(out.size(0), -1)
        out = nn.functional.relu(self.fc1(out))
        out = nn.functional.relu(self.fc2(out))
        return self.fc3(out)


def _to_theta(net, tensors=None):
    """theta from ``parameters()`` in order: Linear weights transposed, everything else as is.

    ``tensors``: {name: (M, *shape)} per-example gradients to lay out as rows (M, D) instead.
    """
    linear = {f"{n}.weight" for n, m in net.named_modules() if isinstance(m, nn.Linear)}
    pieces = []
    for name, p in net.named_parameters():
        t = p.detach() if tensors is None else tensors[name]
        if name in linear:  # (n_out, n_in) -> refbayes' W (n_in, n_out)
            t = t.transpose(-1, -2)
        pieces.append(t.reshape(-1) if tensors is None else t.reshape(t.shape[0], -1))
    return torch.cat(pieces, dim=-1).numpy()


def _per_example_grads(net, X, y):
    params = {k: v.detach() for k, v in net.named_parameters()}

    def loss(p, x, t):
        out = functional_call(net, p, (x.unsqueeze(0),))
        return nn.functional.cross_entropy(out, t.unsqueeze(0), reduction="sum")
    return vmap(grad(loss), in_dims=(None, 0, 0))(params, X, y)


def _mixed():
    return CNN((2, 7, 8), [
        Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 2)), Activation("tanh"),
        AvgPool2d(2, stride=1),
        Conv2d(3, 2, 2, stride=(1, 2), bias=False), Activation("sigmoid"),
        MaxPool2d((2, 2), stride=(1, 2)), Flatten(),
        Dense(4, 4, bias=False), Activation("relu"), Dense(4, 3)], "categorical")


CASES = {
    "tiny": lambda: (tiny_cnn(), None),
    "mixed": lambda: (_mixed(), None),
    "odd-stride-padded": lambda: (CNN((1, 10, 8), [
        Conv2d(1, 2, 3, stride=2, padding=1), Activation("relu"), MaxPool2d(2, stride=1),
        Conv2d(2, 3, (2, 3), stride=(2, 1)), Activation("relu"), AvgPool2d((2, 1)), Flatten(),
        Dense(3, 3)], "categorical"), None),
    "lenet5": lambda: (lenet5(), LeNet5()),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_torch(name):
    # checks (conv.2), (conv.3), (conv.5), (conv.6), (conv.7), (conv.11), (conv.13), (conv.15), (conv.10)
    torch.manual_seed(0)
    model, net = CASES[name]()
    net = torch_cnn(model) if net is None else net.double()
    M = 3
    rng = np.random.default_rng(0)
    X = rng.normal(size=(M,) + model.input_shape)
    y = rng.integers(0, model.n_out, size=M)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
    theta = _to_theta(net)
    assert theta.shape == (model.D,)
    with torch.no_grad():
        f_torch = net(Xt).numpy()
        loss_torch = nn.functional.cross_entropy(net(Xt), yt, reduction="sum").item()
    assert_close(model.forward(theta, X), f_torch, EXACT_F64, "forward vs torch")
    assert_close(model.forward(theta, X.reshape(M, -1)), f_torch, EXACT_F64, "rows vs torch")
    assert_close(model.loss(theta, X, y), loss_torch, EXACT_F64, "summed loss vs torch")
    G_torch = _to_theta(net, _per_example_grads(net, Xt, yt))
    assert_close(model.per_example_grads(theta, X, y), G_torch, EXACT_F64, "G vs vmap(grad)")
    assert_close(model.grad(theta, X, y), G_torch.sum(axis=0), EXACT_F64, "grad vs torch")
    assert_close(model.diag_ef(theta, X, y), (G_torch ** 2).sum(axis=0), EXACT_F64, "diag_ef vs torch")


@pytest.mark.parametrize("kernel, stride", [((2, 2), (2, 2)), ((3, 2), (1, 1)), ((2, 3), (1, 2))])
def test_max_pool_ties_as_torch(kernel, stride):
    # checks (conv.11), (conv.12): torch routes a tied window's error to its first maximum too
    rng = np.random.default_rng(1)
    X = rng.integers(0, 2, size=(2, 2, 6, 7)).astype(np.float64)  # many ties
    Xt = torch.from_numpy(X).requires_grad_(True)
    yt = nn.functional.max_pool2d(Xt, kernel, stride)
    dy = rng.normal(size=tuple(yt.shape))
    yt.backward(torch.from_numpy(dy))
    onehot, y = cl.max_pool(np, X, kernel, stride)
    np.testing.assert_array_equal(y, yt.detach().numpy())
    assert_close(cl.max_pool_backward(np, onehot, dy, X.shape, kernel, stride), Xt.grad.numpy(),
                 EXACT_F64, "max-pool routing vs torch")
