"""PORT's C kernel library through ctypes, without torch: constants, param structs, the signature table that
mirrors ``kernels/include/port_kernels.h`` (a test parses the header and compares), the raw functions
(``raw.port_<name>`` and the short alias ``raw.<name>``) and status checking.

Lowering uses this module's workspace queries (pure functions of shapes) without importing torch; the checked
tensor API in ``port.exec.kernels`` and the executor's backends build on it.
"""
from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_int64, c_size_t, c_uint64, c_void_p

from port.errors import InternalError as _PortErrorBase
from port.exec import native as _native

# --------------------------------------------------------------------------- constants
PORT_OK, PORT_ERR_NULL, PORT_ERR_SHAPE, PORT_ERR_ARG, PORT_ERR_WORKSPACE, PORT_ERR_UNSUPPORTED, \
    PORT_ERR_ALIAS = range(7)
GEMM_BLAS, GEMM_VENDORED, GEMM_AUTO = 0, 1, 2
CONV_AUTO, CONV_IM2COL, CONV_DIRECT, CONV_WINOGRAD = 0, 1, 2, 3
ATTN_PLAIN, ATTN_TILED = 0, 1
_ALGOS = {"auto": CONV_AUTO, "im2col": CONV_IM2COL, "direct": CONV_DIRECT, "winograd": CONV_WINOGRAD}


# --------------------------------------------------------------------------- param structs
class Conv2dParams(ctypes.Structure):
    _fields_ = [(f, c_int64) for f in ("n", "c_in", "h", "w", "c_out", "kh", "kw", "stride_h",
                                       "stride_w", "pad_h", "pad_w", "groups", "h_out", "w_out")]


class BatchNormParams(ctypes.Structure):
    _fields_ = [("n", c_int64), ("c", c_int64), ("h", c_int64), ("w", c_int64), ("eps", c_float),
                ("momentum", c_float)]


class Pool2dParams(ctypes.Structure):
    _fields_ = [(f, c_int64) for f in ("n", "c", "h", "w", "kh", "kw", "stride_h", "stride_w",
                                       "pad_h", "pad_w", "h_out", "w_out")]


class LinearParams(ctypes.Structure):
    _fields_ = [("n", c_int64), ("in_features", c_int64), ("out_features", c_int64)]


class AttentionParams(ctypes.Structure):
    _fields_ = [("bh", c_int64), ("heads", c_int64), ("tq", c_int64), ("tk", c_int64), ("dh", c_int64),
                ("causal", c_int64), ("scale", c_float)]


RT_MAX_PTRS, RT_MAX_INTS, RT_MAX_FLOATS = 10, 16, 2


class RtCall(ctypes.Structure):
    """port_rt_call (kernels/include/port_rt.h): one compiled kernel call."""
    _fields_ = [("kernel", ctypes.c_int32), ("op", ctypes.c_int32), ("flags", ctypes.c_int32),
                ("reserved", ctypes.c_int32), ("ptr", ctypes.c_int64 * RT_MAX_PTRS),
                ("iv", ctypes.c_int64 * RT_MAX_INTS), ("fv", ctypes.c_double * RT_MAX_FLOATS),
                ("ws_offset", ctypes.c_int64), ("ws_bytes", ctypes.c_int64),
                ("zero_offset", ctypes.c_int64 * 2), ("zero_bytes", ctypes.c_int64 * 2)]


class RtState(ctypes.Structure):
    """port_rt_state: the optimizer's settings and the run's counters."""
    _fields_ = [("optimizer", ctypes.c_int32), ("nesterov", ctypes.c_int32), ("lr", ctypes.c_double),
                ("momentum", ctypes.c_double), ("dampening", ctypes.c_double), ("weight_decay", ctypes.c_double),
                ("beta1", ctypes.c_double), ("beta2", ctypes.c_double), ("eps", ctypes.c_double),
                ("step", ctypes.c_int64), ("seed", ctypes.c_uint64), ("dropout_counter", ctypes.c_int64)]


