"""Batch norm (train / frozen / in-place) and the fused conv+BN+ReLU forward vs PyTorch float64."""
import pytest
import torch
import torch.nn.functional as F

from conftest import close, quick_subset

# maps of 35, 1, 9, 20 and 63 values: the kernels' 32- and 16-float blocks and their scalar rest
BN_SHAPES = quick_subset([(1, 3, 5, 7), (3, 4, 7, 5), (2, 5, 1, 1), (4, 2, 3, 3), (2, 3, 4, 5), (2, 3, 7, 9)], 2)


def _bn_ref(x, gamma, beta, rm, rv, dy, training, eps=1e-5, momentum=0.1):
    x64, g64, b64 = (t.double().requires_grad_() for t in (x, gamma, beta))
    rm64, rv64 = rm.double().clone(), rv.double().clone()
    y = F.batch_norm(x64, rm64, rv64, g64, b64, training, momentum, eps)
    y.backward(dy.double())
    return y.detach(), x64.grad, g64.grad, b64.grad, rm64, rv64


def _bn_inputs(shape):
    c = shape[1]
    x = torch.randn(shape) * 2 + 0.5
    gamma, beta = torch.rand(c) + 0.5, torch.randn(c)
    rm, rv = torch.randn(c) * 0.1, torch.rand(c) + 0.5
    return x, gamma, beta, rm, rv, torch.randn(shape)


@pytest.mark.parametrize("shape", BN_SHAPES)
def test_batchnorm_train(K, shape):
    x, gamma, beta, rm, rv, dy = _bn_inputs(shape)
    y_r, dx_r, dg_r, db_r, rm_r, rv_r = _bn_ref(x, gamma, beta, rm, rv, dy, True)
    rm_o, rv_o = rm.clone(), rv.clone()
    y, sm, si = K.batchnorm2d_forward_train(x, gamma, beta, rm_o, rv_o, 1e-5, 0.1)
    close(y, y_r, what="y")
    close(rm_o, rm_r, 1e-5, 1e-5, "running_mean")
    close(rv_o, rv_r, 1e-5, 1e-5, "running_var (unbiased)")
    close(sm, x.double().mean((0, 2, 3)), 1e-5, 1e-5, "save_mean")
    var = x.double().var((0, 2, 3), unbiased=False)
    close(si, 1 / torch.sqrt(var + 1e-5), 1e-5, 1e-5, "save_invstd")
    dx = K.batchnorm2d_backward_input(dy, x, gamma, sm, si)
    close(dx, dx_r, 1e-4, 1e-4, "dx")
    dg, db = K.batchnorm2d_backward_weight(dy, x, sm, si)
    close(dg, dg_r, 1e-4, 1e-4, "dgamma")
    close(db, db_r, 1e-4, 1e-4, "dbeta")
    dg2, db2 = K.batchnorm2d_backward_weight(dy, x, sm, si, dgamma=dg.clone(), dbeta=db.clone())
    close(dg2, 2 * dg, 1e-5, 1e-5, "dgamma accumulates")
    close(db2, 2 * db, 1e-5, 1e-5, "dbeta accumulates")


@pytest.mark.parametrize("shape", BN_SHAPES)
def test_batchnorm_inplace_variants(K, shape):
    x, gamma, beta, rm, rv, dy = _bn_inputs(shape)
    y, sm, si = K.batchnorm2d_forward_train(x, gamma, beta)
    dx = K.batchnorm2d_backward_input(dy, x, gamma, sm, si)
    dg, db = K.batchnorm2d_backward_weight(dy, x, sm, si)
    # forward in place: y written into x's buffer
    xb = x.clone()
    y2, sm2, si2 = K.batchnorm2d_forward_train(xb, gamma, beta, out=xb)
    assert y2.data_ptr() == xb.data_ptr()
    close(y2, y, 1e-6, 1e-6)
    close(sm2, sm, 0, 0)
    # backward from the output (xhat reconstructed from y, gamma, beta); dx into dy's buffer
    dx2 = K.batchnorm2d_backward_input_from_output(dy, y2, gamma, beta, si2)
    close(dx2, dx, 1e-4, 1e-4, "dx from output")
    dyb = dy.clone()
    dx3 = K.batchnorm2d_backward_input_from_output(dyb, y2, gamma, beta, si2, out=dyb)
    close(dx3, dx, 1e-4, 1e-4, "dx from output, in place")
    dg2, db2 = K.batchnorm2d_backward_weight_from_output(dy, y2, gamma, beta)
    close(dg2, dg, 1e-4, 1e-4)
    close(db2, db, 1e-5, 1e-5)
    # dx may overwrite dy for the regular backward too
    dyb = dy.clone()
    close(K.batchnorm2d_backward_input(dyb, x, gamma, sm, si, out=dyb), dx, 1e-6, 1e-6)


