"""Plain-loop oracles for refbayes.models.conv: one example, one output entry at a time.

Nothing here imports refbayes.models. Convolution, pooling and flatten are written as the textbook
sums over output positions (no unfold, no fold); theta is walked front to back in the documented
order (derivations/conv.md (conv.2)-(conv.3)); the network of a CNN is rebuilt from its layer
records' attributes (type name and fields, read as plain data); derivatives come from autograd on
a single example. The max-pool winner is found by a strictly-greater scan, so ties go to the first
window entry in row-major order without relying on any argmax.
"""
import autograd
import autograd.numpy as anp
import numpy as np

from tests.reference.per_example import naive_nll

__all__ = ["conv2d_loop", "max_pool_loop", "max_pool_routing_loop", "avg_pool_loop",
           "naive_params", "naive_output", "per_example_grads_loop", "ggn_loop", "kfac_loop",
           "LoopSpec"]


def _value(v):
    """The float inside an autograd box (or the float itself)."""
    while hasattr(v, "_value"):
        v = v._value
    return float(v)


def _pad(x, ph, pw):
    """x (C, H, W) with zero rows and columns around, by concatenation (autograd-safe)."""
    C, H, W = x.shape
    if pw:
        z = anp.zeros((C, H, pw))
        x = anp.concatenate([z, x, z], axis=2)
    if ph:
        z = anp.zeros((C, ph, W + 2 * pw))
        x = anp.concatenate([z, x, z], axis=1)
    return x


def conv2d_loop(x, Wc, b, stride, padding):
    """(C_out, H_o, W_o): out[o, i, j] = b[o] + sum_{c,u,v} Wc[o,c,u,v] xpad[c, s_h i + u, s_w j + v]."""
    C_out, _, kh, kw = Wc.shape
    xp = _pad(x, *padding)
    Ho = (xp.shape[1] - kh) // stride[0] + 1
    Wo = (xp.shape[2] - kw) // stride[1] + 1
    out = []
    for o in range(C_out):
        for i in range(Ho):
            for j in range(Wo):
                r, c = stride[0] * i, stride[1] * j
                out.append(anp.sum(Wc[o] * xp[:, r:r + kh, c:c + kw]) + (0.0 if b is None else b[o]))
    return anp.reshape(anp.stack(out), (C_out, Ho, Wo))


def _windows(x, kernel, stride):
    """[(c, i, j, [window entries in row-major order])] for a (C, H, W) input, no padding."""
    C, H, W = x.shape
    (kh, kw), (sh, sw) = kernel, stride
    Ho, Wo = (H - kh) // sh + 1, (W - kw) // sw + 1
    for c in range(C):
        for i in range(Ho):
            for j in range(Wo):
                yield c, i, j, [(sh * i + u, sw * j + v) for u in range(kh) for v in range(kw)]


def _first_max(x, c, cells):
    """The first cell holding the window maximum: a strictly-greater scan in row-major order."""
    best = cells[0]
    for cell in cells[1:]:
        if _value(x[c, cell[0], cell[1]]) > _value(x[c, best[0], best[1]]):
            best = cell
    return best