class Rt(ctypes.Structure):
    """port_rt: a loaded bundle (pointers into the caller's bundle bytes and arena). Its size is checked
    against the library's port_rt_struct_bytes() when loaded (port.exec.rtengine)."""
    _fields_ = [("bundle", c_void_p), ("bundle_bytes", c_uint64), ("arena", c_void_p), ("arena_bytes", c_uint64),
                ("persistent_bytes", c_uint64), ("calls", c_void_p), ("n_train", ctypes.c_uint32),
                ("n_eval", ctypes.c_uint32), ("n_zero", ctypes.c_uint32), ("zero", c_void_p)] + \
        [(f, c_int64) for f in ("input_offset", "input_bytes", "label_offset", "label_bytes", "loss_offset",
                                "logits_offset", "batch", "classes", "eval_input_offset", "eval_logits_offset",
                                "eval_loss_offset", "eval_label_offset")] + \
        [("state", RtState), ("graph_digest", ctypes.c_char * 65), ("plan_digest", ctypes.c_char * 65),
         ("spill_fd", c_int), ("failed_call", ctypes.c_int32), ("bad_label", c_int64), ("bad_label_index", c_int64),
         ("ckpt_table", c_void_p), ("ckpt_fixed", c_void_p), ("ckpt_tensors", c_void_p), ("ckpt_n", ctypes.c_uint32),
         ("ckpt_fixed_len", ctypes.c_uint32), ("ckpt_tensors_len", ctypes.c_uint32), ("ckpt_data_bytes", c_uint64),
         ("input_dtype", ctypes.c_uint32), ("has_ignore_index", ctypes.c_uint32), ("labels_per_sample", c_int64),
         ("ignore_index", c_int64)]


_STRUCTS = {"port_rt": Rt, "port_rt_call": RtCall, "port_rt_state": RtState, "port_conv2d_params": Conv2dParams, "port_batchnorm_params": BatchNormParams,
            "port_pool2d_params": Pool2dParams, "port_linear_params": LinearParams,
            "port_attention_params": AttentionParams}

