"""MC dropout at ``output_sites`` against Osawa et al.'s official LeNet5MCDropout in torch.

team-approx-bayes/dl-with-bayes distributed/classification/models/lenet.py l.35-45 (commit
392cbb44): relu(dropout(conv1(x))), pool, relu(dropout(conv2(.))), pool, flatten,
relu(dropout(fc1(.))), relu(dropout(fc2(.))), dropout(fc3(.)). Here each ``F.dropout(t, p)``
is replaced by t * z / (1 - p) with given 0/1 masks z (what F.dropout computes with its own
draw), and refbayes' masked LeNet-5 at the same masks must give the same outputs, summed loss
and per-example gradients, float64, EXACT_F64. Skipped without torch (the conformance
environment has it).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.func import functional_call, grad, vmap  # noqa: E402

from refbayes.methods.driver import draw_masks  # noqa: E402
from refbayes.models import dropout as dr  # noqa: E402
from refbayes.models import lenet5  # noqa: E402
from tests.models.test_conv_torch import LeNet5, _to_theta  # noqa: E402
from tests.tolerances import EXACT_F64, assert_close  # noqa: E402

P = 0.1  # LeNet5MCDropout's dropout_ratio


class LeNet5MaskedDropout(LeNet5):
    """LeNet5MCDropout.forward with F.dropout(t, p) = t * z / (1 - p) at the given masks."""

    def forward(self, x, z1, z2, z3, z4, z5):
        F, s = nn.functional, 1.0 / (1.0 - P)
        out = F.relu(self.conv1(x) * z1 * s)
        out = F.max_pool2d(out, 2)
        out = F.relu(self.conv2(out) * z2 * s)
        out = F.max_pool2d(out, 2)
        out = out.view(out.size(0), -1)
        out = F.relu(self.fc1(out) * z3 * s)
        out = F.relu(self.fc2(out) * z4 * s)
        return self.fc3(out) * z5 * s


def test_output_sites_match_the_official_lenet5_mc_dropout():
    # checks (mc_dropout.10), (mc_dropout.11)
    torch.manual_seed(0)
    net = LeNet5MaskedDropout().double()
    model = lenet5()
    sites = dr.output_sites(model)
    M = 3
    rng = np.random.default_rng(0)
    X = rng.normal(size=(M,) + model.input_shape)
    y = rng.integers(0, model.n_out, size=M)
    masks = draw_masks(rng, model, M, P, sites=sites)
    Xt, yt, zt = torch.from_numpy(X), torch.from_numpy(y), [torch.from_numpy(z) for z in masks]
    theta = _to_theta(net)
    s = 1.0 / (1.0 - P)
    with torch.no_grad():
        f_torch = net(Xt, *zt)
        loss_torch = nn.functional.cross_entropy(f_torch, yt, reduction="sum").item()
    assert_close(dr.masked_forward(model, theta, X, masks, s, sites), f_torch.numpy(), EXACT_F64,
                 "forward vs torch")
    losses = dr.masked_per_example_losses(model, theta, X, y, masks, s, sites)
    assert_close(losses.sum(), loss_torch, EXACT_F64, "summed loss vs torch")

    params = {k: v.detach() for k, v in net.named_parameters()}

    def loss(p, x, t, *z):
        out = functional_call(net, p, (x.unsqueeze(0),) + tuple(zi.unsqueeze(0) for zi in z))
        return nn.functional.cross_entropy(out, t.unsqueeze(0), reduction="sum")
    G_torch = _to_theta(net, vmap(grad(loss), in_dims=(None, 0, 0) + (0,) * 5)(params, Xt, yt,
                                                                               *zt))
    assert_close(dr.masked_per_example_grads(model, theta, X, y, masks, s, sites), G_torch,
                 EXACT_F64, "G vs vmap(grad)")
    assert_close(dr.masked_grad(model, theta, X, y, masks, s, sites), G_torch.sum(axis=0),
                 EXACT_F64, "grad vs torch")
    # the masks matter: without them the outputs differ (so the agreement above is not vacuous)
    assert not np.allclose(model.forward(theta, X), f_torch.numpy())
