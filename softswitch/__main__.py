"""`python -m hysync.softswitch`: the softswitch as a process, a drop-in for simple_switch_grpc.

    python -m hysync.softswitch --grpc-addr 127.0.0.1:9559 [--device-id 1]
                         [--udp HOST:PORT | -i PORT@IFACE ...]
                         [--engine native|python] [--threads N]
                         [--p4info FILE] [--log-level info]
                         [--server-cert-file PEM --server-key-file PEM [--ca-cert-file PEM]]

Without --udp or -i the data plane is UDP on 127.0.0.1:48620 (no root needed).
With a certificate and key (Stratum's flag names) P4Runtime is served over TLS; with a CA
too, only clients presenting a certificate that CA signed are served (mutual TLS).
The native engine (the compiled core, native/dataplane/) is the default; `--engine
python` runs the reference model (softswitch/pipeline.py) instead.
Prints one line saying where it listens; SIGINT or SIGTERM stops it (exit 0).
Bad arguments or an unusable address/interface: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import NoReturn

import grpc
from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

from hysync import files, logs, wire
from hysync.softswitch.delay import parse_delay
from hysync.softswitch.native import (
    NativePipeline,
    NativeRawDataPlane,
    NativeUdpDataPlane,
    default_threads,
)
from hysync.softswitch.pipeline import Pipeline
from hysync.softswitch.raw_dataplane import RawDataPlane, parse_port, parse_port_map
from hysync.softswitch.server import ConfigError, serve
from hysync.softswitch.udp_dataplane import UdpDataPlane
from hysync.tls import server_credentials

PROG = "python -m hysync.softswitch"
DEFAULT_UDP = f"127.0.0.1:{wire.HYSYNC_UDP_PORT}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        _fail(message)


def _fail(message: str) -> NoReturn:
    print(f"softswitch: error: {message} (see {PROG} --help)", file=sys.stderr)
    sys.exit(2)


def _reason(err: Exception) -> str:
    """The message of an error without the '[Errno N]' prefix."""
    return err.strerror if isinstance(err, OSError) and err.strerror else str(err)


def host_port(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port); the port may be 0 (any free port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9559)")
    return host.strip("[]"), int(port)


def port_spec(text: str) -> str:
    try:
        parse_port(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err
    return text


def delay_spec(text: str) -> tuple[int, float]:
    try:
        return parse_delay(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def device_id(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 1 << 64:
        raise argparse.ArgumentTypeError(f"device id {text!r} must be an integer "
                                         "1..18446744073709551615 (P4Runtime's uint64)")
    return int(text)


def thread_count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise argparse.ArgumentTypeError(f"thread count {text!r} must be an integer 1-64")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="HySync softswitch: the state machine of "
                     "p4src/v1model/hysync.p4 (compiled, or the Python reference model) behind a "
                     "P4Runtime gRPC server.")
    parser.add_argument("--grpc-addr", default="127.0.0.1:9559", type=host_port,
                        metavar="HOST:PORT", help="P4Runtime server address (port 0: any free "
                        "port; default %(default)s)")
    parser.add_argument("--device-id", default=1, type=device_id,
                        help="P4Runtime device id (default %(default)s)")
    plane = parser.add_mutually_exclusive_group()
    plane.add_argument("--udp", type=host_port, metavar="HOST:PORT",
                       help=f"UDP data plane on this address (default {DEFAULT_UDP})")
    plane.add_argument("-i", "--interface", dest="interfaces", action="append", type=port_spec,
                       metavar="PORT@IFACE",
                       help="raw data plane: switch port PORT on interface IFACE (repeat; "
                       "needs root)")
    parser.add_argument("--delay", dest="delays", action="append", type=delay_spec,
                        default=[], metavar="PORT:MS",
                        help="raw data plane: hold frames leaving PORT for MS milliseconds "
                        "(link delay emulation; this kernel has no netem; repeat)")
    parser.add_argument("--engine", choices=["native", "python"], default="native",
                        help="native: the compiled data plane (default); python: the reference "
                        "model, one thread")
    parser.add_argument("--threads", type=thread_count, metavar="N",
                        help="native UDP data plane: threads, each on its own SO_REUSEPORT "
                        f"socket (default: one per core, at most 8; here {default_threads()})")
    parser.add_argument("--p4info", type=Path, metavar="FILE",
                        help="preload this P4Info (text format) as the pipeline config")
    tls = parser.add_argument_group("P4Runtime over TLS")
    tls.add_argument("--server-cert-file", type=Path, metavar="PEM",
                     help="serve TLS with this certificate (needs --server-key-file)")
    tls.add_argument("--server-key-file", type=Path, metavar="PEM",
                     help="the private key of --server-cert-file")
    tls.add_argument("--ca-cert-file", type=Path, metavar="PEM",
                     help="require clients to present a certificate this CA signed")
    tls.add_argument("--writer", dest="writers", action="append", metavar="NAME",
                     help="only a client whose certificate's common name is NAME may "
                     "arbitrate for primary and write (the switch's owner, hysync serve); "
                     "others may read. Repeat for more names; needs --ca-cert-file")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"],
                        help="default %(default)s")
    parser.add_argument("--log-format", default="text", choices=logs.FORMATS,
                        help="log lines on stderr: text (default) or json, one object per line")
    parser.add_argument("--metrics-addr", type=host_port, metavar="HOST:PORT",
                        help="serve Prometheus metrics on http://HOST:PORT/metrics (default: "
                        "off; 127.0.0.1:PORT keeps them on this host)")
    return parser


def load_p4info(path: Path) -> p4info_pb2.P4Info:
    """The --p4info file, bounded in size and nesting (hysync.files); ValueError if not."""
    fix = "pass a text P4Info such as p4src/v1model/hysync.p4info.txtpb"
    text = files.read_text(path, what="the --p4info file", fix=fix)
    files.check_nesting(path, text, "textproto", what="a P4Info", fix=fix)
    p4info = p4info_pb2.P4Info()
    try:
        text_format.Parse(text, p4info)
    except text_format.ParseError as err:
        raise ValueError(f"--p4info {path} is not a text-format P4Info: {err}") from err
    return p4info


def _check_free(host: str, port: int, where: str) -> None:
    """Fail with one line if the gRPC port is taken (gRPC itself would also log to stderr)."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise OSError(err.errno, f"cannot listen for P4Runtime on {where}: "
                          f"{err.strerror}; pick another with --grpc-addr HOST:PORT") from err


