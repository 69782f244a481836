"""``python -m services.gateway``: the HTTP front door (see ``docs/runtime-contract.md``)."""

from libs.bus.runtime import common_arg_parser, run_service
from services.gateway.httpserver import add_http_args
from services.gateway.service import SERVICE, main

if __name__ == "__main__":
    run_service(SERVICE, main, parser=add_http_args(common_arg_parser(SERVICE)))
