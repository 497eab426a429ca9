"""The softswitch's P4Runtime server: the `p4.v1.P4Runtime` gRPC service around one `Pipeline`.

A controller (controlplane/, p4runtime-shell, any P4Runtime 1.x client) programs the
softswitch exactly as it programs BMv2's simple_switch_grpc: arbitration on the
StreamChannel, SetForwardingPipelineConfig with the P4Info of p4src/v1model/hysync.p4,
then table entries, multicast groups and counters by P4Info id.

This module is the service: it routes each RPC to the part that owns its concept
(finsy's layout, docs/design.md): p4status (errors), p4binding (the pushed P4Info
against the pipeline's program), p4arbitration (primary election), p4values (ids and
bytestrings <-> the pipeline's names and ints), p4write and p4read.

Deliberate limits: one device; roles are arbitration domains with full pipeline access
(role.config is refused); no packet I/O, digests, meters, action profiles or register
access (the P4 program has none that P4Runtime can reach); DATAPLANE_ATOMIC writes are
UNIMPLEMENTED.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2 as p4r
from p4.v1 import p4runtime_pb2_grpc

from hysync import p4rt_codec
from hysync.softswitch.p4arbitration import Arbiter, Stream
from hysync.softswitch.p4binding import ConfigError, PipelineBinding, bind_p4info
from hysync.softswitch.p4read import Reader
from hysync.softswitch.p4status import BatchError, P4RuntimeError, abort, internal_error, uint128
from hysync.softswitch.p4write import Annotations, Writer
from hysync.softswitch.pipeline import Pipeline

__all__ = ["ConfigError", "SoftswitchP4Runtime", "serve"]

log = logging.getLogger(__name__)

API_VERSION = "1.4.1"
_MAX_MESSAGE = 64 * 1024 * 1024  # big write batches (the spec advises > 4 MB)
_END = object()


class SoftswitchP4Runtime(p4runtime_pb2_grpc.P4RuntimeServicer):
    """P4Runtime for one `Pipeline` (one device)."""

    def __init__(self, pipeline: Pipeline, device_id: int = 1,
                 writers: frozenset[str] | None = None) -> None:
        self.pipeline = pipeline
        self.device_id = device_id
        self.arbiter = Arbiter(device_id)
        # With mutual TLS: the certificate common names that may arbitrate for primary and
        # write (the switch's owner, `hysync serve`); every other client may only read.
        # None: every client may (the P4Runtime default: the election id decides).
        self.writers = writers
        # Serializes writes, pipeline pushes and read snapshots (the data plane only reads
        # the tables, under pipeline.lock, which write_entry takes).
        self._lock = threading.Lock()
        self._config: p4r.ForwardingPipelineConfig | None = None
        self._binding: PipelineBinding | None = None
        self._saved = False  # a VERIFY_AND_SAVE awaits its COMMIT
        self._defaults = {name: (t.default_action, t.default_params)
                          for name, t in pipeline.tables.items()}
        self._annotations = Annotations()
        self._writer = Writer(pipeline, self._annotations)
        self._reader = Reader(pipeline, self._lock, self._annotations)
        # (updates, seconds, ok) of every Write: the softswitch's metrics time them.
        self.on_write: Callable[[int, float, bool], None] | None = None

    # ------------------------------------------------- pipeline config
    def load_p4info(self, p4info: p4info_pb2.P4Info, device_config: bytes = b"") -> None:
        """Install a pipeline config without a controller (the --p4info preload)."""
        binding = bind_p4info(p4info, self.pipeline, self._defaults)
        config = p4r.ForwardingPipelineConfig(p4_device_config=device_config)
        config.p4info.CopyFrom(p4info)
        with self._lock:
            self._commit(config, binding, keep_state=False)

    def _commit(self, config: p4r.ForwardingPipelineConfig, binding: PipelineBinding,
                keep_state: bool) -> None:
        if not keep_state:
            self.pipeline.clear_tables()
            for name, (action, params) in self._defaults.items():
                self.pipeline.set_default_action(name, action, params)
            self._annotations.clear()
        self._config, self._binding, self._saved = config, binding, False

    def SetForwardingPipelineConfig(self, request: p4r.SetForwardingPipelineConfigRequest,
                                    context: grpc.ServicerContext) -> Any:
        return self._unary(context, self._set_pipeline, request, writes=True)

    def _set_pipeline(self, request: p4r.SetForwardingPipelineConfigRequest) -> Any:
        action = request.action
        names = p4r.SetForwardingPipelineConfigRequest.Action
        self._check_device(request.device_id)
        self.arbiter.check_primary(request.role, self._election(request))
        if action == names.COMMIT:
            if request.HasField("config"):
                raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                     "COMMIT takes no config: it commits the one saved by "
                                     "VERIFY_AND_SAVE")
            with self._lock:
                if not self._saved:
                    raise P4RuntimeError(grpc.StatusCode.NOT_FOUND,
                                         "no saved config to commit: send VERIFY_AND_SAVE first")
                # The program never changes, and writes since the save went to the same
                # pipeline: committing keeps them (what the spec's replay would produce).
                self._saved = False
            return p4r.SetForwardingPipelineConfigResponse()
        if action not in (names.VERIFY, names.VERIFY_AND_SAVE, names.VERIFY_AND_COMMIT,
                          names.RECONCILE_AND_COMMIT):
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"action {action} is not a SetForwardingPipelineConfig "
                                 "action: use VERIFY, VERIFY_AND_SAVE, VERIFY_AND_COMMIT, "
                                 "COMMIT or RECONCILE_AND_COMMIT")
        if not request.config.HasField("p4info"):
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 "config.p4info is missing: send the P4Info of "
                                 "p4src/v1model/hysync.p4 (device_config may be empty)")
        try:
            binding = bind_p4info(request.config.p4info, self.pipeline, self._defaults)
        except ConfigError as err:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"P4Info rejected: {err}") from err
        if action == names.VERIFY:
            return p4r.SetForwardingPipelineConfigResponse()
        config = p4r.ForwardingPipelineConfig()
        config.CopyFrom(request.config)  # device_config is kept for Get, otherwise unused
        with self._lock:
            if action == names.VERIFY_AND_SAVE:
                self._config, self._binding, self._saved = config, binding, True
            else:
                # Every accepted P4Info describes the same program and state is kept by
                # name, so RECONCILE_AND_COMMIT can always preserve it.
                self._commit(config, binding, keep_state=action == names.RECONCILE_AND_COMMIT)
        log.info("pipeline config %s (P4Info with %d tables)",
                 names.Name(action), len(binding.tables))
        return p4r.SetForwardingPipelineConfigResponse()

    def GetForwardingPipelineConfig(self, request: p4r.GetForwardingPipelineConfigRequest,
                                    context: grpc.ServicerContext) -> Any:
        return self._unary(context, self._get_pipeline, request)

    def _get_pipeline(self, request: p4r.GetForwardingPipelineConfigRequest) -> Any:
        self._check_device(request.device_id)
        response = p4r.GetForwardingPipelineConfigResponse()
        with self._lock:
            config = self._config
        if config is None:
            return response  # spec: config unset while none is installed
        kind = p4r.GetForwardingPipelineConfigRequest.ResponseType
        response.config.cookie.CopyFrom(config.cookie)
        if request.response_type in (kind.ALL, kind.P4INFO_AND_COOKIE):
            response.config.p4info.CopyFrom(config.p4info)
        if request.response_type in (kind.ALL, kind.DEVICE_CONFIG_AND_COOKIE):
            response.config.p4_device_config = config.p4_device_config
        return response

    def Capabilities(self, request: p4r.CapabilitiesRequest,
                     context: grpc.ServicerContext) -> p4r.CapabilitiesResponse:
        return p4r.CapabilitiesResponse(p4runtime_api_version=API_VERSION)

    # ---------------------------------------------------------- common
    def _unary(self, context: grpc.ServicerContext, handler: Callable[[Any], Any],
               request: Any, writes: bool = False) -> Any:
        """Run a unary handler; every failure becomes a status with a useful message.
        `writes`: only a client --writer allows may send it."""
        try:
            if writes:
                self._check_writer(context)
            return handler(request)
        except (P4RuntimeError, BatchError) as err:
            abort(context, err)
        except Exception as err:
            abort(context, internal_error(err, handler.__name__))

    def may_write(self, context: grpc.ServicerContext) -> bool:
        return self.writers is None or _common_name(context) in self.writers

    def _check_writer(self, context: grpc.ServicerContext) -> None:
        if not self.may_write(context):
            raise P4RuntimeError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"a client whose certificate names {_common_name(context) or 'nobody'!r} may "
                "not arbitrate or write: this switch takes writes only from the certificates "
                f"its --writer names ({', '.join(sorted(self.writers or ()))}), its owner's; "
                "read without an election id, or send the write through the owner "
                "(hysync --serve ADDR)")

    def _check_device(self, device_id: int) -> None:
        if device_id != self.device_id:
            raise P4RuntimeError(grpc.StatusCode.NOT_FOUND,
                                 f"unknown device id {device_id}: this softswitch is device "
                                 f"{self.device_id} (--device-id)")

    @staticmethod
    def _election(request: Any) -> int | None:
        return uint128(request.election_id) if request.HasField("election_id") else None

    def _require_binding(self) -> PipelineBinding:
        if self._binding is None:
            raise P4RuntimeError(grpc.StatusCode.FAILED_PRECONDITION,
                                 "no pipeline config: push one with SetForwardingPipelineConfig")
        return self._binding

    # ----------------------------------------------------------- Write
    def Write(self, request: bytes, context: grpc.ServicerContext) -> Any:
        """A serialized WriteRequest (registered with no deserializer: see _handlers)."""
        return self._unary(context, self._write, request, writes=True)

    def _write(self, data: bytes) -> p4r.WriteResponse:
        start, updates, ok = time.perf_counter(), [0], False
        try:
            with _collector_paused():
                response = self._decode_and_write(data, updates)
            ok = True
            return response
        finally:
            if self.on_write is not None:
                self.on_write(updates[0], time.perf_counter() - start, ok)

    def _decode_and_write(self, data: bytes, updates: list[int]) -> p4r.WriteResponse:
        try:
            request = p4rt_codec.decode_write_request(data)
        except p4rt_codec.MalformedRequestError as err:
            raise P4RuntimeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"malformed WriteRequest: {err}; send a serialized "
                                 "p4.v1.WriteRequest") from err
        updates[0] = len(request.updates)
        self._check_device(request.device_id)
        with self._lock:
            # Checked under the write lock so that a write never lands after a primary change.
            election = None if request.election_id is None else \
                request.election_id[0] << 64 | request.election_id[1]
            self.arbiter.check_primary(request.role, election)
            binding = self._require_binding()
            if request.atomicity == p4r.WriteRequest.DATAPLANE_ATOMIC:
                raise P4RuntimeError(grpc.StatusCode.UNIMPLEMENTED,
                                     "DATAPLANE_ATOMIC is not supported: use CONTINUE_ON_ERROR or "
                                     "ROLLBACK_ON_ERROR (both are all-or-none here)")
            self._writer.write(binding, request.updates)
        return p4r.WriteResponse()

    # ------------------------------------------------------------ Read
    def Read(self, request: p4r.ReadRequest,
             context: grpc.ServicerContext) -> Iterator[bytes]:
        """Serialized ReadResponses (see p4read.encode_counters for why bytes, not messages)."""
        failure: P4RuntimeError | BatchError | None = None
        try:
            self._check_device(request.device_id)
            yield from self._reader.read(self._require_binding(), request)
        except (P4RuntimeError, BatchError) as err:
            failure = err
        except Exception as err:
            failure = internal_error(err, "Read")
        if failure is not None:
            abort(context, failure)

    # -------------------------------------------------- StreamChannel
    def StreamChannel(self, request_iterator: Iterator[p4r.StreamMessageRequest],
                      context: grpc.ServicerContext) -> Iterator[p4r.StreamMessageResponse]:
        out: queue.Queue[Any] = queue.Queue()
        stream = Stream(out.put)
        if not self.may_write(context):  # it may observe, never be elected
            try:
                self._check_writer(context)
            except P4RuntimeError as err:
                stream.refusal = err
        context.add_callback(lambda: out.put(_END))
        threading.Thread(target=self._stream_reader, args=(stream, request_iterator, out),
                         name="p4rt-stream", daemon=True).start()
        try:
            while True:
                item = out.get()
                if item is _END:
                    return
                if isinstance(item, P4RuntimeError):
                    context.abort(item.code, item.message)
                yield item
        finally:
            self.arbiter.remove(stream)

    def _stream_reader(self, stream: Stream, requests: Iterator[p4r.StreamMessageRequest],
                       out: queue.Queue[Any]) -> None:
        try:
            for request in requests:
                error = self._on_stream_message(stream, request)
                if error is not None:
                    out.put(error)  # the handler terminates the stream with it
                    return
        except Exception as err:  # the client went away mid-message
            log.debug("stream closed: %r", err)
        finally:
            self.arbiter.remove(stream)
            out.put(_END)

    def _on_stream_message(self, stream: Stream,
                           request: p4r.StreamMessageRequest) -> P4RuntimeError | None:
        kind = request.WhichOneof("update")
        if kind == "arbitration":
            return self.arbiter.update(stream, request.arbitration)
        error = p4r.StreamError()
        if stream.device_id is None:
            error.canonical_code = grpc.StatusCode.FAILED_PRECONDITION.value[0]
            error.message = "send a MasterArbitrationUpdate first"
        elif kind == "packet" and not self.arbiter.is_primary(stream):
            error.canonical_code = grpc.StatusCode.PERMISSION_DENIED.value[0]
            error.message = "only the primary controller may send packets"
        else:
            error.canonical_code = grpc.StatusCode.UNIMPLEMENTED.value[0]
            error.message = (f"{kind} messages are not supported: the HySync program has no "
                             "packet I/O or digests")
        if kind == "packet":
            error.packet_out.packet_out.CopyFrom(request.packet)
        stream.send(p4r.StreamMessageResponse(error=error))
        return None


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection during a write. A big batch allocates ~10 acyclic
    records per update, enough to set off full collections that hold the GIL for tens of
    ms each: time the reference model's data-plane thread would wait (bench/write_bench)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _handlers(servicer: SoftswitchP4Runtime) -> grpc.GenericRpcHandler:
    """p4runtime_pb2_grpc.add_P4RuntimeServicer_to_server, except that Write takes bytes
    and Read yields bytes."""
    def handler(kind: Callable[..., grpc.RpcMethodHandler], method: Callable[..., Any],
                request: Any, response: Any) -> grpc.RpcMethodHandler:
        serialize = response.SerializeToString if response is not bytes else bytes
        parse = request.FromString if request is not bytes else None
        return kind(method, request_deserializer=parse, response_serializer=serialize)

    return grpc.method_handlers_generic_handler("p4.v1.P4Runtime", {
        # Write is decoded by hysync/p4rt_codec, not the (pure-Python, slow) protobuf library.
        "Write": handler(grpc.unary_unary_rpc_method_handler, servicer.Write,
                         bytes, p4r.WriteResponse),
        "Read": handler(grpc.unary_stream_rpc_method_handler, servicer.Read,
                        p4r.ReadRequest, bytes),
        "SetForwardingPipelineConfig": handler(
            grpc.unary_unary_rpc_method_handler, servicer.SetForwardingPipelineConfig,
            p4r.SetForwardingPipelineConfigRequest, p4r.SetForwardingPipelineConfigResponse),
        "GetForwardingPipelineConfig": handler(
            grpc.unary_unary_rpc_method_handler, servicer.GetForwardingPipelineConfig,
            p4r.GetForwardingPipelineConfigRequest, p4r.GetForwardingPipelineConfigResponse),
        "StreamChannel": handler(grpc.stream_stream_rpc_method_handler, servicer.StreamChannel,
                                 p4r.StreamMessageRequest, p4r.StreamMessageResponse),
        "Capabilities": handler(grpc.unary_unary_rpc_method_handler, servicer.Capabilities,
                                p4r.CapabilitiesRequest, p4r.CapabilitiesResponse),
    })


def serve(pipeline: Pipeline, grpc_addr: str, device_id: int = 1, *,
          p4info: p4info_pb2.P4Info | None = None, max_workers: int = 32,
          credentials: grpc.ServerCredentials | None = None,
          on_write: Callable[[int, float, bool], None] | None = None,
          writers: frozenset[str] | None = None,
          ) -> tuple[grpc.Server, int]:
    """Start a P4Runtime server for `pipeline` on `grpc_addr` (port 0 picks a free port),
    over TLS with `credentials` (hysync.tls.server_credentials), else in the clear.
    `writers` (mutual TLS only): the client certificate common names that may arbitrate and
    write; every other client may read.

    Returns the running server and the port it is bound to. `p4info` preloads a
    pipeline config (raises ConfigError if it does not fit). Raises OSError if the
    address cannot be bound.
    """
    servicer = SoftswitchP4Runtime(pipeline, device_id, writers)
    servicer.on_write = on_write
    if p4info is not None:
        servicer.load_p4info(p4info)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="p4rt"),
        options=[("grpc.so_reuseport", 0),  # a second softswitch on the port must fail
                 ("grpc.max_receive_message_length", _MAX_MESSAGE),
                 ("grpc.max_send_message_length", _MAX_MESSAGE)])
    server.add_generic_rpc_handlers((_handlers(servicer),))
    try:
        port = (server.add_secure_port(grpc_addr, credentials) if credentials is not None
                else server.add_insecure_port(grpc_addr))
    except RuntimeError as err:
        port = 0
        reason = str(err).split(";")[0]
    else:
        reason = "bind failed"
    if port == 0:
        server.stop(None)
        raise OSError(f"cannot listen for P4Runtime on {grpc_addr} ({reason}): is the port in "
                      "use or the address wrong? Pick another with --grpc-addr HOST:PORT")
    server.start()
    log.info("P4Runtime server for device %d on port %d%s", device_id, port,
             " (TLS)" if credentials is not None else "")
    return server, port



def _common_name(context: grpc.ServicerContext) -> str | None:
    """The common name of the client's certificate (mutual TLS), else None."""
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode(errors="replace") if names else None