def test_batchnorm_from_output_rejects_zero_gamma(K):
    x, gamma, beta, rm, rv, dy = _bn_inputs((2, 3, 4, 4))
    y, sm, si = K.batchnorm2d_forward_train(x, gamma, beta)
    gamma[1] = 0.0
    with pytest.raises(ValueError, match="invalid scalar"):
        K.batchnorm2d_backward_input_from_output(dy, y, gamma, beta, si)


@pytest.mark.parametrize("shape", BN_SHAPES)
def test_batchnorm_eval(K, shape):
    x, gamma, beta, rm, rv, dy = _bn_inputs(shape)
    y_r, dx_r, dg_r, db_r, _, _ = _bn_ref(x, gamma, beta, rm, rv, dy, False)
    close(K.batchnorm2d_forward_eval(x, gamma, beta, rm, rv), y_r, what="y")
    xb = x.clone()
    close(K.batchnorm2d_forward_eval(xb, gamma, beta, rm, rv, out=xb), y_r, what="y in place")
    close(K.batchnorm2d_backward_input_eval(dy, gamma, rv), dx_r, what="dx")
    dg, db = K.batchnorm2d_backward_weight_eval(dy, x, rm, rv)
    close(dg, dg_r, what="dgamma")
    close(db, db_r, what="dbeta")


FUSED = quick_subset([(2, 4, 6, 7, 5, 3, 1, 1, 1), (1, 4, 8, 9, 9, 3, 2, 1, 2),
                      (3, 4, 4, 7, 7, 3, 1, 1, 4), (2, 6, 5, 5, 7, 1, 1, 0, 1)], 2)


def _fused_inputs(case):
    n, ci, co, h, w, k, s, p, g = case
    x = torch.randn(n, ci, h, w)
    wt = torch.randn(co, ci // g, k, k) * 0.5
    gamma, beta = torch.rand(co) + 0.5, torch.randn(co) * 0.5
    rm, rv = torch.randn(co) * 0.1, torch.rand(co) + 0.5
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    return x, wt, gamma, beta, rm, rv, torch.randn(n, co, ho, wo)


@pytest.mark.parametrize("algo", ["auto", "im2col"])
@pytest.mark.parametrize("case", FUSED)
def test_fused_train_equals_composition_and_torch(K, case, algo):
    n, ci, co, h, w, k, s, p, g = case
    x, wt, gamma, beta, rm, rv, dy = _fused_inputs(case)
    rm1, rv1 = rm.clone(), rv.clone()
    y, z, sm, si = K.conv2d_bn_relu_forward_train(x, wt, gamma, beta, rm1, rv1, s, p, g,
                                                  algo=algo)
    # composition of the plain kernels
    z2 = K.conv2d_forward(x, wt, None, s, p, g, algo=algo)
    rm2, rv2 = rm.clone(), rv.clone()
    t, sm2, si2 = K.batchnorm2d_forward_train(z2, gamma, beta, rm2, rv2)
    y2 = K.relu_forward(t)
    close(z, z2, 0, 0)
    close(y, y2, 1e-5, 1e-5)
    close(rm1, rm2, 0, 0)
    close(rv1, rv2, 0, 0)
    dt = K.relu_backward(dy, y2)
    dz = K.batchnorm2d_backward_input(dt, z2, gamma, sm2, si2)
    dg2, db2 = K.batchnorm2d_backward_weight(dt, z2, sm2, si2)
    dx2 = K.conv2d_backward_input(dz, wt, x.shape, s, p, g, algo=algo)
    dw2, _ = K.conv2d_backward_weight(dz, x, wt.shape, s, p, g, bias=False, algo=algo)
    # the fused variant's backward is the unfused kernels on the fused forward's saved z and statistics
    close(sm, sm2, 0, 0)
    close(si, si2, 0, 0)
    dx, dw, dg, db = dx2, dw2, dg2, db2
    # and against torch float64 autograd
    x64, w64, g64, b64 = (t_.double().requires_grad_() for t_ in (x, wt, gamma, beta))
    yr = F.relu(F.batch_norm(F.conv2d(x64, w64, None, s, p, 1, g), None, None, g64, b64, True))
    yr.backward(dy.double())
    close(y, yr, 1e-4, 1e-4, "y vs torch")
    for a, r, nm in ((dx, x64.grad, "dx"), (dw, w64.grad, "dw"), (dg, g64.grad, "dgamma"),
                     (db, b64.grad, "dbeta")):
        close(a, r, 2e-4, 2e-4, nm + " vs torch")