DataPlane = UdpDataPlane | RawDataPlane | NativeUdpDataPlane | NativeRawDataPlane


def _data_plane(args: argparse.Namespace) -> tuple[Pipeline, DataPlane, str]:
    """The pipeline of --engine, its data plane (--udp or -i), and where it listens."""
    if args.threads and args.engine != "native":
        raise ValueError("--threads needs the native engine (the Python model is one thread)")
    if args.threads and args.interfaces:
        raise ValueError("--threads applies to the UDP data plane; the raw one is one thread")
    if args.delays and not args.interfaces:
        raise ValueError("--delay needs the raw data plane (-i PORT@IFACE)")
    ports = parse_port_map(args.interfaces) if args.interfaces else None
    host, port = args.udp or host_port(DEFAULT_UDP)
    dataplane: DataPlane
    if args.engine == "native":
        native = NativePipeline()
        dataplane = (NativeRawDataPlane(native, ports, dict(args.delays)) if ports
                     else NativeUdpDataPlane(native, host, port, args.threads))
        pipeline: Pipeline = native
    else:
        pipeline = Pipeline()
        dataplane = (RawDataPlane(pipeline, ports, dict(args.delays)) if ports
                     else UdpDataPlane(pipeline, host, port))
    if ports:
        return pipeline, dataplane, " ".join(f"{p}@{i}" for p, i in sorted(ports.items()))
    threads = f", {dataplane.threads} threads" if isinstance(dataplane, NativeUdpDataPlane) else ""
    return pipeline, dataplane, "UDP {}:{} ({} engine{})".format(
        *dataplane.address, args.engine, threads)


def _credentials(args: argparse.Namespace) -> grpc.ServerCredentials | None:
    if args.writers and args.ca_cert_file is None:
        raise ValueError("--writer names client certificates: give --ca-cert-file too, so "
                         "that clients present one (mutual TLS)")
    if args.server_cert_file is None and args.server_key_file is None:
        if args.ca_cert_file is not None:
            raise ValueError("--ca-cert-file checks clients over TLS: give the server's "
                             "--server-cert-file and --server-key-file too")
        return None
    if args.server_cert_file is None or args.server_key_file is None:
        raise ValueError("TLS needs both --server-cert-file and --server-key-file")
    return server_credentials(args.server_cert_file, args.server_key_file, args.ca_cert_file)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.setup(args.log_format, args.log_level)
    try:
        p4info = load_p4info(args.p4info) if args.p4info else None
        credentials = _credentials(args)
        pipeline, dataplane, where = _data_plane(args)
    except (OSError, ValueError) as err:
        _fail(_reason(err))
    on_write, endpoint = None, None
    if args.metrics_addr:
        from hysync.softswitch import exporter  # prometheus_client: only when asked for

        registry, writes = exporter.registry_for(pipeline, dataplane)
        on_write = writes.observe
        try:
            endpoint = exporter.serve_metrics(registry, "{}:{}".format(*args.metrics_addr))
        except OSError as err:
            dataplane.stop()
            _fail(str(err))
    host, port = args.grpc_addr
    grpc_addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        _check_free(host, port, grpc_addr)
        server, bound = serve(pipeline, grpc_addr, args.device_id, p4info=p4info,
                              credentials=credentials, on_write=on_write,
                              writers=frozenset(args.writers) if args.writers else None)
    except ConfigError as err:
        dataplane.stop()
        _fail(f"--p4info {args.p4info} does not describe the softswitch's program: {err}")
    except OSError as err:
        dataplane.stop()
        _fail(_reason(err))

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    dataplane.start()
    config = f"P4Info {args.p4info}" if p4info else "no pipeline config yet"
    security = ("mutual TLS" if args.ca_cert_file else "TLS") if credentials else "no TLS"
    if args.writers:
        security += ", writes from " + ", ".join(sorted(args.writers))
    metrics_at = f", metrics on http://{endpoint.address}/metrics" if endpoint else ""
    print(f"softswitch: P4Runtime on {host}:{bound} ({security}, device {args.device_id}, "
          f"{config}), data plane {where}{metrics_at}", flush=True)
    while not stop.wait(0.5):
        pass
    logging.getLogger("softswitch").info("stopping")
    server.stop(grace=1).wait()
    dataplane.stop()
    if endpoint is not None:
        endpoint.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
