"""Linear, softmax cross-entropy and optimizer updates vs PyTorch."""
import pytest
import torch
import torch.nn.functional as F

from conftest import close
from port.exec import capi


@pytest.mark.parametrize("wt", [False, True])     # wt: W stored [in, out] (port_linear_t_*, GPT-2's Conv1D)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("n,i,o", [(1, 5, 3), (3, 17, 10), (8, 64, 33), (700, 64, 130), (2500, 40, 24)])  # 700: row blocks; 2500: weight gradient split over the rows
@pytest.mark.parametrize("backend", ["blas", "vendored"])
def test_linear(K, backend, n, i, o, bias, wt):
    capi.set_gemm_backend(backend)
    x, w = torch.randn(n, i), torch.randn(i, o) if wt else torch.randn(o, i)
    b = torch.randn(o) if bias else None
    dy = torch.randn(n, o)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    b64 = b.double().requires_grad_() if bias else None
    y_r = (torch.addmm(b64, x64, w64) if bias else x64 @ w64) if wt else F.linear(x64, w64, b64)
    y_r.backward(dy.double())
    close(K.linear_forward(x, w, b, wt=wt), y_r)
    close(K.linear_backward_input(dy, w, wt=wt), x64.grad)
    dw, db = K.linear_backward_weight(dy, x, bias=bias, wt=wt)
    close(dw, w64.grad)
    if bias:
        close(db, b64.grad)
        dw2, db2 = K.linear_backward_weight(dy, x, dw=dw.clone(), db=db.clone(), wt=wt)
        close(dw2, 2 * dw, 1e-5, 1e-5)
        close(db2, 2 * db, 1e-5, 1e-5)


@pytest.mark.parametrize("ls", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("n,k", [(1, 2), (5, 10), (32, 100)])
def test_softmax_xent(K, n, k, ls):
    logits = torch.randn(n, k) * 3
    labels = torch.randint(0, k, (n,))
    z64 = logits.double().requires_grad_()
    loss_r = F.cross_entropy(z64, labels, label_smoothing=ls)
    gl = torch.tensor([0.7])
    loss_r.backward(gl.double()[0])
    loss, probs = K.softmax_xent_forward(logits, labels, ls)
    close(loss, loss_r.detach().reshape(1), 1e-5, 1e-5, "loss")
    close(probs, torch.softmax(logits.double(), 1), 1e-6, 1e-5, "probs")
    close(K.softmax_xent_backward(probs, labels, gl, ls), z64.grad, 1e-6, 1e-5, "grad")
    pb = probs.clone()
    close(K.softmax_xent_backward(pb, labels, gl, ls, out=pb), z64.grad, 1e-6, 1e-5, "in place")
    with pytest.raises(ValueError, match="labels"):
        K.softmax_xent_forward(logits, torch.full((n,), k, dtype=torch.int64))


SGD_CFGS = [dict(lr=0.1), dict(lr=0.05, momentum=0.9), dict(lr=0.05, momentum=0.9, nesterov=True),
            dict(lr=0.01, momentum=0.8, dampening=0.3, weight_decay=1e-2),
            dict(lr=0.02, momentum=0.9, nesterov=True, weight_decay=5e-4),
            dict(lr=0.1, weight_decay=1e-3)]


@pytest.mark.parametrize("cfg", SGD_CFGS, ids=str)
def test_sgd_matches_torch(K, cfg):
    p0 = torch.randn(1000)
    ref = p0.clone().requires_grad_()
    opt = torch.optim.SGD([ref], foreach=False, **cfg)
    ours = p0.clone()
    buf = torch.zeros_like(ours)
    for step in range(5):
        g = torch.randn(1000)
        ref.grad = g.clone()
        opt.step()
        K.sgd_step(ours, g, buf, first_step=(step == 0), **cfg)
        torch.testing.assert_close(ours, ref.detach(), rtol=2e-6, atol=1e-6)
    if cfg.get("momentum"):
        torch.testing.assert_close(buf, opt.state[ref]["momentum_buffer"], rtol=2e-6, atol=1e-6)


ADAM_CFGS = [dict(lr=1e-3), dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
             dict(lr=3e-3, weight_decay=0.0), dict(lr=1e-2, betas=(0.3, 0.9))]


@pytest.mark.parametrize("cfg", ADAM_CFGS, ids=str)
def test_adamw_matches_torch(K, cfg):
    p0 = torch.randn(1000)
    ref = p0.clone().requires_grad_()
    opt = torch.optim.AdamW([ref], foreach=False, fused=False, **cfg)
    ours, m, v = p0.clone(), torch.zeros(1000), torch.zeros(1000)
    for step in range(1, 8):
        g = torch.randn(1000)
        ref.grad = g.clone()
        opt.step()
        K.adamw_step(ours, g, m, v, step, **cfg)
        torch.testing.assert_close(ours, ref.detach(), rtol=2e-6, atol=1e-6)
    st = opt.state[ref]
    torch.testing.assert_close(m, st["exp_avg"], rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(v, st["exp_avg_sq"], rtol=2e-6, atol=1e-9)
