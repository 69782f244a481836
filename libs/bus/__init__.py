"""NATS + JetStream adapters: typed publish/subscribe, KV with revision checks, leases,
dead letters, trace-context headers, and the service runtime shell."""

from libs.bus.connection import Bus, Consumer
from libs.bus.errors import BusError, BusUnavailable, CasConflict, KeyExists, PayloadTooLarge
from libs.bus.kv import Entry, KvWatch, TypedKV
from libs.bus.lease import Lease, LeaseRecord
from libs.bus.nodeargs import add_node_spec_arg, node_specs_from_args, parse_node_specs
from libs.bus.runtime import (
    ServiceConfig,
    ServiceContext,
    common_arg_parser,
    run_service,
    serve,
)

__all__ = [
    "Bus",
    "BusError",
    "BusUnavailable",
    "CasConflict",
    "Consumer",
    "Entry",
    "KeyExists",
    "KvWatch",
    "Lease",
    "LeaseRecord",
    "PayloadTooLarge",
    "ServiceConfig",
    "ServiceContext",
    "TypedKV",
    "add_node_spec_arg",
    "common_arg_parser",
    "node_specs_from_args",
    "parse_node_specs",
    "run_service",
    "serve",
]