def _out_hw(x, kernel, stride):
    return ((x.shape[1] - kernel[0]) // stride[0] + 1, (x.shape[2] - kernel[1]) // stride[1] + 1)


def max_pool_loop(x, kernel, stride):
    """(C, H_o, W_o): the window maximum, read at the first maximal cell."""
    Ho, Wo = _out_hw(x, kernel, stride)
    out = [x[c, best[0], best[1]] for c, _, _, cells in _windows(x, kernel, stride)
           for best in [_first_max(x, c, cells)]]
    return anp.reshape(anp.stack(out), (x.shape[0], Ho, Wo))


def max_pool_routing_loop(x, dy, kernel, stride):
    """dl/dx (C, H, W) of max pooling: dy[c, i, j] added at the first maximal cell of window (i, j)."""
    dx = np.zeros(x.shape)
    for c, i, j, cells in _windows(x, kernel, stride):
        r, s = _first_max(x, c, cells)
        dx[c, r, s] += dy[c, i, j]
    return dx


def avg_pool_loop(x, kernel, stride):
    """(C, H_o, W_o): the plain mean of each window's kh kw entries."""
    Ho, Wo = _out_hw(x, kernel, stride)
    n = kernel[0] * kernel[1]
    out = [sum(x[c, r, s] for r, s in cells) / n for c, _, _, cells in _windows(x, kernel, stride)]
    return anp.reshape(anp.stack(out), (x.shape[0], Ho, Wo))


class LoopSpec:
    """A CNN's hyperparameters as plain data: input shape, layers as (kind, fields), likelihood."""

    def __init__(self, model):
        self.input_shape = tuple(model.input_shape)
        self.layers = [(type(layer).__name__, dict(vars(layer))) for layer in model.layers]
        self.likelihood = model.likelihood.name
        self.tau = getattr(model.likelihood, "noise_precision", 1.0)


def naive_params(spec, theta):
    """Walk theta front to back: per Conv2d its (C_out, C_in, kh, kw) weight entries row-major then
    C_out biases; per Dense its n_in rows of n_out weights then n_out biases."""
    params, pos = [], 0
    for kind, f in spec.layers:
        if kind == "Conv2d":
            shape = (f["c_out"], f["c_in"]) + tuple(f["kernel"])
            n_b = f["c_out"] if f["bias"] else 0
        elif kind == "Dense":
            shape = (f["n_in"], f["n_out"])
            n_b = f["n_out"] if f["bias"] else 0
        else:
            continue
        n = int(np.prod(shape))
        W = anp.reshape(theta[pos:pos + n], shape)
        pos += n
        params.append((W, theta[pos:pos + n_b] if n_b else None))
        pos += n_b
    assert pos == len(theta)
    return params


def _act(name, z):
    if name == "relu":
        return anp.where(z > 0, z, 0.0)
    if name == "tanh":
        return anp.tanh(z)
    return 1.0 / (1.0 + anp.exp(-z))


def naive_output(spec, theta, x, sz=None, sites=None):
    """f(x; theta) (K,) for one image x (C, H, W), layer by layer with the loops above. With sz
    (MC dropout), the input of the j-th layer with parameters is multiplied by sz[j] first; with
    sites too, the input of layer sites[j] (the output when sites[j] == len(layers))."""
    it = iter(naive_params(spec, theta))
    if sz is not None and sites is None:
        sites = [k for k, (kind, _) in enumerate(spec.layers) if kind in ("Conv2d", "Dense")]
    mask_at = {} if sz is None else dict(zip(sites, sz))
    h = x
    for k, (kind, f) in enumerate(spec.layers):
        if k in mask_at:
            h = h * mask_at[k]
        if kind == "Conv2d":
            W, b = next(it)
            h = conv2d_loop(h, W, b, f["stride"], f["padding"])
        elif kind == "Dense":
            W, b = next(it)
            h = anp.dot(h, W) + (0.0 if b is None else b)
        elif kind == "Activation":
            h = _act(f["name"], h)
        elif kind == "MaxPool2d":
            h = max_pool_loop(h, f["kernel"], f["stride"])
        elif kind == "AvgPool2d":
            h = avg_pool_loop(h, f["kernel"], f["stride"])
        else:  # Flatten: entry c H W + h W + w, one by one
            C, H, W_ = h.shape
            h = anp.stack([h[c, r, s] for c in range(C) for r in range(H) for s in range(W_)])
    if len(spec.layers) in mask_at:
        h = h * mask_at[len(spec.layers)]
    return h


def per_example_grads_loop(spec, theta, X, Y):
    """G (M, D): row i = autograd.grad of example i's loss -log p(y_i | f(x_i)) (float64)."""
    theta = np.asarray(theta, np.float64)
    X = np.asarray(X, np.float64).reshape((len(X),) + spec.input_shape)
    Y = np.asarray(Y, np.float64) if spec.likelihood == "gaussian" else np.asarray(Y).astype(int)

    def loss(th, x, y):
        return naive_nll(spec, naive_output(spec, th, x), y)
    g = autograd.grad(loss)
    return np.stack([g(theta, X[i], Y[i]) for i in range(len(X))])


def masked_per_example_grads_loop(spec, theta, X, Y, sz, sites=None):
    """G (M, D) of the masked network: row i = autograd.grad of example i's loss with its masks
    [sz[j][i] for each site j] (default: on the inputs of the layers with parameters) (float64)."""
    theta = np.asarray(theta, np.float64)
    X = np.asarray(X, np.float64).reshape((len(X),) + spec.input_shape)
    Y = np.asarray(Y, np.float64) if spec.likelihood == "gaussian" else np.asarray(Y).astype(int)

    def loss(th, x, y, z):
        return naive_nll(spec, naive_output(spec, th, x, z, sites), y)
    g = autograd.grad(loss)
    return np.stack([g(theta, X[i], Y[i], [np.asarray(s[i], np.float64) for s in sz])
                     for i in range(len(X))])


def ggn_loop(spec, theta, X, Y):
    """sum_i J_i^T H_i J_i (D, D): J_i = autograd.jacobian of one image's output, H_i =
    autograd.hessian of its loss in f_i (float64), one example at a time."""
    theta = np.asarray(theta, np.float64)
    X = np.asarray(X, np.float64).reshape((len(X),) + spec.input_shape)
    Y = np.asarray(Y, np.float64) if spec.likelihood == "gaussian" else np.asarray(Y).astype(int)
    out = np.zeros((len(theta), len(theta)))
    for x, y in zip(X, Y):
        J = autograd.jacobian(lambda th: naive_output(spec, th, x))(theta)
        H = autograd.hessian(lambda f: naive_nll(spec, f, y))(naive_output(spec, theta, x))
        out += J.T @ H @ J
    return out


def _apply(kind, f, h, p):
    """One layer of ``naive_output`` on one example h (p: the layer's (W, b) or None)."""
    if kind == "Conv2d":
        return conv2d_loop(h, p[0], p[1], f["stride"], f["padding"])
    if kind == "Dense":
        return anp.dot(h, p[0]) + (0.0 if p[1] is None else p[1])
    if kind == "Activation":
        return _act(f["name"], h)
    if kind == "MaxPool2d":
        return max_pool_loop(h, f["kernel"], f["stride"])
    if kind == "AvgPool2d":
        return avg_pool_loop(h, f["kernel"], f["stride"])
    C, H, W_ = h.shape
    return anp.stack([h[c, r, s] for c in range(C) for r in range(H) for s in range(W_)])


def kfac_loop(spec, theta, X, Y, j, approx="expand", curvature="ggn"):
    """K-FAC factors (A, B) of the j-th parameter layer of a CNN, by the definitions of
    derivations/conv.md (conv.26)-(conv.27), (conv.29), one example and one position at a time.

    The layer input comes from the loops above; each patch u_p (with a trailing 1 for the bias) is
    read entry by entry from the zero-padded input, (c, u, v) row-major; the output errors are
    J_p = d f / d z[:, p] (K, C_out) by autograd of the rest of the network at the layer output z,
    and the curvature at f is H = autograd.hessian of the loss ("ggn": B sums J_p^T H J_p) or its
    gradient gf ("ef": B sums (J_p^T gf)(J_p^T gf)^T). expand: A = sum_{i,p} u_p u_p^T / (M P),
    B = sum_{i,p} (.)_p; reduce: A = sum_i ubar ubar^T / M, ubar the mean patch, B from
    sum_p J_p. No unfold, no factor C of H, no refbayes.
    """
    theta = np.asarray(theta, np.float64)
    X = np.asarray(X, np.float64).reshape((len(X),) + spec.input_shape)
    Y = np.asarray(Y, np.float64) if spec.likelihood == "gaussian" else np.asarray(Y).astype(int)
    params = naive_params(spec, theta)
    where = [k for k, (kind, _) in enumerate(spec.layers) if kind in ("Conv2d", "Dense")]
    k = where[j]
    kind, fk = spec.layers[k]
    p_of = dict(zip(where, params))
    A, B, M = 0.0, 0.0, len(X)
    for x, y in zip(X, Y):
        h = x
        for kk in range(k):
            h = _apply(*spec.layers[kk], h, p_of.get(kk))
        z = _apply(kind, fk, h, p_of[k])

        def tail(zz, k=k):
            out = zz
            for kk in range(k + 1, len(spec.layers)):
                out = _apply(*spec.layers[kk], out, p_of.get(kk))
            return out
        f = tail(z)
        Jz = autograd.jacobian(tail)(z)  # (K,) + z.shape
        has_bias = p_of[k][1] is not None
        if kind == "Conv2d":
            (sh, sw), (ph, pw) = fk["stride"], fk["padding"]
            kh, kw = fk["kernel"]
            xpad = _pad(h, ph, pw)
            Ho, Wo = z.shape[1], z.shape[2]
            patches, Js = [], []
            for ho in range(Ho):
                for wo in range(Wo):
                    u = [xpad[c, sh * ho + a, sw * wo + b] for c in range(xpad.shape[0])
                         for a in range(kh) for b in range(kw)]
                    patches.append(np.array(u + ([1.0] if has_bias else [])))
                    Js.append(Jz[:, :, ho, wo])
        else:
            patches = [np.concatenate([h, [1.0]]) if has_bias else np.array(h)]
            Js = [Jz]
        P = len(patches)
        if curvature == "ggn":
            H = autograd.hessian(lambda g, t=y: naive_nll(spec, g, t))(f)

            def outer(J1, J2, H=H):
                return J1.T @ H @ J2
        else:
            gf = autograd.grad(lambda g, t=y: naive_nll(spec, g, t))(f)

            def outer(J1, J2, gf=gf):
                return np.outer(J1.T @ gf, J2.T @ gf)
        if approx == "expand":
            A = A + sum(np.outer(u, u) for u in patches) / (M * P)
            B = B + sum(outer(J, J) for J in Js)
        else:
            ubar = sum(patches) / P
            A = A + np.outer(ubar, ubar) / M
            Jsum = sum(Js)
            B = B + outer(Jsum, Jsum)
    return A, B


def kfac_dense(model, factors, separate=False):
    """refbayes' K-FAC of a CNN as a D x D matrix in theta order: A kron B on each parameter
    layer's W~ (``model.kfac_layout()``, conv.24); with ``separate`` the weight-bias cross terms
    dropped, leaving the bias block B A[-1, -1] (curvlinops' separate_weight_and_bias)."""
    K = np.zeros((model.D, model.D))
    layers = [la for la in model.layers if type(la).__name__ in ("Conv2d", "Dense")]
    for (A, B), idx, layer in zip(factors, model.kfac_layout(), layers):
        block = np.kron(A, B)
        if separate and layer.bias:
            n_w = (A.shape[0] - 1) * B.shape[0]
            block[:n_w, n_w:] = 0.0
            block[n_w:, :n_w] = 0.0
        K[np.ix_(idx.ravel(), idx.ravel())] = block
    return K