# --------------------------------------------------------------------------- signature table
# (name, C return type, (C argument types...)) -- mirrors port_kernels.h exactly
# (tests/kernels/test_header_binding.py parses the header and compares).
_CP = "const port_conv2d_params*"
_BP = "const port_batchnorm_params*"
_PP = "const port_pool2d_params*"
_LP = "const port_linear_params*"
_AP = "const port_attention_params*"
_CI64, _CU8 = "const int64_t*", "const uint8_t*"
_F, _CF = "float*", "const float*"
SIGNATURES: list[tuple[str, str, tuple[str, ...]]] = [
    ("port_status_string", "const char*", ("int",)),
    ("port_abi_version", "int", ()),
    ("port_set_num_threads", "void", ("int",)),
    ("port_get_num_threads", "int", ()),
    ("port_cpu_has_avx512", "int", ()),
    ("port_set_gemm_backend", "port_status", ("int",)),
    ("port_get_gemm_backend", "int", ()),
    ("port_gemm_backend_for", "int", ("int", "int", "int64_t", "int64_t", "int64_t")),
    ("port_sgemm", "port_status", (_F, _CF, _CF, "int", "int", "int64_t", "int64_t", "int64_t",
                                   "float", "float", "int64_t", "int64_t", "int64_t")),
    ("port_conv2d_out_h", "int64_t", (_CP,)),
    ("port_conv2d_out_w", "int64_t", (_CP,)),
    ("port_conv2d_check", "port_status", (_CP,)),
    ("port_conv2d_workspace_bytes", "size_t", (_CP, "int")),
    ("port_conv2d_resolve_algo", "int", (_CP, "int")),
    ("port_conv2d_forward", "port_status", (_F, _CF, _CF, _CF, _CP, "int", "void*", "size_t")),
    ("port_conv2d_backward_input", "port_status", (_F, _CF, _CF, _CP, "int", "void*", "size_t")),
    ("port_conv2d_backward_weight", "port_status", (_F, _F, _CF, _CF, _CP, "int", "void*",
                                                    "size_t")),
    ("port_conv2d_backward_weight_overwrite", "port_status", (_F, _F, _CF, _CF, _CP, "int", "void*",
                                                              "size_t")),
    ("port_conv2d_patch_workspace_bytes", "size_t", (_CP, "int64_t", "int64_t")),
    ("port_conv2d_patch_forward", "port_status", (_F, _CF, _CF, _CF, _CP, "int64_t", "int64_t",
                                                  "void*", "size_t")),
    ("port_conv2d_patch_backward_input", "port_status", (_F, _CF, _CF, _CP, "int64_t", "int64_t",
                                                         "void*", "size_t")),
    ("port_conv2d_patch_backward_weight", "port_status", (_F, _F, _CF, _CF, _CP, "int64_t",
                                                          "int64_t", "void*", "size_t")),
    ("port_conv2d_reference_forward", "port_status", (_F, _CF, _CF, _CF, _CP)),
    ("port_conv2d_reference_backward_input", "port_status", (_F, _CF, _CF, _CP)),
    ("port_conv2d_reference_backward_weight", "port_status", (_F, _F, _CF, _CF, _CP)),
    ("port_batchnorm2d_forward_train", "port_status", (_F, _F, _F, _F, _F, _CF, _CF, _CF, _BP)),
    ("port_batchnorm2d_forward_eval", "port_status", (_F, _CF, _CF, _CF, _CF, _CF, _BP)),
    ("port_batchnorm2d_backward_input", "port_status", (_F, _CF, _CF, _CF, _CF, _CF, _BP)),
    ("port_batchnorm2d_backward_weight", "port_status", (_F, _F, _CF, _CF, _CF, _CF, _BP)),
    ("port_batchnorm2d_backward_input_from_output", "port_status", (_F, _CF, _CF, _CF, _CF, _CF,
                                                                    _BP)),
    ("port_batchnorm2d_backward_weight_from_output", "port_status", (_F, _F, _CF, _CF, _CF, _CF,
                                                                     _BP)),
    ("port_batchnorm2d_backward_input_eval", "port_status", (_F, _CF, _CF, _CF, _BP)),
    ("port_batchnorm2d_backward_weight_eval", "port_status", (_F, _F, _CF, _CF, _CF, _CF, _BP)),
    ("port_relu_forward", "port_status", (_F, _CF, "int64_t")),
    ("port_relu_backward", "port_status", (_F, _CF, _CF, "int64_t")),
    ("port_relu6_forward", "port_status", (_F, _CF, "int64_t")),
    ("port_relu6_backward", "port_status", (_F, _CF, _CF, "int64_t")),
    ("port_hardswish_forward", "port_status", (_F, _CF, "int64_t")),
    ("port_hardswish_backward", "port_status", (_F, _CF, _CF, "int64_t")),
    ("port_add", "port_status", (_F, _CF, _CF, "int64_t")),
    ("port_accumulate", "port_status", (_F, _CF, "int64_t")),
    ("port_dropout_forward", "port_status", (_F, "uint8_t*", _CF, "int64_t", "float", "uint64_t")),
    ("port_dropout_backward", "port_status", (_F, _CF, "const uint8_t*", "int64_t", "float")),
    ("port_pool2d_out_h", "int64_t", (_PP,)),
    ("port_pool2d_out_w", "int64_t", (_PP,)),
    ("port_maxpool2d_forward", "port_status", (_F, "int64_t*", _CF, _PP)),
    ("port_maxpool2d_backward_input", "port_status", (_F, _CF, "const int64_t*", _PP)),
    ("port_avgpool2d_forward", "port_status", (_F, _CF, _PP)),
    ("port_avgpool2d_backward_input", "port_status", (_F, _CF, _PP)),
    ("port_global_avgpool_forward", "port_status", (_F, _CF, "int64_t", "int64_t", "int64_t")),
    ("port_global_avgpool_backward_input", "port_status", (_F, _CF, "int64_t", "int64_t",
                                                           "int64_t")),
    ("port_linear_forward", "port_status", (_F, _CF, _CF, _CF, _LP)),
    ("port_linear_backward_input", "port_status", (_F, _CF, _CF, _LP)),
    ("port_linear_backward_weight", "port_status", (_F, _F, _CF, _CF, _LP)),
    ("port_softmax_xent_forward", "port_status", (_F, _F, _CF, "const int64_t*", "int64_t",
                                                  "int64_t", "float")),
    ("port_softmax_xent_backward", "port_status", (_F, _CF, "const int64_t*", _CF, "int64_t",
                                                   "int64_t", "float")),
    ("port_sgd_step", "port_status", (_F, _F, _CF, "int64_t", "double", "double", "double",
                                      "double", "int", "int")),
    ("port_adamw_step", "port_status", (_F, _F, _F, _CF, "int64_t", "double", "double", "double",
                                        "double", "double", "int64_t")),
    ("port_conv2d_bn_relu_forward_train", "port_status", (_F, _F, _F, _F, _F, _F, _CF, _CF, _CF,
                                                          _CF, _CP, "float", "float", "int",
                                                          "void*", "size_t")),
    ("port_bias_backward", "port_status", (_F, _CF, "int64_t", "int64_t", "int64_t")),
    # Transformer
    ("port_embedding_forward", "port_status", (_F, _CI64, _CF, "int64_t", "int64_t", "int64_t")),
    ("port_embedding_backward_weight", "port_status", (_F, _CF, _CI64, "int64_t", "int64_t", "int64_t")),
    ("port_layernorm_forward", "port_status", (_F, _F, _CF, _CF, _CF, "int64_t", "int64_t", "float")),
    ("port_layernorm_backward_input", "port_status", (_F, _CF, _CF, _CF, _CF, "int64_t", "int64_t")),
    ("port_layernorm_backward_weight", "port_status", (_F, _F, _CF, _CF, _CF, "int64_t", "int64_t")),
    ("port_gelu_forward", "port_status", (_F, _CF, "int64_t", "int")),
    ("port_gelu_backward", "port_status", (_F, _CF, _CF, "int64_t", "int")),
    ("port_tanh_forward", "port_status", (_F, _CF, "int64_t")),
    ("port_tanh_backward", "port_status", (_F, _CF, _CF, "int64_t")),
    ("port_scale", "port_status", (_F, _CF, "int64_t", "float")),
    ("port_softmax_forward", "port_status", (_F, _CF, "int64_t", "int64_t")),
    ("port_softmax_backward", "port_status", (_F, _CF, _CF, "int64_t", "int64_t")),
    ("port_bmm", "port_status", (_F, _CF, _CF, "int64_t", "int64_t", "int64_t", "int64_t", "int", "int",
                                 "float", "float")),
    ("port_permute", "port_status", (_F, _CF, "int64_t", _CI64, _CI64)),
    ("port_add_broadcast", "port_status", (_F, _CF, _CF, "int64_t", "int64_t")),
    ("port_sum_rows", "port_status", (_F, _CF, "int64_t", "int64_t")),
    ("port_mean_mid_forward", "port_status", (_F, _CF, "int64_t", "int64_t", "int64_t")),
    ("port_mean_mid_backward", "port_status", (_F, _CF, "int64_t", "int64_t", "int64_t")),
    ("port_arange_i64", "port_status", ("int64_t*", "int64_t", "int64_t")),
    ("port_ne_scalar_i64", "port_status", ("uint8_t*", _CI64, "int64_t", "int64_t")),
    ("port_attention_workspace_bytes", "size_t", (_AP, "int", "int")),
    ("port_attention_forward", "port_status", (_F, _F, _CF, _CF, _CF, _CU8, _AP, "int", "void*", "size_t")),
    ("port_attention_backward", "port_status", (_F, _F, _F, _CF, _CF, _CF, _CF, _CF, _CF, _CU8, _AP, "int",
                                                "void*", "size_t")),
    ("port_softmax_xent_ignore_forward", "port_status", (_F, _F, _CF, _CI64, "int64_t", "int64_t", "float",
                                                         "int64_t")),
    ("port_softmax_xent_ignore_backward", "port_status", (_F, _CF, _CI64, _CF, "int64_t", "int64_t", "float",
                                                          "int64_t")),
    # port_rt.h
    ("port_rt_abi_version", "int", ()),
    ("port_rt_kernel_name", "const char*", ("int",)),
    ("port_rt_dropout_seed", "uint64_t", ("uint64_t", "int64_t", "int64_t")),
    ("port_rt_exec", "port_status", ("const port_rt_call*", "void*const*", "void*", "const port_rt_state*")),
    ("port_rt_bundle_check", "int", ("const uint8_t*", "uint64_t", "uint64_t*")),
    ("port_rt_load", "int", ("port_rt*", "const uint8_t*", "uint64_t", "uint8_t*", "uint64_t")),
    ("port_rt_step", "int", ("port_rt*", "const void*", "const int64_t*", "float*")),
    ("port_rt_forward_backward", "int", ("port_rt*", "const void*", "const int64_t*", "float*")),
    ("port_rt_update", "int", ("port_rt*",)),
    ("port_rt_struct_bytes", "uint64_t", ()),
    ("port_rt_evaluate", "int", ("port_rt*", "const void*", "const int64_t*", "float*", "int64_t*")),
    ("port_sha256", "void", ("uint8_t*", "const void*", "uint64_t")),
    ("port_rt_checkpoint_bytes", "uint64_t", ("const port_rt*",)),
    ("port_rt_write_checkpoint", "int", ("const port_rt*", "uint8_t*", "uint64_t", "uint64_t*")),
    ("port_rt_read_checkpoint", "int", ("port_rt*", "const uint8_t*", "uint64_t")),
]

