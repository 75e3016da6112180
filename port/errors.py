"""PORT's exceptions. Every user-facing error says what is wrong, where, and how to fix it."""


class PortError(Exception):
    """Base class of PORT's errors. The CLI maps them to exit code 2 (bad input), except InternalError."""


class InternalError(PortError):
    """A failure inside PORT, not the user's input (the CLI exits 1 with the details and "please report")."""


class PortTraceError(PortError, ValueError):
    """The model cannot be traced into a training graph."""


class ConfigError(PortError, ValueError):
    """A YAML config is invalid: the message names the file, the dotted key, the value and what is allowed."""


class ProfileError(PortError, ValueError):
    """A profile file is missing, corrupt, truncated or made for another device/graph."""


class PlanError(PortError, ValueError):
    """A plan file is invalid or does not belong to this graph/profile."""


class DiskFullError(PortError, OSError):
    """No space left (ENOSPC, or a disk quota: EDQUOT) while writing an artifact: the message names the file; the
    previous file of that name is kept unchanged (port.io.atomic_writer writes beside it and renames only a
    complete file). An OSError too (errno, filename), so handlers of write failures keep catching it."""

    def __init__(self, path, errno_: int, detail: str = ""):
        import os
        OSError.__init__(self, errno_, os.strerror(errno_), str(path))
        self.path = str(path)
        self.message = detail

    def __str__(self) -> str:
        return self.message


class LockedError(PortError):
    """Another process holds the lock of a directory PORT writes (a run directory of `port train`): the message
    names the directory and the holder's PID (exit 2)."""

    def __init__(self, message: str, pid: int | None):
        super().__init__(message)
        self.pid = pid


class NonFiniteError(PortError):
    """Training produced a non-finite loss or gradient (diverged): names the step, the loss and the fix."""

    def __init__(self, message: str, step: int, loss: float):
        super().__init__(message)
        self.step = step
        self.loss = loss


class InfeasibleBudgetError(PortError):
    """No plan fits the memory budget; carries the smallest feasible budget and the peak's tensors."""

    def __init__(self, message: str, budget_bytes: int, min_feasible_bytes: int | None,
                 peak_tensors: tuple[str, ...] = ()):
        super().__init__(message)
        self.budget_bytes = budget_bytes
        self.min_feasible_bytes = min_feasible_bytes
        self.peak_tensors = peak_tensors


class ProgramError(InternalError, ValueError):
    """A lowered program is inconsistent (out-of-arena offsets, overlapping live tensors, read before write)."""


class SolverError(InternalError):
    """A solver backend failed or returned a plan the simulator rejects (a bug: please report)."""


class LabelError(PortError, ValueError):
    """A batch's labels do not fit the model (a class index outside [0, num_classes)); the message names the
    label value, its index in the batch and num_classes. Raised before the step touches the arena."""


class ArgumentError(PortError, ValueError):
    """A Python API argument is invalid (an optimizer setting, a LoRA rank, a batch, a module another Trainer
    trains): the message names the argument, the value given and the values allowed. Raised before any work
    (tracing, profiling, the arena)."""


class TokenError(ArgumentError):
    """Token ids a model's embeddings cannot look up: an id outside [0, num_embeddings) or a sequence longer
    than the model's context (its position embedding); the message names the input, the value, its place in
    the batch, the embedding and its size. ``kind``: "id" (a token id), "length" (the sequence length) or
    "dtype" (floating-point ids)."""

    def __init__(self, message: str, kind: str = "id"):
        super().__init__(message)
        self.kind = kind
