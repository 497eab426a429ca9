"""Typed exceptions of the HySync control plane.

Every message says what is wrong and, where there is one, how to fix it: the CLI
prints `str(error)` as its one line of output. gRPC failures become a subclass of
`P4RuntimeError` carrying the server's own message (`map_rpc_error`).
"""

from __future__ import annotations

import grpc

from hysync.errors import BadFileError, HySyncError

# The schema's errors are the control plane's too (it encodes through that schema).
from hysync.p4schema import EncodeError, SchemaError  # noqa: F401


class ControlPlaneError(HySyncError):
    """Base class of every error the control plane raises on purpose."""


class JobConfigError(ControlPlaneError, BadFileError):
    """A job file that does not describe a valid job; the message names the field."""


class JobError(ControlPlaneError):
    """A job operation that conflicts with the switch's state (unknown job, overlap, ...)."""


class UnknownJobError(JobError, KeyError):
    """No job with this id is installed on the switch."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the sentence
        return str(self.args[0]) if self.args else ""


class ValidationError(ControlPlaneError, ValueError):
    """A request (slot range, quorum, worker id) outside what the job allows."""


class DeviceConfigError(ControlPlaneError, BadFileError):
    """The device config (BMv2 JSON, Tofino compiler output) cannot be read or packed."""


class P4RuntimeUnreachableError(ControlPlaneError, ConnectionError):
    """The gRPC channel to the switch could not be opened, or the switch went away."""

    def __init__(self, grpc_addr: str, detail: str = "") -> None:
        self.grpc_addr = grpc_addr
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"cannot reach the switch at {grpc_addr}{extra}: is it running? start it with "
            f"`python -m hysync.softswitch --grpc-addr {grpc_addr} ...`")


class NotPrimaryError(ControlPlaneError):
    """Another controller with a higher election id is the primary for this device, or
    none is but the switch remembers a higher id than ours (`live` False: P4Runtime elects
    only an id at least as high as the highest it has seen, until the switch restarts)."""

    def __init__(self, grpc_addr: str, device_id: int, mine: tuple[int, int],
                 primary: tuple[int, int] | None, detail: str = "", *,
                 live: bool | None = None) -> None:
        self.primary = primary
        self.election_id = mine
        self.live = live
        why = f" ({detail})" if detail else ""
        where = f"device {device_id} at {grpc_addr}"
        if live is False and primary is not None:
            wanted = _fmt_election((primary[0], primary[1] + 1) if primary[1] < 2**64 - 1
                                   else primary)
            super().__init__(
                f"not the primary controller of {where}: no controller is primary now, but "
                f"the switch has seen election id {_fmt_election(primary)}{_parts(primary)} "
                f"and elects only an id at least that high; {_fmt_election(mine)} is lower"
                f"{why}. An earlier session raised it (p4runtime-shell's default election id "
                f"is 1,0, higher than any plain number). Pass --election-id {wanted} (an "
                f"inventory: switch.election_id = \"{wanted}\") or restart the switch; "
                "inspect with `p4runtime-shell --election-id 0,1` so that it stays below")
            return
        who = (f"the controller with election id {_fmt_election(primary)}"
               if primary is not None else "another controller")
        super().__init__(
            f"not the primary controller of {where}: {who} is primary and "
            f"{_fmt_election(mine)} is not higher{why}. If it is `hysync serve`, send the "
            "write through it: `hysync --serve ADDR ...` (or HYSYNC_SERVE=ADDR), as a higher "
            "--election-id would take the switch from it; if it is p4runtime-shell (default "
            "election id 1,0), reopen it with --election-id 0,1 to read as a backup; else "
            "stop the other controller or pass a higher --election-id")


class NoPipelineError(ControlPlaneError):
    """The switch has no forwarding pipeline configured yet."""

    def __init__(self, grpc_addr: str) -> None:
        super().__init__(
            f"the switch at {grpc_addr} has no pipeline: push one with `hysync pipeline push "
            "--p4info p4src/v1model/hysync.p4info.txtpb`")


class P4RuntimeError(ControlPlaneError):
    """The switch refused a P4Runtime request; `code` is the grpc status code."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None,
                 failures: tuple[tuple[int, str, str], ...] = ()) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        # (update index, status code name, message) of each failed update of a Write.
        self.failures = failures


class AlreadyExistsError(P4RuntimeError):
    code = grpc.StatusCode.ALREADY_EXISTS


class NotFoundError(P4RuntimeError):
    code = grpc.StatusCode.NOT_FOUND


class InvalidArgumentError(P4RuntimeError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class PermissionDeniedError(P4RuntimeError):
    code = grpc.StatusCode.PERMISSION_DENIED


class FailedPreconditionError(P4RuntimeError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhaustedError(P4RuntimeError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnimplementedError(P4RuntimeError):
    code = grpc.StatusCode.UNIMPLEMENTED


class DeadlineExceededError(P4RuntimeError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


_BY_CODE: dict[grpc.StatusCode, type[P4RuntimeError]] = {
    cls.code: cls for cls in (
        AlreadyExistsError, NotFoundError, InvalidArgumentError, PermissionDeniedError,
        FailedPreconditionError, ResourceExhaustedError, UnimplementedError,
        DeadlineExceededError)
}
_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def status_code(number: int) -> grpc.StatusCode:
    """google.rpc.Code number -> grpc.StatusCode (UNKNOWN for a number grpc does not know)."""
    return _CODE_BY_NUMBER.get(number, grpc.StatusCode.UNKNOWN)


def error_for(code: grpc.StatusCode, message: str,
              failures: tuple[tuple[int, str, str], ...] = ()) -> P4RuntimeError:
    cls = _BY_CODE.get(code, P4RuntimeError)
    return cls(message, code=code, failures=failures)


def _parts(election: tuple[int, int]) -> str:
    """' (high=1, low=0)' where the high half is set, as P4Runtime messages print it."""
    return f" (high={election[0]}, low={election[1]})" if election[0] else ""


def _fmt_election(election: tuple[int, int] | None) -> str:
    if election is None:
        return "?"
    high, low = election
    return str(low) if high == 0 else f"{high},{low}"