_SCALARS = {"int": c_int, "int64_t": c_int64, "uint64_t": c_uint64, "float": c_float,
            "double": c_double, "size_t": c_size_t, "port_status": c_int, "void": None,
            "const char*": c_char_p}


def ctype_of(ctype: str):
    """ctypes type used for a C type string of SIGNATURES (pointers -> c_void_p)."""
    if ctype in _SCALARS:
        return _SCALARS[ctype]
    if ctype.endswith("*"):
        base = ctype.replace("const ", "").rstrip("*").strip()
        if base in _STRUCTS:
            return POINTER(_STRUCTS[base])
        return c_void_p
    raise TypeError(f"unmapped C type {ctype!r}")


class _Raw:
    """Namespace of the raw ctypes functions (attributes named like the C functions)."""


raw = _Raw()
_lib = _native.load()  # loads torch's OpenMP runtime by path, not torch
for _name, _ret, _args in SIGNATURES:
    _fn = getattr(_lib, _name)
    _fn.restype = ctype_of(_ret)
    _fn.argtypes = [ctype_of(a) for a in _args]
    setattr(raw, _name, _fn)
    setattr(raw, _name[len("port_"):], _fn)  # short alias, e.g. raw.relu_forward


# --------------------------------------------------------------------------- errors
class KernelError(_PortErrorBase, RuntimeError):
    """A C kernel returned a non-OK status."""

    def __init__(self, status: int, where: str):
        self.status = status
        msg = raw.port_status_string(status).decode()
        super().__init__(f"{where}: {msg} (status {status})")


class KernelValueError(KernelError, ValueError):
    """Bad shape / argument / NULL / aliasing reported by C."""


class WorkspaceError(KernelError, ValueError):
    """Workspace smaller than the *_workspace_bytes query."""


class UnsupportedError(KernelError, NotImplementedError):
    """The requested algorithm does not apply to these parameters."""


def check(status: int, where: str = "kernel") -> None:
    """Raise the exception of a non-zero status."""
    if status == PORT_OK:
        return
    if status == PORT_ERR_WORKSPACE:
        raise WorkspaceError(status, where)
    if status == PORT_ERR_UNSUPPORTED:
        raise UnsupportedError(status, where)
    if status in (PORT_ERR_NULL, PORT_ERR_SHAPE, PORT_ERR_ARG, PORT_ERR_ALIAS):
        raise KernelValueError(status, where)
    raise KernelError(status, where)


def status_string(status: int) -> str:
    return raw.port_status_string(status).decode()


